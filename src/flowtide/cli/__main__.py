"""`python -m flowtide.cli`."""

from flowtide.cli.root import main

main()

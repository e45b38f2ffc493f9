"""`python -m flowtide` is the `flowtide` command."""

from flowtide.cli import main

main()

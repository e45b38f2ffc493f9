"""Who python child processes run as in tests: the default (`nobody` when the tests run
as root), or root where `nobody` cannot run this interpreter (one installed under
/root) — which flowtide never chooses on its own, so the tests choose it out loud."""

from __future__ import annotations

from flowtide.tools.python_pool import default_user_works

PYTHON_USER: str | None = None if default_user_works() else "root"

"""`python -m flowtide.settings catalog|table`: regenerate catalog.py, print the table."""

from __future__ import annotations

import sys

from flowtide.settings.render import CATALOG_PATH, catalog_text, table_text

if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "table"
    if what == "catalog":
        CATALOG_PATH.write_text(catalog_text(), encoding="utf-8")
    else:
        sys.stdout.write(table_text())

"""The DSL reference's key tables are the loader's schema (they cannot drift)."""

from __future__ import annotations

from conftest import REPO
from flowtide.playbook import reference
from flowtide.playbook.loader.schema import KIND_FIELDS, LEVELS

PAGE = REPO / "docs" / "dsl" / "reference.md"


def test_the_page_holds_the_generated_tables() -> None:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(reference.BEGIN) + len(reference.BEGIN) + 1
    end = text.index(reference.END)
    assert text[start:end] == reference.tables(), (
        "python -m flowtide.playbook.reference --write docs/dsl/reference.md"
    )


def test_every_key_and_kind_field_is_listed() -> None:
    text = reference.tables()
    for name, table in LEVELS.items():
        assert f"### {name}\n" in text
        for key in table:
            assert f"| `{key}` |" in text, (name, key)
    kinds = text[text.index("### fields of each built-in tool kind") :]
    for kind, fields in KIND_FIELDS.items():
        line = next(row for row in kinds.splitlines() if row.startswith(f"| `{kind}` |"))
        assert all(f"`{field}`" in line for field in fields), kind

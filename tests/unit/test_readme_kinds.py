"""The table of tool kinds (docs/tools/index.md): every built-in kind has a row, and every row's example
task is a valid task (the loader accepts it as written)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from flowtide.playbook import parse_playbook
from flowtide.tools.builtin import SPECS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tools" / "index.md"


def _rows() -> dict[str, str]:
    text = PAGE.read_text()
    table = text.split("## Tool kinds, one example each", 1)[1].split("\n\n", 2)[1]
    rows: dict[str, str] = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        kind, example = cells[0].strip("`"), cells[2].strip("`").replace("\\|", "|")
        rows[kind] = example
    return rows


def test_every_built_in_kind_has_a_row() -> None:
    assert set(_rows()) == {spec.kind for spec in SPECS}


def test_every_example_is_a_valid_task() -> None:
    steps = []
    for kind, example in _rows().items():
        task = yaml.safe_load(example)
        assert task["kind"] == kind
        steps.append({"step": f"use_{kind}", "tool": task})
    steps[0]["step"] = "start"
    document = {
        "apiVersion": "noetl.io/v2",
        "kind": "Playbook",
        "metadata": {"name": "readme", "path": "readme"},
        "workload": {"api": "http://127.0.0.1:1", "folder": "x", "items": []},
        "workbook": [{"name": "is_hot", "tool": {"kind": "noop"}}],
        "workflow": steps,
    }
    parse_playbook(yaml.safe_dump(document, sort_keys=False), "docs/tools/index.md")

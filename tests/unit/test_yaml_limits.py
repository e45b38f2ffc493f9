"""Untrusted YAML is bounded: text size, nesting, and what aliases expand to
(flowtide.playbook.source)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flowtide.errors import PlaybookError
from flowtide.playbook import load_playbook, parse_playbook
from flowtide.playbook.source import (
    MAX_ALIAS_NODES,
    MAX_NESTING,
    MAX_PLAYBOOK_BYTES,
    load_yaml,
)

TAIL = "workflow:\n  - step: start\n    tool: {kind: noop}\n"


def billion_laughs(levels: int = 9, width: int = 9) -> str:
    """The classic: each level lists the previous one `width` times (width**levels)."""
    lines = ["a: &a [" + ", ".join(['"lol"'] * width) + "]"]
    for level in range(1, levels):
        name, prev = chr(ord("a") + level), chr(ord("a") + level - 1)
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_fails_fast_with_the_alias_position() -> None:
    text = "workload:\n" + "".join(f"  {line}\n" for line in billion_laughs().splitlines())
    started = time.monotonic()
    with pytest.raises(PlaybookError, match="too many aliases") as info:
        parse_playbook(text + TAIL, "bomb.yaml")
    assert time.monotonic() - started < 0.5
    err = info.value
    # 9 * 10**(n-1) nodes per level n: the alias that crosses 100,000 is on level 6.
    assert (err.file, err.line) == ("bomb.yaml", 7)
    assert err.column is not None and str(err).startswith("bomb.yaml:7:")

    # The same limit lets ordinary anchors and merge keys through.
    pb = parse_playbook(
        """\
workload:
  defaults: &defaults {retries: 3, timeout: 10}
  api: &api https://example.test
workflow:
  - step: start
    tool: &http
      kind: http
      url: *api
      headers: {<<: *defaults, accept: json}
    next: [{step: again}]
  - step: again
    tool: *http
""",
        "anchors.yaml",
    )
    assert pb.steps["again"].tasks[0].config["url"] == "https://example.test"
    assert pb.steps["start"].tasks[0].config["headers"] == {
        "accept": "json",
        "retries": 3,
        "timeout": 10,
    }
    # One anchor of 99 nodes used 1,000 times: 99,000 nodes of expansion.
    text = "a: &a [" + ", ".join(["1"] * 98) + "]\nb: [" + ", ".join(["*a"] * 1000) + "]\n"
    data, _ = load_yaml(text)
    assert len(data["b"]) == 1000 and data["b"][999] == [1] * 98
    assert 99 * 1000 <= MAX_ALIAS_NODES


def test_aliases_of_a_big_string_count_by_characters() -> None:
    big = "x" * 1_000_000
    text = f"a: &a {big}\nb: [" + ", ".join(["*a"] * 20) + "]\n"
    with pytest.raises(PlaybookError, match="too many aliases: they expand to more than"):
        load_yaml(text, "s.yaml")


@pytest.mark.parametrize(
    "text",
    ["a: &a [1, *a]\n", "a: &a {k: [*a]}\n", "a: &a {<<: *a}\n"],
)
def test_an_alias_inside_its_own_anchor_is_refused(text: str) -> None:
    with pytest.raises(PlaybookError, match="used inside the node it names") as info:
        load_yaml(text, "cycle.yaml")
    assert info.value.line == 1


def test_aliases_cannot_nest_past_the_nesting_limit() -> None:
    # Each level is 40 deep and holds the previous one: 40, 80, 120 levels.
    lines = []
    for level in range(3):
        inner = f"*l{level - 1}" if level else "1"
        lines.append(f"l{level}: &l{level} " + "[" * 40 + inner + "]" * 40)
    with pytest.raises(PlaybookError, match=f"deeper than {MAX_NESTING} levels") as info:
        load_yaml("\n".join(lines) + "\n", "deep.yaml")
    assert info.value.line == 3


def test_a_redefined_anchor_is_not_an_error() -> None:
    data, _ = load_yaml("b: &a 1\nc: &a 2\nd: *a\n")
    assert data == {"b": 1, "c": 2, "d": 2}


def test_text_over_the_size_limit_is_refused_before_parsing() -> None:
    text = "workload:\n  x: '" + "x" * MAX_PLAYBOOK_BYTES + "'\n" + TAIL
    started = time.monotonic()
    with pytest.raises(PlaybookError, match="more than the limit of 10,485,760 bytes") as info:
        parse_playbook(text, "huge.yaml")
    assert time.monotonic() - started < 0.5
    assert info.value.file == "huge.yaml"


def test_multibyte_text_is_measured_in_bytes() -> None:
    # 3 bytes per character: under the limit in characters, over it in bytes.
    text = "a: '" + "€" * (MAX_PLAYBOOK_BYTES // 3 + 10) + "'\n"
    with pytest.raises(PlaybookError, match="bytes"):
        load_yaml(text, "utf8.yaml")


def test_a_file_over_the_size_limit_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text("a: '" + "x" * MAX_PLAYBOOK_BYTES + "'\n", encoding="utf-8")
    with pytest.raises(PlaybookError, match="bytes") as info:
        load_playbook(path)
    assert info.value.file == str(path)


@pytest.mark.parametrize(
    "text",
    [
        "x: !!float abc\n",
        "x: !!int abc\n",
        "x: !!int 0x\n",
        "x: !!bool abc\n",
        "x: !!timestamp 2024-13-45\n",
    ],
)
def test_values_ruamel_cannot_build_are_playbook_errors_with_their_position(text: str) -> None:
    with pytest.raises(PlaybookError, match="cannot read the value tagged") as info:
        load_yaml("a: 1\n" + text, "odd.yaml")
    assert (info.value.file, info.value.line, info.value.column) == ("odd.yaml", 2, 4)

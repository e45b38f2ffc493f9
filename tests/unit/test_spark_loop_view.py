"""A spark loop's result without `results` (over `results_max`): what a template that
reads `.results` is told, and that the rest of the result reads as before."""

from __future__ import annotations

from typing import Any

import pytest

from flowtide.engine.state import context_from_parts
from flowtide.errors import TemplateError
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.template import render

PLAYBOOK = """
workflow:
  - step: score
    loop: {in: [1, 2], iterator: x, spec: {mode: spark, results_max: 5}}
    tool: {kind: python, input: {x: "{{ x }}"}, code: "result = x"}
    next: [plain]
  - step: plain
    tool: {kind: python, code: "result = {'a': 1}"}
"""


def _context(row_count: int) -> dict[str, Any]:
    playbook = parse_playbook(PLAYBOOK, "p.yaml")
    score = {
        "uri": "file:///tmp/x/score",
        "format": "parquet",
        "row_count": row_count,
        "stats": {"total": row_count, "success": row_count, "failed": 0},
    }
    parts = {
        "workload": {},
        "ctx": {},
        "results": {"score": {"result": score}, "plain": {"result": {"a": 1}}},
    }
    return context_from_parts(playbook, 7, parts)


def test_reading_results_over_results_max_says_how_to_read_the_rows() -> None:
    with pytest.raises(TemplateError) as caught:
        render("{{ score.results }}", _context(12), step="next", field="input.r")
    message = str(caught.value)
    assert "step 'score' is a spark loop whose result holds no 'results'" in message
    assert "its 12 items are more than its loop.spec.results_max (5" in message
    assert '`inputs: {r: "{{ score }}"}`' in message and "flowtide data" in message


def test_a_result_too_large_for_results_says_so() -> None:
    with pytest.raises(TemplateError) as caught:
        render("{{ score['results'] }}", _context(3))
    assert "larger than half of FLOWTIDE_MAX_RESULT_BYTES" in str(caught.value)


def test_the_rest_of_the_result_reads_as_before() -> None:
    context = _context(12)
    assert render("{{ score.results | default('by reference') }}", context) == "by reference"
    assert render("{{ score.results is defined }}", context) is False
    assert render("{{ score.stats.total }}", context) == 12
    assert render("{{ score.row_count }}", context) == 12
    # Other steps' missing keys keep Jinja's message.
    with pytest.raises(TemplateError) as caught:
        render("{{ plain.results }}", context)
    assert "has no attribute 'results'" in str(caught.value)
    assert "spark loop" not in str(caught.value)

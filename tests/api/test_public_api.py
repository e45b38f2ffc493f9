"""The public API is what `flowtide` exports; importing it stays light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import flowtide

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_every_exported_name_resolves() -> None:
    for name in flowtide.__all__:
        assert getattr(flowtide, name) is not None, name
    assert set(dir(flowtide)) == set(flowtide.__all__)


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        _ = flowtide.no_such_thing  # type: ignore[attr-defined]


def test_import_does_not_load_heavy_modules() -> None:
    code = (
        "import sys, flowtide, flowtide.cli\n"
        "heavy = [m for m in ('duckdb', 'httpx', 'psycopg', 'pyspark', 'jinja2', 'rich') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_run_from_python(tmp_path: Path) -> None:
    doc = flowtide.run(
        EXAMPLES / "quickstart.yaml", workload={"orders_per_region": 5}, home=tmp_path / "home"
    )
    assert doc["status"] == "completed", doc["error"]
    assert doc["result"]["orders"] == 20
    assert doc["steps"]["report"]["runs"] == 1
    assert doc["steps"]["price_orders"]["result"]["stats"] == {
        "total": 20,
        "success": 20,
        "failed": 0,
    }


def test_run_rejects_an_invalid_playbook(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("workflow:\n  - step: start\n    tool: {kind: nope}\n", encoding="utf-8")
    with pytest.raises(flowtide.PlaybookError) as info:
        flowtide.run(bad, home=tmp_path / "home")
    assert "bad.yaml:3" in str(info.value)


def test_all_lists_exactly_the_lazy_exports() -> None:
    from flowtide import _EXPORTS  # type: ignore[attr-defined]

    assert set(flowtide.__all__) == {*_EXPORTS, "__version__"}

"""What a spark loop's items print reaches the step's log (`flowtide logs ID STEP`): the
first lines of each partition, each with its item's index, at most 200 for the loop, a
line counting what was left out, the execution's secrets masked (real local Spark)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from jsonstub import JsonHandler

from .conftest import Runner, flowtide_cli

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

TOKEN = "tok-sparkprint-5c2e1b-never-print-me"


class _Ok(JsonHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self.reply({"ok": True})


@pytest.fixture
def stub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/ok"
    finally:
        server.shutdown()
        server.server_close()


def test_items_prints_reach_the_steps_log_bounded_and_masked(
    run_playbook: Runner, stub: str
) -> None:
    # 300 items in 12 partitions of 25: each prints "hello N", the first of a partition
    # the execution's secret too (its first step sent it), the second a line to stderr.
    result = run_playbook(
        """\
        workload: {url: "", tok: ""}
        workflow:
          - step: start
            tool: {kind: http, url: "{{ workload.url }}", auth: {type: bearer, token: "{{ workload.tok }}"}}
            next: [square]
          - step: square
            loop: {in: "{{ range(300) | list }}", iterator: x, spec: {mode: spark, partitions: 12}}
            tool:
              kind: python
              input: {x: "{{ iter.x }}", tok: "{{ workload.tok }}"}
              code: |
                import sys
                print("hello", x)
                if x % 25 == 0:
                    print("token: Bearer", tok)
                if x % 25 == 1:
                    sys.stderr.write(f"err {x}\\n")
                result = x * x
        """,
        workload={"url": stub, "tok": TOKEN},
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    assert result.step("square")["result"]["stats"]["success"] == 300
    logs = flowtide_cli("logs", result.doc["execution_id"], "square", home=result.home)
    assert logs.returncode == 0, logs.stderr
    text = logs.stdout
    assert TOKEN not in text
    shown = re.findall(r"^\[spark\] item (\d+): (.*)$", text, re.M)
    # Each partition keeps its first 20 lines (240), the loop shows 200 of them.
    assert len(shown) == 200, text
    for index, line in shown:
        n = int(index)
        assert line in (f"hello {n}", f"err {n}", "token: Bearer ***"), (index, line)
        assert line != "token: Bearer ***" or n % 25 == 0
        assert n % 25 < 18  # a partition's first 20 lines are its first 18 items'
    # Whole partitions but the last one shown: their secret lines, masked, are there.
    assert sum(line == "token: Bearer ***" for _, line in shown) >= 10
    assert sum(line.startswith("err ") for _, line in shown) >= 10
    # 300 + 12 + 12 lines were printed: the rest is counted.
    assert "[spark] items printed 124 more lines, not shown" in text, text
    # Told before the loop's last line.
    assert text.index("items printed 124") < text.index("[spark] items: 300 ok")


def test_a_loop_whose_items_print_nothing_logs_no_item_line(run_playbook: Runner) -> None:
    result = run_playbook(
        """\
        workflow:
          - step: quiet
            loop: {in: "{{ range(200) | list }}", iterator: x, spec: {mode: spark, partitions: 2}}
            tool: {kind: python, input: {x: "{{ iter.x }}"}, code: "result = x"}
        """
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    call = next(e for e in result.events if e["type"] == "call.done" and e["step"] == "quiet")
    log = call["payload"]["stdout"]
    assert "[spark] items: 200 ok, 0 failed of 200" in log, log
    assert not re.search(r"^\[spark\] item \d+:", log, re.M), log
    assert "printed" not in log, log

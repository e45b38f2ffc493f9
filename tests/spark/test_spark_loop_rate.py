"""`loop.spec.rate` of a spark loop: item starts paced across the job, seen by a real
HTTP server on loopback (arrival times), on the local Spark the spark tests share."""

from __future__ import annotations

import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from flowtide.errors import PlaybookError
from flowtide.playbook.loader import parse_playbook
from flowtide.spark.pace import burst_for
from jsonstub import JsonHandler

from .conftest import HEADER, Runner

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

RATE = 100
ITEMS = 300
IN_FLIGHT = 4


class _Stamp(JsonHandler):
    """Answers `{"n": N}` at once, noting when each request arrived (keep-alive; no
    Nagle delay between the headers and the body written apart)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    lock = threading.Lock()
    arrivals: list[tuple[float, int]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        at = time.monotonic()
        n = int(self.path.rsplit("/", 1)[-1])
        with self.lock:
            self.arrivals.append((at, n))
        self.reply({"n": n})


def _slots() -> int:
    """The task slots of the local session this process holds (the run made it)."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    assert context is not None
    return int(context.defaultParallelism)


def test_a_rate_holds_the_job_wide_item_starts(run_playbook: Runner) -> None:
    _Stamp.arrivals = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stamp)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = run_playbook(
            f"""\
            workload: {{rate: {RATE}}}
            workflow:
              - step: fetch
                loop:
                  in: "{{{{ range({ITEMS}) | list }}}}"
                  iterator: n
                  spec: {{mode: spark, max_in_flight: {IN_FLIGHT}, rate: "{{{{ workload.rate }}}}"}}
                tool:
                  kind: http
                  url: "http://127.0.0.1:{server.server_port}/n/{{{{ iter.n }}}}"
            """
        )
    finally:
        server.shutdown()
        server.server_close()
    assert result.doc["status"] == "completed", result.doc["error"]
    fetched = result.step("fetch")["result"]
    assert fetched["stats"] == {"total": ITEMS, "success": ITEMS, "failed": 0}
    arrivals = sorted(_Stamp.arrivals)
    assert sorted(n for _, n in arrivals) == list(range(ITEMS))

    # One wave: a partition per task slot (Spark's range split: partition i holds the
    # items from i * ITEMS // parts), each at its share of the rate.
    parts = min(_slots(), ITEMS)
    share = RATE / parts
    starts = [i * ITEMS // parts for i in range(parts)]
    part_of = {n: max(i for i, s in enumerate(starts) if s <= n) for n in range(ITEMS)}
    first = [min(t for t, n in arrivals if part_of[n] == i) for i in range(parts)]
    last = [max(t for t, n in arrivals if part_of[n] == i) for i in range(parts)]
    # The steady part, every partition running: the job-wide rate within 8 %.
    lo, hi = max(first), min(last)
    assert hi - lo > 1.0, f"partitions ran {hi - lo:.2f} s together: too short to measure"
    steady = sum(1 for t, _ in arrivals if lo <= t <= hi)
    assert steady / (hi - lo) == pytest.approx(RATE, rel=0.08)
    # Never over the rate by more than the catch-up each partition may make, in any
    # second, and 100 ms of arrival jitter (the starts are paced, the requests reach the
    # server a little later each; without pacing the items arrive in under a second).
    bound = RATE * 1.1 + parts * (burst_for(share, IN_FLIGHT) + 1)
    times = [t for t, _ in arrivals]
    busiest = max(sum(1 for u in times[k:] if u < t + 1.0) for k, t in enumerate(times))
    assert busiest <= bound, f"{busiest} requests in one second, rate {RATE}"


def test_the_loader_says_where_a_rate_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(PlaybookError) as err:
        parse_playbook(
            HEADER
            + """\
workflow:
  - step: s
    loop: {in: [1], iterator: x, spec: {mode: spark, rate: 0}}
    tool: {kind: python, code: "result = 1"}
  - step: t
    loop: {in: [1], iterator: x, spec: {mode: parallel, rate: 5}}
    tool: {kind: noop}
  - step: u
    loop: {in: [1], iterator: x, spec: {mode: spark, rate: fast}}
    tool: {kind: python, code: "result = 1"}
""",
            str(tmp_path / "pb.yaml"),
        )
    text = str(err.value)
    assert "pb.yaml:6" in text and "loop 'spec.rate' must be a number > 0" in text
    assert "got 0" in text and "got 'fast'" in text
    assert "pb.yaml:9" in text
    assert "loop 'spec.rate' applies to 'mode: spark' only (the mode is 'parallel')" in text

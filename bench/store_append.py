"""Throughput of SQLiteStore.append: 100,000 events in batches of 64 into a temp file.

Not a test (no assertions). Events are built before the clock starts so the figure is the
store's: JSON encoding, executemany and one commit per batch (group commit).

    .venv/bin/python bench/store_append.py [--events N] [--batch B] [--executions E]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from flowtide.engine.events import Event
from flowtide.ids import Snowflake
from flowtide.store.sqlite import SQLiteStore

# The shape of one loop iteration's events (DESIGN.md: ~8 per iteration).
_ITERATION = (
    ("command.issued", None),
    ("command.claimed", None),
    ("command.started", None),
    ("step.enter", "running"),
    ("call.done", "ok"),
    ("step.exit", "ok"),
    ("loop.item", "ok"),
    ("command.completed", "ok"),
)


def build_events(count: int, executions: int) -> list[Event]:
    ids = Snowflake("bench")
    execution_ids = [ids.next_id() for _ in range(executions)]
    events = []
    for n in range(count):
        type_, status = _ITERATION[n % len(_ITERATION)]
        index = n // len(_ITERATION)
        events.append(
            Event(
                event_id=ids.next_id(),
                execution_id=execution_ids[index % executions],
                type=type_,
                step="fetch_item",
                status=status,
                payload={"loop_index": index, "item": {"id": index, "name": f"item-{index}"}},
                command_id=1_000_000 + index,
                worker_id="worker-1",
                time=1_700_000_000.0 + n / 1000,
            )
        )
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--executions", type=int, default=4)
    args = parser.parse_args()

    events = build_events(args.events, args.executions)
    batches = [events[i : i + args.batch] for i in range(0, len(events), args.batch)]
    with tempfile.TemporaryDirectory(prefix="flowtide-bench-") as tmp:
        with SQLiteStore(Path(tmp) / "bench.db") as store:
            start = time.perf_counter()
            for batch in batches:
                store.append(batch)
            elapsed = time.perf_counter() - start
            stored = sum(store.count_events(e) for e in {ev.execution_id for ev in events})
    print(
        f"appended {stored:,} events in {len(batches):,} batches of {args.batch} "
        f"in {elapsed:.2f}s: {stored / elapsed:,.0f} events/s"
    )


if __name__ == "__main__":
    main()

"""The example subscription source, installed: flowtide finds `source: lines` through its
`flowtide.sources` entry point, and each line is one delivery whose key is the same
every time the file is read (so a line starts one run however often it is read)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from flowtide.triggers.sources import factory, known_sources, refresh
from flowtide.triggers.subscription import SubscriptionSpec


def test_each_line_is_one_delivery_with_a_stable_key(tmp_path: Path) -> None:
    refresh()
    assert "lines" in known_sources()
    path = tmp_path / "in.txt"
    path.write_text("a\nb\nc\n")
    spec = SubscriptionSpec(name="l", playbook="p", source="lines", config={"path": str(path)})

    async def read(limit: int) -> list[tuple[str, str]]:
        source = factory("lines")(spec, lambda alias: {})
        await source.open()
        try:
            first = await source.fetch(limit, 0.1)
            with path.open("a") as f:
                f.write("d\n")
            more = await source.fetch(limit, 0.5)
            return [(d.key, d.message["data"]) for d in first + more]
        finally:
            await source.close()

    assert asyncio.run(read(2)) == [(f"{path}:{n}", text) for n, text in enumerate("abcd", 1)]
    # Read again from the top: the same keys.
    again = asyncio.run(read(10))
    assert [k for k, _ in again][:4] == [f"{path}:{n}" for n in range(1, 5)]

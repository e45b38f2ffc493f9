"""`shard_for`: pinned vectors, computed with the xxhsum command line (xxHash 0.8.1,
`xxhsum -H1` of the id's 8 bytes written with struct.pack('<q', id)), not with flowtide:
the shard an id maps to must never change, and must match NoETL's function."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from flowtide.sharding import shard_for

# id -> (xxh64 of its 8 little-endian bytes, {n: shard})
VECTORS = {
    1: (0x9F29CB17A2A49995, {2: 1, 3: 1, 4: 1, 16: 5, 1024: 405}),
    42: (0xB556806FB6D14353, {2: 1, 3: 0, 4: 3, 16: 3, 1024: 851}),
    -1: (0x85D136ADB773C6C9, {2: 1, 3: 0, 4: 1, 16: 9, 1024: 713}),
    2**63 - 1: (0xFF70CC60366E770C, {2: 0, 3: 2, 4: 0, 16: 12, 1024: 780}),
    -(2**63): (0x3F425EACF01544E0, {2: 0, 3: 0, 4: 0, 16: 0, 1024: 224}),
    0: (0x34C96ACDCADB1BBB, {2: 1, 3: 2, 4: 3, 16: 11, 1024: 955}),
    # Real snowflakes of flowtide runs.
    384047186877669376: (0x9CD4B889808C841A, {2: 0, 3: 2, 4: 2, 16: 10, 1024: 26}),
    384047203254538240: (0x3B6DF30DB6829902, {2: 0, 3: 0, 4: 2, 16: 2, 1024: 258}),
    382535812144115712: (0xF43DCB5502B45A85, {2: 1, 3: 2, 4: 1, 16: 5, 1024: 645}),
}


@pytest.mark.parametrize("execution_id", sorted(VECTORS))
def test_pinned_vectors(execution_id: int) -> None:
    digest, shards = VECTORS[execution_id]
    for n, shard in shards.items():
        assert digest % n == shard  # the vector is self-consistent
        assert shard_for(execution_id, n) == shard, (execution_id, n)


@pytest.mark.parametrize("n", [0, 1, -3])
def test_one_shard_or_none_is_shard_zero(n: int) -> None:
    assert shard_for(384047186877669376, n) == 0


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1, "42", 1.0, True])
def test_ids_outside_int64_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        shard_for(bad, 4)  # type: ignore[arg-type]


def test_consecutive_snowflakes_spread_evenly() -> None:
    # One machine's ids of one millisecond differ only in the low 12 bits: the hash
    # spreads them over 4 shards within a few percent.
    base = 384047186877669376
    counts = Counter(shard_for(base + seq, 4) for seq in range(4096))
    assert set(counts) == {0, 1, 2, 3}
    assert max(counts.values()) - min(counts.values()) < 4096 * 0.08


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "flowtide.cli", "shards", "for", *args],
        capture_output=True,
        text=True,
        env={**{k: v for k, v in os.environ.items() if k != "FLOWTIDE_SHARDS"}, **(env or {})},
        timeout=60,
    )


def test_cli_prints_the_shard() -> None:
    proc = _cli("384047186877669376", "--shards", "1024")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "26"
    proc = _cli("42", "--shards", "4", "--json")
    assert json.loads(proc.stdout) == {"execution_id": "42", "shards": 4, "shard": 3}
    # N from FLOWTIDE_SHARDS (three DSNs).
    proc = _cli("1", env={"FLOWTIDE_SHARDS": "postgresql://a;postgresql://b;postgresql://c"})
    assert proc.stdout.strip() == "1"


def test_cli_says_what_is_wrong() -> None:
    proc = _cli("42")
    assert proc.returncode == 2 and "--shards N" in proc.stderr
    proc = _cli("abc", "--shards", "2")
    assert proc.returncode == 2 and "'abc' is not an integer id" in proc.stderr
    proc = _cli(str(2**64), "--shards", "2")
    assert proc.returncode == 2 and "signed 64-bit" in proc.stderr

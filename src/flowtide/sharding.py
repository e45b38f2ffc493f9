"""Which shard owns an execution (seed 001, DESIGN.md "Sharding").

`shard_for(execution_id, n)` is xxHash64, seed 0, of the id written as an 8-byte
little-endian signed integer, modulo `n` (the unsigned 64-bit hash; `n <= 1` gives 0):
the same function as NoETL's server (their R2), so gateways, tools and every flowtide
server agree on where an execution lives. It hashes the whole snowflake rather than
taking the id modulo n: the low 12 bits (the sequence) and the high bits (the clock)
move together across producers, and a plain modulo would pile executions on a few
shards.

The function is pinned by test vectors computed with the `xxhsum` command line, not with
this module (`tests/unit/test_sharding.py`): changing it would move every execution.
"""

from __future__ import annotations

import xxhash

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def shard_for(execution_id: int, n: int) -> int:
    """The index (0..n-1) of the shard that owns `execution_id` among `n` shards.

    Raises:
        ValueError: `execution_id` is not a signed 64-bit integer.
    """
    if isinstance(execution_id, bool) or not isinstance(execution_id, int):
        raise ValueError(f"an execution id is an integer, not {type(execution_id).__name__}")
    if not INT64_MIN <= execution_id <= INT64_MAX:
        raise ValueError(f"execution id {execution_id} is outside the signed 64-bit range")
    if n <= 1:
        return 0
    digest = xxhash.xxh64_intdigest(execution_id.to_bytes(8, "little", signed=True), seed=0)
    return int(digest % n)

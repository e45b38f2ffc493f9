"""Numbers a worker reports (counts, rates, durations), taken as JSON gives them: any
value at all (`true`, `"5"`, NaN, 10**400). Each is read as the number it must be, or
as nothing, and never raises (the engine's `apply` and the documents built from the log
use them)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["reported_count", "reported_duration", "reported_rate"]

#: A count or rate a worker reports, at most (more is no count of items).
_MAX_COUNT = 2**53
_MAX_RATE = 1e12
#: A tool call's reported duration (ms), at most (a week; the sum of many stays finite).
_MAX_CALL_MS = 7 * 86_400_000


def reported_count(value: Any) -> int:
    """A reported count: a whole number from 0 to `_MAX_COUNT` (anything else is 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    return int(min(max(value, 0), _MAX_COUNT))


def reported_duration(value: Any) -> float | None:
    """A reported call duration (ms): a number from 0, at most `_MAX_CALL_MS` (None for
    anything else: a negative, NaN, infinity, a boolean, not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        return None
    if isinstance(value, float) and math.isinf(value):
        return None
    return float(min(value, _MAX_CALL_MS))


def reported_rate(value: Any) -> float:
    """A reported rate (items/s): finite, from 0 to `_MAX_RATE` (anything else is 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    if isinstance(value, float) and not math.isfinite(value):
        return 0.0
    return float(min(max(value, 0.0), _MAX_RATE))

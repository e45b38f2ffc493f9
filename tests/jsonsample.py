"""One row of values that every tool can make, and the JSON each must give for it
(README, "Results as JSON"). The cross-tool tests (tests/tools/test_results_json.py,
tests/spark/test_spark_results_json.py) have each tool produce it its own way."""

from __future__ import annotations

from typing import Any

UID = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"

#: The JSON of the row, whichever tool made it. Types matter too (600, not 600.0):
#: compare with `canonical`.
EXPECTED: dict[str, Any] = {
    "whole": 600,
    "price": 12.5,
    "nan": None,
    "inf": None,
    "raw": "AP8=",
    "text_bytes": "YWI=",
    "at": "2024-05-06T07:08:09+00:00",
    "naive": "2024-05-06T07:08:09",
    "day": "2024-05-06",
    "clock": "07:08:09",
    "clock_tz": "07:08:09+02:00",
    "span": 90.0,
    "uid": UID,
    "list": [1, 2],
    "obj": {"k": "v"},
    "nothing": None,
    "flag": True,
    "n": 42,
    "s": "text",
}

#: Python code returning the row from plain Python values.
PYTHON_CODE = f"""\
import datetime as dt
import uuid
from decimal import Decimal

result = [{{
    "whole": Decimal("600"),
    "price": Decimal("12.50"),
    "nan": float("nan"),
    "inf": float("inf"),
    "raw": b"\\x00\\xff",
    "text_bytes": b"ab",
    "at": dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.timezone.utc),
    "naive": dt.datetime(2024, 5, 6, 7, 8, 9),
    "day": dt.date(2024, 5, 6),
    "clock": dt.time(7, 8, 9),
    "clock_tz": dt.time(7, 8, 9, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    "span": dt.timedelta(seconds=90),
    "uid": uuid.UUID("{UID}"),
    "list": (1, 2),
    "obj": {{"k": "v"}},
    "nothing": None,
    "flag": True,
    "n": 42,
    "s": "text",
}}]
"""

#: Python code returning the row from numpy and pandas values, where they have one.
PANDAS_CODE = f"""\
import datetime as dt
import uuid

import numpy as np
import pandas as pd

frame = pd.DataFrame({{
    "whole": [np.int64(600)],
    "price": [np.float64(12.5)],
    "nan": [np.nan],
    "inf": [np.inf],
    "raw": [b"\\x00\\xff"],
    "text_bytes": [np.bytes_(b"ab")],
    "at": [pd.Timestamp("2024-05-06 07:08:09", tz="UTC")],
    "naive": [pd.Timestamp("2024-05-06 07:08:09")],
    "day": [dt.date(2024, 5, 6)],
    "clock": [dt.time(7, 8, 9)],
    "clock_tz": [dt.time(7, 8, 9, tzinfo=dt.timezone(dt.timedelta(hours=2)))],
    "span": [pd.Timedelta(seconds=90)],
    "uid": [uuid.UUID("{UID}")],
    "list": [np.array([1, 2])],
    "obj": [{{"k": "v"}}],
    "nothing": [None],
    "flag": [np.bool_(True)],
    "n": [np.int32(42)],
    "s": [np.str_("text")],
}})
result = frame
"""


def canonical(value: Any) -> str:
    """JSON text that tells 600 from 600.0 and ignores key order."""
    import json

    return json.dumps(value, sort_keys=True, allow_nan=False)

"""The one JSON conversion of tool results (flowtide.jsonvalues): every rule of the table
in its docstring and in the README ("Results as JSON"), one row each."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import enum
import ipaddress
import json
import subprocess
import sys
import uuid
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pydantic
import pytest
from psycopg.types.multirange import Multirange
from psycopg.types.range import Range

from flowtide.errors import ToolError
from flowtide.jsonvalues import MAX_DEPTH, dumps, loads, records, to_json

UTC = dt.UTC
PLUS2 = dt.timezone(dt.timedelta(hours=2))


class Color(enum.Enum):
    RED = "red"
    NAVY = (0, 0, 128)


class Level(enum.IntEnum):
    HIGH = 3


@dataclasses.dataclass
class Point:
    x: Decimal
    at: dt.date


class Order(pydantic.BaseModel):
    id: int
    amount: Decimal
    placed: dt.datetime


CASES: list[tuple[str, Any, Any]] = [
    # plain JSON stays as it is
    ("str", "héllo", "héllo"),
    ("int", 42, 42),
    ("big int", 10**30, 10**30),
    ("float", 2.5, 2.5),
    ("bool", True, True),
    ("none", None, None),
    # floats JSON cannot hold
    ("nan", float("nan"), None),
    ("infinity", float("inf"), None),
    ("-infinity", float("-inf"), None),
    # Decimal: the scale decides
    ("decimal integral", Decimal("600"), 600),
    ("decimal exponent", Decimal("6E+2"), 600),
    ("decimal negative", Decimal("-17"), -17),
    (
        "decimal huge integral",
        Decimal("123456789012345678901234567890"),
        123456789012345678901234567890,
    ),
    ("decimal fraction", Decimal("12.50"), 12.5),
    ("decimal scale, integral value", Decimal("600.00"), 600.0),
    ("decimal rounded to a double", Decimal("0.12345678901234567890123"), 0.12345678901234568),
    ("decimal nan", Decimal("NaN"), None),
    ("decimal infinity", Decimal("-Infinity"), None),
    ("decimal beyond a double", Decimal("1E-400"), 0.0),
    # dates and times: ISO 8601, an offset only when the value has one
    ("datetime naive", dt.datetime(2024, 5, 6, 7, 8, 9), "2024-05-06T07:08:09"),
    ("datetime utc", dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC), "2024-05-06T07:08:09+00:00"),
    (
        "datetime offset, microseconds",
        dt.datetime(2024, 5, 6, 7, 8, 9, 500, tzinfo=PLUS2),
        "2024-05-06T07:08:09.000500+02:00",
    ),
    ("date", dt.date(2024, 5, 6), "2024-05-06"),
    ("time", dt.time(7, 8, 9), "07:08:09"),
    ("time with offset", dt.time(7, 8, 9, tzinfo=PLUS2), "07:08:09+02:00"),
    ("timedelta", dt.timedelta(minutes=1, milliseconds=500), 60.5),
    ("negative timedelta", dt.timedelta(days=-1), -86400.0),
    # bytes: base64, always
    ("bytes", b"\x00\xff", "AP8="),
    ("bytes that are text", b"abc", "YWJj"),
    ("bytearray", bytearray(b"ab"), "YWI="),
    ("memoryview", memoryview(b"ab"), "YWI="),
    ("empty bytes", b"", ""),
    # text forms
    (
        "uuid",
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "12345678-1234-5678-1234-567812345678",
    ),
    ("ipv4", ipaddress.ip_address("10.0.0.1"), "10.0.0.1"),
    ("ipv6 network", ipaddress.ip_network("2001:db8::/32"), "2001:db8::/32"),
    ("ip interface", ipaddress.ip_interface("10.0.0.1/24"), "10.0.0.1/24"),
    ("enum", Color.RED, "red"),
    ("enum of a tuple", Color.NAVY, [0, 0, 128]),
    ("int enum", Level.HIGH, 3),
    # containers
    ("tuple", (1, (2, 3)), [1, [2, 3]]),
    ("deque", collections.deque([1, 2]), [1, 2]),
    ("set", {3, 1, 2}, [1, 2, 3]),
    ("frozenset of mixed types", frozenset({1, "a"}), ["a", 1]),  # by JSON text
    ("ordered dict", collections.OrderedDict(b=1, a=2), {"b": 1, "a": 2}),
    ("defaultdict", collections.defaultdict(list, {"k": [1]}), {"k": [1]}),
    (
        "keys that are not text",
        {1: "a", None: "b", False: "c", 2.5: "d", Decimal("7"): "e", dt.date(2024, 1, 2): "f"},
        {"1": "a", "null": "b", "false": "c", "2.5": "d", "7": "e", "2024-01-02": "f"},
    ),
    ("uuid key", {uuid.UUID(int=1): 1}, {"00000000-0000-0000-0000-000000000001": 1}),
    ("dataclass", Point(Decimal("1.5"), dt.date(2024, 1, 2)), {"x": 1.5, "at": "2024-01-02"}),
    (
        "pydantic model",
        Order(id=1, amount=Decimal("600"), placed=dt.datetime(2024, 1, 2, tzinfo=UTC)),
        {"id": 1, "amount": 600, "placed": "2024-01-02T00:00:00+00:00"},
    ),
    (
        "nested",
        {"rows": [{"d": Decimal("2.5"), "b": b"\x01", "t": (dt.date(2024, 1, 2),)}]},
        {"rows": [{"d": 2.5, "b": "AQ==", "t": ["2024-01-02"]}]},
    ),
    # numpy
    ("numpy int", np.int64(7), 7),
    ("numpy float", np.float32(1.5), 1.5),
    ("numpy nan", np.float64("nan"), None),
    ("numpy bool", np.bool_(True), True),
    ("numpy str", np.str_("x"), "x"),
    ("numpy bytes", np.bytes_(b"ab"), "YWI="),
    ("numpy array", np.array([[1.5, np.nan], [np.inf, 2.0]]), [[1.5, None], [None, 2.0]]),
    ("numpy int array", np.arange(3), [0, 1, 2]),
    ("numpy datetime64 day", np.datetime64("2024-05-06"), "2024-05-06"),
    (
        "numpy datetime64 us",
        np.datetime64("2024-05-06T07:08:09.5", "us"),
        "2024-05-06T07:08:09.500000",
    ),
    (
        "numpy datetime64 ns",
        np.datetime64("2024-05-06T07:08:09.000000001", "ns"),
        "2024-05-06T07:08:09.000000001",
    ),
    (
        "numpy datetime64 whole seconds in ns",
        np.datetime64("2024-05-06T07:08:09", "ns"),
        "2024-05-06T07:08:09",
    ),
    ("numpy NaT", np.datetime64("NaT"), None),
    ("numpy timedelta64 s", np.timedelta64(90, "s"), 90.0),
    ("numpy timedelta64 ns", np.timedelta64(1500, "ns"), 1.5e-06),
    ("numpy timedelta NaT", np.timedelta64("NaT"), None),
    (
        "numpy datetime array",
        np.array(["2024-05-06", "NaT"], dtype="datetime64[D]"),
        ["2024-05-06", None],
    ),
    # pandas
    ("pandas timestamp", pd.Timestamp("2024-05-06 07:08:09"), "2024-05-06T07:08:09"),
    (
        "pandas timestamp, tz and nanoseconds",
        pd.Timestamp("2024-05-06 07:08:09.000000001", tz="UTC"),
        "2024-05-06T07:08:09.000000001+00:00",
    ),
    ("pandas NaT", pd.NaT, None),
    ("pandas NA", pd.NA, None),
    ("pandas timedelta", pd.Timedelta(seconds=90), 90.0),
    ("pandas series", pd.Series([1.5, None]), [1.5, None]),
    ("pandas nullable ints", pd.array([1, None], dtype="Int64"), [1, None]),
    ("pandas index", pd.Index(["a", "b"]), ["a", "b"]),
    (
        "pandas dataframe",
        pd.DataFrame({"n": [1, 2], "t": [pd.Timestamp("2024-05-06"), pd.NaT], "x": [0.5, np.nan]}),
        [{"n": 1, "t": "2024-05-06T00:00:00", "x": 0.5}, {"n": 2, "t": None, "x": None}],
    ),
    # psycopg ranges
    (
        "range",
        Range(dt.date(2024, 1, 1), dt.date(2024, 2, 1)),
        {"lower": "2024-01-01", "upper": "2024-02-01", "bounds": "[)", "empty": False},
    ),
    (
        "unbounded range",
        Range(None, 10, "(]"),
        {"lower": None, "upper": 10, "bounds": "(]", "empty": False},
    ),
    (
        "empty range",
        Range(empty=True),
        {"lower": None, "upper": None, "bounds": None, "empty": True},
    ),
    (
        "multirange",
        Multirange([Range(1, 3)]),
        [{"lower": 1, "upper": 3, "bounds": "[)", "empty": False}],
    ),
]


@pytest.mark.parametrize(("value", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rule(value: Any, expected: Any) -> None:
    converted = to_json(value)
    assert converted == expected
    assert type(converted) is type(expected)  # 600, not 600.0; 600.0, not 600
    # The output is strict JSON, and converting it again changes nothing.
    assert json.loads(dumps(converted)) == expected
    assert to_json(converted) == expected


def test_plain_json_comes_back_equal_and_detached() -> None:
    value = {"a": [1, 2.5, "x", None, True, {"b": []}]}
    converted = to_json(value)
    assert converted == value
    converted["a"].append(3)
    assert value == {"a": [1, 2.5, "x", None, True, {"b": []}]}


class Thing:
    pass


def _error(value: Any, **kwargs: Any) -> ToolError:
    with pytest.raises(ToolError) as info:
        to_json(value, **kwargs)
    assert info.value.code == "ResultNotSerializable"
    return info.value


def test_unknown_type_names_the_type_and_the_path() -> None:
    err = _error({"rows": [1, {"when": Thing()}]})
    assert err.data == {"path": "result['rows'][1]['when']", "type": f"{__name__}.Thing"}
    assert "result['rows'][1]['when'] has type" in err.message
    assert "Thing" in err.message
    assert err.kind == "result_error"


def test_error_root_and_kind_are_the_callers() -> None:
    err = _error([object()], root="result['command_0']['rows']", kind="sql_error")
    assert err.data == {"path": "result['command_0']['rows'][0]", "type": "object"}
    assert err.kind == "sql_error"


@pytest.mark.parametrize(
    ("value", "path", "words"),
    [
        ({"a": {(1, 2): "x"}}, "result['a'][(1, 2)]", "key of type tuple"),
        ({1: "a", "1": "b"}, "result", "both become the JSON key '1'"),
        ([1, 10**5000], "result[1]", "more than 4300 digits"),
        (Decimal("1E+5000"), "result", "more than 4300 digits"),
        ([complex(1, 2)], "result[0]", "has type complex"),
        ({"f": lambda: 1}, "result['f']", "has type function"),
        ({"gen": (i for i in range(3))}, "result['gen']", "has type generator"),
        (np.timedelta64(1, "M"), "result", "no length"),
    ],
)
def test_what_has_no_json_form(value: Any, path: str, words: str) -> None:
    err = _error(value)
    assert err.data["path"] == path
    assert words in err.message


def test_depth_is_bounded_and_a_cycle_is_an_error() -> None:
    deep: Any = "leaf"
    for _ in range(MAX_DEPTH):
        deep = [deep]
    assert to_json(deep) is not None  # MAX_DEPTH levels are fine
    cycle: list[Any] = []
    cycle.append(cycle)
    err = _error(cycle)
    assert "levels deep" in err.message
    assert "levels..." in err.data["path"]  # the middle of a long path is elided
    assert len(err.data["path"]) < 200


def test_records_name_row_and_column() -> None:
    rows = [(1, Decimal("2.5")), (2, Thing())]
    with pytest.raises(ToolError) as info:
        records(["id", "price"], rows, root="result['rows']", kind="sql_error")
    assert info.value.data["path"] == "result['rows'][1]['price']"
    assert info.value.kind == "sql_error"
    assert records(["id", "price"], rows[:1]) == [{"id": 1, "price": 2.5}]


def test_loads_reads_non_finite_numbers_as_null() -> None:
    assert loads('{"a": NaN, "b": [Infinity, -Infinity], "c": 1.5}') == {
        "a": None,
        "b": [None, None],
        "c": 1.5,
    }
    with pytest.raises(ValueError):
        loads("{not json")


def test_dumps_refuses_what_is_not_json() -> None:
    with pytest.raises(ValueError):
        dumps(float("nan"))
    with pytest.raises(TypeError):
        dumps(Decimal("1"))


def test_conversion_imports_no_optional_library() -> None:
    """numpy, pandas, pydantic, psycopg and pyspark are recognised only when loaded."""
    code = (
        "import sys, decimal, datetime\n"
        "from flowtide.jsonvalues import to_json\n"
        "to_json({'d': decimal.Decimal('1.5'), 't': datetime.date(2024, 1, 1), 'b': b'x'})\n"
        "try:\n"
        "    to_json(object())\n"
        "except Exception:\n"
        "    pass\n"
        "heavy = {'numpy', 'pandas', 'pydantic', 'psycopg', 'pyspark'} & set(sys.modules)\n"
        "print(sorted(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def test_the_pipeline_converts_what_a_tool_left() -> None:
    """Every tool's result passes the pipeline, which applies the same rules to any value
    a tool did not convert itself (and checks the size of the JSON)."""
    from flowtide.runtime.pipeline import _json_result

    plain = {"a": [1, 2.5]}
    assert _json_result(plain) == (plain, '{"a":[1,2.5]}')
    assert _json_result(plain)[0] is plain  # already JSON: not copied
    converted = _json_result({"d": Decimal("600"), "x": float("nan")})
    assert converted == ({"d": 600, "x": None}, '{"d":600,"x":null}')
    assert _json_result(None) == (None, None)
    with pytest.raises(ToolError) as info:
        _json_result({"t": Thing()})
    assert info.value.data["path"] == "result['t']"

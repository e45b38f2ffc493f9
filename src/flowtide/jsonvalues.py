"""One JSON conversion for every tool's results: a step's result has the same shape
whichever tool made it (python in this process or in a child, postgres, duckdb, spark
previews, http bodies), because they all go through `to_json` (README, "Results as
JSON").

| Python value                               | JSON                                        |
|--------------------------------------------|---------------------------------------------|
| str, bool, None, int                       | itself                                      |
| float                                      | itself; NaN, Infinity, -Infinity -> null    |
| Decimal                                    | scale 0 (600, 6E+2) -> integer; a fraction  |
|                                            | (12.50, 1.5) -> float; NaN, Infinity -> null|
| datetime, date, time                       | ISO 8601 text; an offset only when it has   |
|                                            | one (a naive value stays naive)             |
| timedelta                                  | seconds, a float                            |
| bytes, bytearray, memoryview               | base64 text (standard alphabet, padded)     |
| UUID, IP addresses and networks            | their text                                  |
| Enum                                       | its value, converted                        |
| dict / Mapping                             | object; keys below                          |
| list, tuple, deque                         | array                                       |
| set, frozenset                             | array, sorted                               |
| dataclass instance, pydantic model         | object of its fields                        |
| numpy scalar / array                       | the Python value / array; NaN -> null;      |
|                                            | datetime64, timedelta64 as datetime,        |
|                                            | timedelta; NaT -> null                      |
| pandas Timestamp, Timedelta, NaT, NA       | as datetime, timedelta; NaT, NA -> null     |
| pandas DataFrame / Series, Index           | array of row objects / array of values      |
| psycopg Range / Multirange                 | {lower, upper, bounds, empty} / array       |
| anything else                              | error naming the type and the field path    |

Object keys: a str stays; any other key is converted by the same rules and must give a
string, number, boolean or null, written as `json.dumps` writes such keys (1 -> "1",
None -> "null", True -> "true"). Two keys that become the same text are an error.

Why these rules (the evidence):

* Decimal. NoETL's Python tools turned every Decimal into a float (600 -> 600.0); its
  Rust tools return numeric as exact text ("600", "12.50"). A string breaks templates
  (`{{ row.total > 100 }}` compares text with a number) and python code (`range(n)`);
  600.0 breaks `range(n)` and renders as "600.0" in a URL or SQL. So a NUMERIC of scale 0
  (counts, SUM over integers) is an integer, exact at any size, and a NUMERIC with
  fractional digits is the nearest float: exact up to 15 significant digits, rounded
  beyond (17 digits and more: cast to text in SQL, `amount::text`, to keep them). The
  type follows the column's scale, not the value, so one column never mixes int and
  float because of what a row holds.
* NaN and infinities. JSON has neither; Python's `json` writes the invalid tokens `NaN`
  and `Infinity`, which PostgreSQL's jsonb and most parsers refuse. NoETL's Rust tools
  (serde_json), JavaScript's JSON.stringify and pandas' `to_json` all write null, and
  pandas uses NaN/NaT for "missing", which is what null means.
* bytes. NoETL's Rust postgres and duckdb tools return bytea/BLOB as standard base64; a
  "UTF-8 when it decodes" rule would make the reader guess which form it got ("YWI=" is
  valid UTF-8 too). Code that wants text returns `data.decode()`.
* Dates and times keep their offset, and a naive timestamp gets none (NoETL's Rust tools
  do the same: stamping a naive value "+00:00" would invent a zone).
* Unknown types are an error naming the type and the path (`result['rows'][3]`), never a
  silent `str()`: a repr such as "<Thing object at 0x7f...>" in a result is a bug found
  later, in another step.

numpy, pandas, pydantic, psycopg and pyspark are recognised only when the process has
already imported them (`sys.modules`): converting a result never imports them.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime as dt
import decimal
import enum
import ipaddress
import json
import math
import sys
import uuid
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from flowtide.errors import ToolError

__all__ = ["MAX_DEPTH", "dumps", "loads", "nested_deeper", "records", "to_json"]

MAX_DEPTH = 256
"""Deepest nesting a result may have (a cycle ends here too)."""


def nested_deeper(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether parsed JSON `value` nests lists and objects more than `limit` deep (walked
    without recursion: what a sender parsed may be too deep for recursive code later)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


# Python refuses to print integers longer than this (`sys.get_int_max_str_digits`), so
# json.dumps would fail on them later, far from the step that made them.
_INT_DIGITS = 4300
_INT_BOUND = 10**_INT_DIGITS

_DUMPS = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode

_IP_TYPES = (
    ipaddress.IPv4Address,
    ipaddress.IPv6Address,
    ipaddress.IPv4Network,
    ipaddress.IPv6Network,
    ipaddress.IPv4Interface,
    ipaddress.IPv6Interface,
)


class _Unconvertible(Exception):
    """Raised inside the walk; `path` collects the keys and indexes on the way out."""

    def __init__(self, value: Any, problem: str | None = None) -> None:
        super().__init__()
        self.value = value
        self.problem = problem
        self.path: list[str] = []


def to_json(value: Any, *, root: str = "result", kind: str = "result_error") -> Any:
    """`value` as plain JSON data (dict, list, str, int, float, bool, None) by the rules in
    this module's docstring. Plain JSON data comes back equal (a copy of containers), so
    converting twice changes nothing.

    Args:
        value: what a tool produced.
        root: how the error names the value's top (`result`, `result['rows']`).
        kind: the ToolError kind of a failure (the calling tool's, e.g. "python_error").
    Returns:
        Data that `dumps` encodes without help.
    Raises:
        ToolError: code "ResultNotSerializable", `data = {path, type}`: a value of a type
            with no JSON form, a non-scalar object key, two keys with the same text, an
            integer of more than 4300 digits, or nesting deeper than MAX_DEPTH.
    """
    try:
        return _convert(value, 0)
    except _Unconvertible as exc:
        raise _error(exc, root, kind) from None


def records(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    root: str = "result",
    kind: str = "result_error",
) -> list[dict[str, Any]]:
    """Rows of a SQL result as JSON objects keyed by column name, each value converted
    like `to_json` does (`root` names the list in errors: `root[2]['price']`).

    Raises:
        ToolError: as `to_json`.
    """
    out: list[dict[str, Any]] = []
    names = list(columns)
    for index, row in enumerate(rows):
        record: dict[str, Any] = {}
        for name, item in zip(names, row, strict=True):
            try:
                record[name] = _convert(item, 2)
            except _Unconvertible as exc:
                exc.path.append(_key_text(name))
                exc.path.append(f"[{index}]")
                raise _error(exc, root, kind) from None
        out.append(record)
    return out


def loads(text: str | bytes) -> Any:
    """JSON text as data, with the tokens NaN, Infinity and -Infinity (which some servers
    send and Python's parser accepts) read as null, the rule for non-finite numbers.

    Raises:
        ValueError: not JSON.
    """
    return json.loads(text, parse_constant=_non_finite)


def dumps(value: Any) -> str:
    """Compact JSON text of data that `to_json` made (or plain JSON data).

    Raises:
        TypeError, ValueError: a value that is not plain JSON data (a NaN, a Decimal...).
    """
    return _DUMPS(value)


def _non_finite(_token: str) -> None:
    return None


def _error(exc: _Unconvertible, root: str, kind: str) -> ToolError:
    value_type = type(exc.value)
    type_name = value_type.__qualname__
    if value_type.__module__ not in ("builtins", None):
        type_name = f"{value_type.__module__}.{type_name}"
    segments = exc.path[::-1]
    if len(segments) > 16:  # a cycle or a deep structure: the two ends say enough
        hidden = len(segments) - 12
        segments = [*segments[:6], f"...{hidden} levels...", *segments[-6:]]
    where = root + "".join(segments)
    problem = exc.problem or (
        f"has type {type_name}, which has no JSON form: convert it to a dict, list, "
        "string, number, boolean or None (README: Results as JSON)"
    )
    return ToolError(
        f"ResultNotSerializable: {where} {problem}",
        kind=kind,
        code="ResultNotSerializable",
        data={"path": where, "type": type_name},
    )


def _key_text(key: Any) -> str:
    try:
        text = repr(key)
    except Exception:  # a user __repr__ that raises must not hide the real error
        text = f"<{type(key).__name__}>"
    if len(text) > 80:
        text = text[:77] + "..."
    return f"[{text}]"


def _convert(value: Any, depth: int) -> Any:
    kind = type(value)
    # The common leaves first, by exact type: no isinstance chain on the hot path.
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if -_INT_BOUND < value < _INT_BOUND:
            return value
        raise _Unconvertible(value, f"is an integer of more than {_INT_DIGITS} digits")
    if kind is float:
        return value if value - value == 0.0 else None  # inf - inf and nan - nan are nan
    if depth > MAX_DEPTH:
        raise _Unconvertible(value, f"is nested more than {MAX_DEPTH} levels deep (a cycle?)")
    if kind is dict:
        return _object(value, depth)
    if kind is list or kind is tuple:
        return _array(value, depth)
    return _other(value, depth)


def _object(value: Mapping[Any, Any], depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        try:
            text = key if type(key) is str else _object_key(key, depth)
            out[text] = _convert(item, depth + 1)
        except _Unconvertible as exc:
            exc.path.append(_key_text(key))
            raise
    if len(out) != len(value):
        _duplicate_key(value)
    return out


def _object_key(key: Any, depth: int) -> str:
    try:
        converted = _convert(key, depth + 1)
    except _Unconvertible:
        converted = _MISSING
    if isinstance(converted, str):
        return converted
    if converted is None or isinstance(converted, bool | int | float):
        return _DUMPS(converted)  # 1 -> "1", None -> "null", True -> "true", 1.5 -> "1.5"
    type_name = type(key).__qualname__
    raise _Unconvertible(key, f"is a key of type {type_name}: object keys must be text")


_MISSING = object()


def _duplicate_key(value: Mapping[Any, Any]) -> None:
    seen: dict[str, Any] = {}
    for key in value:
        text = key if type(key) is str else _object_key(key, 0)
        if text in seen:
            raise _Unconvertible(
                key,
                f"has keys {seen[text]!r} and {key!r}, which both become the JSON key {text!r}",
            )
        seen[text] = key


def _array(value: Iterable[Any], depth: int) -> list[Any]:
    items = []
    for index, item in enumerate(value):
        try:
            items.append(_convert(item, depth + 1))
        except _Unconvertible as exc:
            exc.path.append(f"[{index}]")
            raise
    return items


def _other(value: Any, depth: int) -> Any:
    """Everything but the exact builtin leaves and containers."""
    if isinstance(value, int):  # IntEnum and other int subclasses
        return _convert(int(value), depth)
    if isinstance(value, float):  # numpy.float64 is one
        return _convert(float(value), depth)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, decimal.Decimal):
        return _decimal(value)
    if isinstance(value, dt.date | dt.time):  # datetime is a date
        return _moment(value)
    if isinstance(value, dt.timedelta):
        return _seconds(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Mapping):
        return _object(value, depth)
    if isinstance(value, list | tuple | collections.deque):
        return _array(value, depth)
    if isinstance(value, AbstractSet):
        members = _array(value, depth)
        try:
            return sorted(members)
        except TypeError:  # mixed types: any stable order will do
            return sorted(members, key=lambda m: json.dumps(m, sort_keys=True))
    if isinstance(value, enum.Enum):
        return _convert(value.value, depth + 1)
    if isinstance(value, _IP_TYPES):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return _object(fields, depth)
    return _foreign(value, depth)


def _decimal(value: decimal.Decimal) -> int | float | None:
    if not value.is_finite():
        return None
    exponent = value.as_tuple().exponent
    if isinstance(exponent, int) and exponent >= 0:
        if value.adjusted() >= _INT_DIGITS:
            raise _Unconvertible(value, f"is an integer of more than {_INT_DIGITS} digits")
        return int(value)
    result = float(value)
    return result if math.isfinite(result) else None


def _moment(value: dt.date | dt.time) -> str | None:
    if isinstance(value, dt.datetime):
        pandas = sys.modules.get("pandas")
        if pandas is not None and value is pandas.NaT:  # NaT claims to be a datetime
            return None
    return value.isoformat()


def _seconds(value: dt.timedelta) -> float:
    return value.total_seconds()


def _foreign(value: Any, depth: int) -> Any:
    """Types of libraries the process has loaded: numpy, pandas, pydantic, psycopg, pyspark."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        if isinstance(value, numpy.ndarray):
            if value.dtype.kind in "mMOV":
                return _array(value, depth)  # element by element: numpy scalars below
            return _convert(value.tolist(), depth)
        if isinstance(value, numpy.datetime64):
            return _datetime64(numpy, value)
        if isinstance(value, numpy.timedelta64):
            return _timedelta64(numpy, value)
        if isinstance(value, numpy.generic):
            return _convert(value.item(), depth)
    pandas = sys.modules.get("pandas")
    if pandas is not None:
        if value is pandas.NA or value is pandas.NaT:
            return None
        if isinstance(value, pandas.DataFrame):
            return _array(value.to_dict(orient="records"), depth)
        if isinstance(value, pandas.Series | pandas.Index):
            return _array(value.tolist(), depth)
        extension = getattr(pandas.api.extensions, "ExtensionArray", None)
        if extension is not None and isinstance(value, extension):
            return _array(value.tolist(), depth)
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
        return _object(value.model_dump(), depth)
    ranges = sys.modules.get("psycopg.types.range")
    if ranges is not None and isinstance(value, ranges.Range):
        bounds = {"lower": value.lower, "upper": value.upper}
        return {
            **_object(bounds, depth),
            "bounds": None if value.isempty else value.bounds,
            "empty": bool(value.isempty),
        }
    multiranges = sys.modules.get("psycopg.types.multirange")
    if multiranges is not None and isinstance(value, multiranges.Multirange):
        return _array(value, depth)
    spark_types = sys.modules.get("pyspark.sql.types")
    variant = getattr(spark_types, "VariantVal", None) if spark_types else None
    if variant is not None and isinstance(value, variant):
        return _convert(value.toPython(), depth + 1)
    raise _Unconvertible(value)


def _datetime64(numpy: Any, value: Any) -> str | None:
    if numpy.isnat(value):
        return None
    item = value.item()
    if not isinstance(item, int):  # units down to microseconds give a date or datetime
        return _moment(item)
    # Finer units: numpy gives a count since 1970. Shown to the nanosecond, as pandas'
    # Timestamp.isoformat shows it.
    nanos = int(value.astype("datetime64[ns]").astype("int64"))
    seconds, fraction = divmod(nanos, 10**9)
    moment = dt.datetime(1970, 1, 1) + dt.timedelta(seconds=seconds)
    text = moment.isoformat()
    return f"{text}.{fraction:09d}" if fraction else text


def _timedelta64(numpy: Any, value: Any) -> float | None:
    if numpy.isnat(value):
        return None
    item = value.item()
    if isinstance(item, dt.timedelta):  # units down to microseconds
        return _seconds(item)
    unit = numpy.datetime_data(value.dtype)[0]
    if unit in ("Y", "M"):  # a month has no fixed length in seconds
        raise _Unconvertible(value, f"is a numpy timedelta64 in {unit!r} units (no length)")
    return int(value.astype("timedelta64[ns]").astype("int64")) / 1e9

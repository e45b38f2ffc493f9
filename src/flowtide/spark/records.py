"""Inline records (what earlier steps return: lists of JSON objects) as a DataFrame.

Spark's own inference refuses a column that holds both 1 and 2.5 (`CANNOT_MERGE_TYPE`),
which JSON from an HTTP API or a Python step does all the time. flowtide infers the
schema over every record with JSON's widening rules instead:

- int and float -> double; null goes with anything; a column that is always null is a
  string column;
- objects -> structs (fields in first-seen order, missing fields are null); arrays ->
  arrays of the merged element type;
- any other conflict (text and number, object and list) -> string, with non-text values
  written as JSON text, so nothing is dropped.

Records that are not objects become one column named `value`. An explicit `schema` (a
DDL string such as "id BIGINT, amount DOUBLE") skips inference.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flowtide.errors import ToolError

__all__ = ["infer_type", "records_frame"]

# Inferred types are small tuples, independent of pyspark until the DataFrame is built:
#   ("null",) ("boolean",) ("long",) ("double",) ("string",)
#   ("array", element) ("struct", ((name, type), ...))
_Type = tuple[Any, ...]
_NULL: _Type = ("null",)
_STRING: _Type = ("string",)
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


def infer_type(value: Any) -> _Type:
    """The flowtide type of one JSON value."""
    if value is None:
        return _NULL
    if isinstance(value, bool):
        return ("boolean",)
    if isinstance(value, int):
        return ("long",) if _LONG_MIN <= value <= _LONG_MAX else ("double",)
    if isinstance(value, float):
        return ("double",)
    if isinstance(value, str):
        return _STRING
    if isinstance(value, Mapping):
        return ("struct", tuple((str(k), infer_type(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        element = _NULL
        for item in value:
            element = _merge(element, infer_type(item))
        return ("array", element)
    return _STRING


def _merge(a: _Type, b: _Type) -> _Type:
    if a == b:
        return a
    if a == _NULL:
        return b
    if b == _NULL:
        return a
    if {a[0], b[0]} == {"long", "double"}:
        return ("double",)
    if a[0] == b[0] == "array":
        return ("array", _merge(a[1], b[1]))
    if a[0] == b[0] == "struct":
        fields = dict(a[1])
        order = [name for name, _ in a[1]]
        for name, kind in b[1]:
            if name in fields:
                fields[name] = _merge(fields[name], kind)
            else:
                fields[name] = kind
                order.append(name)
        return ("struct", tuple((name, fields[name]) for name in order))
    return _STRING


def _final(kind: _Type) -> _Type:
    """Null columns (never seen a value) become strings: Spark cannot store NullType in
    most formats."""
    if kind == _NULL:
        return _STRING
    if kind[0] == "array":
        return ("array", _final(kind[1]))
    if kind[0] == "struct":
        return ("struct", tuple((n, _final(t)) for n, t in kind[1]))
    return kind


def _spark_type(kind: _Type) -> Any:
    from pyspark.sql import types as T

    simple = {
        "boolean": T.BooleanType,
        "long": T.LongType,
        "double": T.DoubleType,
        "string": T.StringType,
    }
    if kind[0] in simple:
        return simple[kind[0]]()
    if kind[0] == "array":
        return T.ArrayType(_spark_type(kind[1]), containsNull=True)
    return T.StructType([T.StructField(n, _spark_type(t), nullable=True) for n, t in kind[1]])


def _coerce(value: Any, kind: _Type) -> Any:
    """`value` shaped for a column of type `kind`."""
    if value is None:
        return None
    name = kind[0]
    if name == "string":
        return value if isinstance(value, str) else json.dumps(value, default=str)
    if name == "double":
        return float(value)
    if name == "array":
        return [_coerce(v, kind[1]) for v in value]
    if name == "struct":
        return tuple(_coerce(value.get(n), t) for n, t in kind[1])
    return value


def records_frame(session: Any, records: list[Any], *, name: str, schema: Any = None) -> Any:
    """A DataFrame of `records` (see the module docstring).

    Raises:
        ToolError: kind "config_error" for an empty list without `schema`, or a schema
            Spark cannot parse.
    """
    if schema:
        try:
            if records and all(isinstance(r, Mapping) for r in records):
                return session.createDataFrame([dict(r) for r in records], schema=str(schema))
            return session.createDataFrame(list(records), schema=str(schema))
        except Exception as exc:
            raise ToolError(
                f"input '{name}': records do not fit schema {schema!r}: "
                f"{str(exc).splitlines()[0][:500]}",
                kind="config_error",
            ) from None
    if not records:
        raise ToolError(
            f"input '{name}' is an empty list: Spark cannot infer columns from no rows; "
            f"give `{name}: {{records: ..., schema: 'col TYPE, ...'}}`",
            kind="config_error",
        )
    if all(isinstance(r, Mapping) for r in records):
        row_type: _Type = ("struct", ())
        for record in records:
            row_type = _merge(row_type, infer_type(record))
        row_type = _final(row_type)
        rows = [_coerce(r, row_type) for r in records]
    else:
        value_type = _NULL
        for record in records:
            value_type = _merge(value_type, infer_type(record))
        row_type = ("struct", (("value", _final(value_type)),))
        rows = [(_coerce(r, row_type[1][0][1]),) for r in records]
    return session.createDataFrame(rows, schema=_spark_type(row_type))

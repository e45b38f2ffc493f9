"""The types of the API's request fields: what a client may send, said the same way to the
validator and to the OpenAPI document.

Request bodies are read strictly (`RequestBody`): JSON `false` is not the integer 0 and
`1` is not `true`, so a client that mixes them up gets a 422 naming the field instead of
a worker registered with pid 0. The one leniency is ids: the API writes them as strings
(snowflake ids exceed 2**53, past what a JSON number read as a double keeps exactly), so
a client may send back either the string or the integer, and the document says so.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final

from fastapi import Path, Query
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "INTEGRAL",
    "Id",
    "Int",
    "IdPath",
    "IdQuery",
    "PositiveId",
    "RequestBody",
    "Text",
    "id_pattern",
    "storable_text",
]

#: Ids are PostgreSQL bigints.
INT64_MAX: Final = 2**63 - 1
#: PostgreSQL `integer` columns a request writes (a catalog version, worker.pid).
INT32_MAX: Final = 2**31 - 1
#: Every integer up to this is exact as a double (what `3.0` in JSON is parsed into).
_EXACT: Final = 2**53


def storable_text(text: str) -> str:
    """`text`, if a PostgreSQL text column can hold it.

    Raises:
        ValueError: it holds a NUL or a lone surrogate (refused as bad input: the
            database would refuse it as a 5xx).
    """
    if "\x00" in text:
        raise ValueError("must not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
    return text


#: A text parameter that reaches the database.
Text = Annotated[str, AfterValidator(storable_text)]


class RequestBody(BaseModel):
    """The base of every request body: unknown fields, type coercions and NaN refused,
    and text the database cannot store (any text field may reach one)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, value: Any, info: ValidationInfo) -> Any:
        # A field of any JSON value is stored as JSON, where a NUL is written escaped.
        if isinstance(value, str) and cls.model_fields[info.field_name or ""].annotation is not Any:
            storable_text(value)
        return value


def _integral(value: Any) -> Any:
    # JSON has one kind of number: `3.0` is the integer 3 (JSON Schema agrees), a float
    # past 2**53 may not be the integer its sender wrote, and a boolean is never one.
    if isinstance(value, float) and value.is_integer() and abs(value) <= _EXACT:
        return int(value)
    return value


INTEGRAL: Final = BeforeValidator(_integral)
#: An integer of a request body: JSON `3` or `3.0`; not `true`, not `"3"`. Bounds go in a
#: `Field` of the field; in a union (`Int | None`) pydantic would write them into the
#: document as the unknown keywords `ge`/`le`, so there write
#: `Annotated[int, Field(ge=..., le=...), INTEGRAL] | None`.
Int = Annotated[int, INTEGRAL]


def id_pattern(minimum: int, maximum: int = INT64_MAX) -> str:
    """A regular expression (ECMA 262 and Python alike) of the decimal numbers from
    `minimum` (0 or 1) to `maximum`, without leading zeros: the ids a string may hold."""
    if minimum not in (0, 1):
        raise ValueError("an id pattern starts at 0 or 1")
    digits = str(maximum)
    n = len(digits)
    parts = ["0"] if minimum == 0 else []
    if n > 1:
        parts.append(f"[1-9][0-9]{{0,{n - 2}}}" if n > 2 else "[1-9]")
    # Numbers as long as `maximum`: equal to it up to position i, smaller at i.
    for i, d in enumerate(digits):
        low = 1 if i == 0 else 0
        high = int(d) - 1
        if high >= low:
            rest = n - i - 1
            tail = f"[0-9]{{{rest}}}" if rest else ""
            span = str(low) if high == low else f"[{low}-{high}]"
            parts.append(f"{digits[:i]}{span}{tail}")
    parts.append(digits)
    return "^(?:" + "|".join(parts) + ")$"


def _id_reader(minimum: int) -> Any:
    pattern = re.compile(id_pattern(minimum))

    def read(value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("an id is an integer or a string of digits, not a boolean")
        if isinstance(value, str):
            if not pattern.fullmatch(value):
                raise ValueError(
                    f"an id is an integer from {minimum} to {INT64_MAX} (or its digits)"
                )
            return int(value)
        return _integral(value)

    return read


def _id_schema(minimum: int) -> dict[str, Any]:
    return {
        "anyOf": [
            {"type": "integer", "format": "int64", "minimum": minimum, "maximum": INT64_MAX},
            {"type": "string", "pattern": id_pattern(minimum)},
        ]
    }


#: An id in a request body: an int64 >= 0, or the string of its digits.
Id = Annotated[
    int,
    BeforeValidator(_id_reader(0)),
    Field(ge=0, le=INT64_MAX),
    WithJsonSchema(_id_schema(0)),
]
#: An id that 0 cannot be (a row's key).
PositiveId = Annotated[
    int,
    BeforeValidator(_id_reader(1)),
    Field(ge=1, le=INT64_MAX),
    WithJsonSchema(_id_schema(1)),
]
#: An id in the path or the query (where everything is a string anyway).
IdPath = Annotated[int, Path(ge=0, le=INT64_MAX)]
IdQuery = Annotated[int | None, Query(ge=0, le=INT64_MAX)]

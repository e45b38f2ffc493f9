"""Schema inference for inline records: JSON's widening rules, not Spark's refusals."""

from __future__ import annotations

from flowtide.spark.records import _final, _merge, infer_type


def row_type(*records: object) -> tuple[object, ...]:
    kind: tuple[object, ...] = ("struct", ())
    for record in records:
        kind = _merge(kind, infer_type(record))
    return _final(kind)


def test_int_and_float_widen_to_double() -> None:
    assert row_type({"a": 1}, {"a": 2.5}) == ("struct", (("a", ("double",)),))


def test_null_goes_with_anything_and_all_null_is_string() -> None:
    assert row_type({"a": None, "b": None}, {"a": 3, "b": None}) == (
        "struct",
        (("a", ("long",)), ("b", ("string",))),
    )


def test_fields_keep_first_seen_order_and_missing_fields_are_added() -> None:
    assert [n for n, _ in row_type({"b": 1, "a": 1}, {"c": "x", "a": 2})[1]] == ["b", "a", "c"]


def test_nested_objects_merge_and_arrays_merge_elements() -> None:
    kind = row_type({"o": {"x": 1}, "l": [1, 2]}, {"o": {"y": "s", "x": 1.5}, "l": [0.5]})
    assert kind == (
        "struct",
        (
            ("o", ("struct", (("x", ("double",)), ("y", ("string",))))),
            ("l", ("array", ("double",))),
        ),
    )


def test_incompatible_values_fall_back_to_string() -> None:
    assert row_type({"a": 1}, {"a": "one"}) == ("struct", (("a", ("string",)),))
    assert row_type({"a": {"k": 1}}, {"a": [1]}) == ("struct", (("a", ("string",)),))
    assert row_type({"a": True}, {"a": 1}) == ("struct", (("a", ("string",)),))


def test_integers_beyond_64_bits_are_doubles() -> None:
    assert infer_type(2**70) == ("double",)
    assert infer_type(2**63 - 1) == ("long",)

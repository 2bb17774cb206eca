"""canonical_json takes a fast path; it must give the standard encoder's bytes or error."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkernel.canonical import canonical_json, plain_json

_REFERENCE = json.JSONEncoder(
    ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
)


def reference(value: Any) -> bytes | type[BaseException]:
    """The canonical form as defined: the standard encoder, or the error it raises."""
    try:
        return _REFERENCE.encode(value).encode("utf-8")
    except (TypeError, ValueError) as exc:
        return type(exc)


def encoded(value: Any) -> bytes | type[BaseException]:
    try:
        return canonical_json(value)
    except (TypeError, ValueError) as exc:
        return type(exc)


class Colour(enum.StrEnum):
    RED = "red"


class Size(enum.IntEnum):
    SMALL = 1


class Shape(enum.Enum):
    ROUND = 1.5


@dataclasses.dataclass
class Point:
    x: int


class Text(str):
    pass


scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # beyond 64 bits too
    | st.floats()  # NaN, infinities, -0.0, subnormals
    | st.text()  # lone surrogates, control characters, astral characters
    | st.sampled_from(
        [Colour.RED, Size.SMALL, Shape.ROUND, uuid.UUID(int=7), Point(1), Text("t"), b"x"]
    )
)
keys = st.text() | st.integers() | st.sampled_from([None, True, 1.5, Colour.RED])
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5)
        | st.tuples(children, children)
        | st.dictionaries(keys, children, max_size=5)
        | st.dictionaries(st.text(), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=3000)
@given(values)
def test_same_bytes_or_same_error_as_the_standard_encoder(value: Any) -> None:
    assert encoded(value) == reference(value)


@settings(max_examples=5000)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=4))
def test_floats_have_the_standard_spelling(floats: list[float]) -> None:
    assert canonical_json(floats) == reference(floats)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"b": 1, "a": [True, None, "é"]}, b'{"a":[true,null,"\xc3\xa9"],"b":1}'),
        ({"t": 1e-07}, b'{"t":1e-07}'),  # orjson would write 1e-7
        ({"t": 1e16}, b'{"t":1e+16}'),
        ({"t": 0.00001}, b'{"t":1e-05}'),
        ({"t": 0.0001, "u": 9999999999999998.0}, b'{"t":0.0001,"u":9999999999999998.0}'),
        ([1, 2.5], b"[1,2.5]"),
        (1e-07, b"1e-07"),
        ((1, "a"), b'[1,"a"]'),
        ({1: "a"}, b'{"1":"a"}'),
        ({"k": 1 << 70}, b'{"k":1180591620717411303424}'),
        ({"k": Colour.RED, "n": Size.SMALL}, b'{"k":"red","n":1}'),
        ({"s": "a:1.5"}, b'{"s":"a:1.5"}'),  # looks like a float inside a string
        ("x" * 70_000, b'"' + b"x" * 70_000 + b'"'),  # a large value
    ],
)
def test_known_forms(value: Any, expected: bytes) -> None:
    assert canonical_json(value) == expected


@pytest.mark.parametrize("value", [math.nan, [math.inf], {"a": -math.inf}])
def test_nan_and_infinity_are_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="JSON compliant"):
        canonical_json(value)


@pytest.mark.parametrize(
    "value", [uuid.UUID(int=1), {"s": Shape.ROUND}, [Point(1)], {"b": b"bytes"}, {1.5j}]
)
def test_what_json_cannot_carry_is_refused(value: Any) -> None:
    with pytest.raises(TypeError):
        canonical_json(value)


def test_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(UnicodeEncodeError):
        canonical_json({"s": "\ud800"})


def test_a_cycle_is_refused() -> None:
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(ValueError, match="Circular"):
        canonical_json(looped)


def test_deep_nesting_past_the_fast_encoders_limit() -> None:
    deep: Any = "leaf"
    for _ in range(300):
        deep = [deep]
    assert canonical_json(deep) == b"[" * 300 + b'"leaf"' + b"]" * 300


def test_plain_values_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Else the equivalence test above would pass by never leaving the standard path."""

    class Unused:
        def encode(self, value: Any) -> str:
            raise AssertionError("the standard encoder was used")

    monkeypatch.setattr("toolkernel.canonical._ENCODER", Unused())
    payload = {
        "arguments": {"text": "hi", "n": 3, "ratio": 0.25, "big": 1234567890123456.0},
        "at": "2026-11-29T23:44:16.123456Z",
        "usage": {"cost": 1.0, "durationMs": 0.011, "small": -0.0001},
    }
    assert canonical_json(payload) == reference(payload)


class Touchy(enum.Enum):
    """An enum whose comparison raises: the fast path's check must not let that out."""

    A = 1

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparing")

    __hash__ = enum.Enum.__hash__


def test_an_object_whose_comparison_raises_gets_the_standard_error() -> None:
    with pytest.raises(TypeError):
        canonical_json([Touchy.A])


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5)
        | st.tuples(children, children)
        | st.dictionaries(st.text(), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=3000)
@given(json_values)
def test_plain_json_gives_the_canonical_bytes_or_error_of_plain_data(value: Any) -> None:
    """What the kernel builds from checked parts skips the type check, not the form:
    integers past 64 bits, floats the two encoders spell differently and
    lone surrogates still come out as the standard encoder has them."""
    try:
        expected: bytes | type[BaseException] = canonical_json(value)
    except (TypeError, ValueError) as exc:
        expected = type(exc)
    try:
        got: bytes | type[BaseException] = plain_json(value)
    except (TypeError, ValueError) as exc:
        got = type(exc)
    assert got == expected


@pytest.mark.parametrize("value", [{"b": b"bytes"}, [{1.5j}], {"p": Point(1)}])
def test_plain_json_still_refuses_what_no_encoder_can_write(value: Any) -> None:
    with pytest.raises(TypeError):
        plain_json(value)

"""Property tests: raw arguments either parse to an object or are rejected with a code."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from toolkernel.arguments import ArgumentsRejected, ParsedArguments, parse_arguments
from toolkernel.codes import CATALOG, ErrorCode, Status

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


def _outcome_is_valid(outcome: object) -> None:
    assert isinstance(outcome, ParsedArguments | ArgumentsRejected)
    if isinstance(outcome, ArgumentsRejected):
        assert CATALOG[outcome.code].status is Status.INVALID_ARGUMENTS
    else:
        assert isinstance(outcome.value, dict)
        assert outcome.hash.startswith("sha256:")


@settings(max_examples=400)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_never_raise(raw: bytes):
    _outcome_is_valid(parse_arguments(raw, max_bytes=256))


@settings(max_examples=400)
@given(st.text(max_size=512))
def test_arbitrary_text_never_raises(raw: str):
    _outcome_is_valid(parse_arguments(raw, max_bytes=256))


@settings(max_examples=300)
@given(json_values)
def test_json_objects_parse_and_other_json_is_rejected(value):
    outcome = parse_arguments(json.dumps(value), max_bytes=1 << 20)
    _outcome_is_valid(outcome)
    if isinstance(value, dict) and not _has_inf(value):
        assert isinstance(outcome, ParsedArguments)
        assert outcome.value == value


@given(st.dictionaries(st.text(max_size=5), st.integers(), min_size=1, max_size=5))
def test_the_hash_does_not_depend_on_key_order_or_spacing(value):
    compact = json.dumps(value, separators=(",", ":"))
    spaced = json.dumps(dict(reversed(list(value.items()))), indent=2)
    first, second = parse_arguments(compact), parse_arguments(spaced)
    assert isinstance(first, ParsedArguments)
    assert isinstance(second, ParsedArguments)
    assert first.hash == second.hash == parse_arguments(value).hash  # type: ignore[union-attr]


def _has_inf(value) -> bool:
    if isinstance(value, float):
        return math.isinf(value)
    if isinstance(value, dict):
        return any(_has_inf(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_inf(v) for v in value)
    return False


# Text that may hold lone surrogates: JSON can spell them ("\ud800"), UTF-8 cannot.
surrogate_text = st.text(
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF) | st.characters(), max_size=8
)
values_with_surrogates = st.recursive(
    st.none() | st.integers() | surrogate_text,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(surrogate_text, children, max_size=3)
    ),
    max_leaves=10,
)


def _has_surrogate(value) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


@settings(max_examples=300)
@given(st.dictionaries(surrogate_text, values_with_surrogates, max_size=4))
def test_lone_surrogates_are_refused_as_text_and_as_mappings(value):
    for raw in (json.dumps(value), value):  # the provider's JSON text, a library's dict
        outcome = parse_arguments(raw, max_bytes=1 << 20)
        _outcome_is_valid(outcome)
        if _has_surrogate(value):
            assert isinstance(outcome, ArgumentsRejected)
            assert outcome.code is ErrorCode.ARGUMENTS_INVALID_UTF8
        else:
            assert isinstance(outcome, ParsedArguments)


@settings(max_examples=300)
@given(json_values, st.integers(min_value=0, max_value=400))
def test_a_number_gets_the_same_verdict_as_text_and_as_a_decoded_mapping(value, digits):
    """OpenAI sends arguments as text, Anthropic as decoded input: the same proposal is
    refused or accepted alike, an integer past the digit limit included."""
    arguments = {"value": value, "n": int("7" * digits) if digits else 0}
    as_text = parse_arguments(json.dumps(arguments))
    as_mapping = parse_arguments(arguments)
    assert type(as_text) is type(as_mapping)
    if isinstance(as_text, ArgumentsRejected):
        assert isinstance(as_mapping, ArgumentsRejected)
        assert as_mapping.code == as_text.code
    elif digits > 100:
        raise AssertionError("an integer past the digit limit was accepted")


def test_an_integer_past_pythons_own_limit_is_too_large_not_infinite():
    rejected = parse_arguments({"x": 10**5000})
    assert isinstance(rejected, ArgumentsRejected)
    assert rejected.code is ErrorCode.NUMBER_TOO_LARGE


def test_a_float_beyond_the_64_bit_range_is_named_so():
    rejected = parse_arguments('{"x": 1e400}')
    assert isinstance(rejected, ArgumentsRejected)
    assert rejected.code is ErrorCode.NUMBER_TOO_LARGE
    assert "64-bit float" in CATALOG[rejected.code].template

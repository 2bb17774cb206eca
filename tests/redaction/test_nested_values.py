"""Deeply nested values: the redactor copies them at any depth, the kernel refuses them.

``Redactor.redact`` walks with an explicit stack; ``normalize`` ends a call whose output
nests deeper than ``MAX_OUTPUT_DEPTH`` as FAILED/OUTPUT_CONTRACT_VIOLATION before
anything recursive (encoding, the output schema, redaction) sees it, and the other
calls of the turn are not affected.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkernel import ToolCall
from toolkernel.codes import ErrorCode, Status
from toolkernel.functions import tool
from toolkernel.normalize import MAX_OUTPUT_DEPTH
from toolkernel.redaction import SECRET_MASK, Redactor
from toolkernel.testing import make_kernel

pytestmark = pytest.mark.anyio

WORKSPACE = Path("/srv/ws")
KNOWN = "injected-known-value-9"
TOKEN = "ghp_" + "Zq8vN2kLmX4pRt7YbW1cJ9sD3fGh6KaE0uIo"
CONFIG = """
[[exposure]]
tools = ["*"]
"""


def nested(depth: int, leaf: Any = TOKEN) -> Any:
    """``depth`` containers around ``leaf``, lists and dicts in turn."""
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def depth_of(value: Any) -> int:
    depth = 0
    while isinstance(value, dict | list):
        value = value["k"] if isinstance(value, dict) else value[0]
        depth += 1
    return depth


def innermost(value: Any) -> Any:
    while isinstance(value, dict | list):
        value = value["k"] if isinstance(value, dict) else value[0]
    return value


def recursive_redact(redactor: Redactor, value: Any, counts: Counter[str]) -> Any:
    """The recursive definition the redactor's walk must agree with."""
    if isinstance(value, str):
        return redactor.redact_text(value, counts)
    if isinstance(value, dict):
        copy: dict[str, Any] = {}
        for k, v in value.items():
            key = redactor.redact_text(str(k), counts)
            number = 2
            while key in copy:  # keys that redact (or spell) alike are numbered
                key = f"{redactor.redact_text(str(k), Counter())} ({number})"
                number += 1
            copy[key] = recursive_redact(redactor, v, counts)
        return copy
    if isinstance(value, list | tuple):
        return [recursive_redact(redactor, v, counts) for v in value]
    return value


def test_redact_copies_a_value_nested_past_the_recursion_limit():
    depth = 4 * sys.getrecursionlimit()
    counts: Counter[str] = Counter()
    copy = Redactor(WORKSPACE).redact(nested(depth), counts)
    assert depth_of(copy) == depth
    assert innermost(copy) == SECRET_MASK
    assert counts == Counter({"github-token": 1})


def test_redact_refuses_a_value_that_contains_itself():
    loop: list[Any] = ["x"]
    loop.append({"again": loop})
    with pytest.raises(ValueError, match="contains itself"):
        Redactor(WORKSPACE).redact({"a": loop}, Counter())


def test_redact_copies_the_same_container_twice_when_it_is_shared():
    shared = nested(MAX_OUTPUT_DEPTH * 2, KNOWN)
    copy = Redactor(WORKSPACE, secrets=[KNOWN]).redact([shared, {"b": shared}], Counter())
    assert innermost(copy[0]) == innermost(copy[1]["b"]) == SECRET_MASK


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.sampled_from(["plain", TOKEN, KNOWN, "/home/alice/x.txt", "[REDACTED]", SECRET_MASK]),
    st.text(max_size=30),
)
KEYS = st.one_of(st.sampled_from(["a", TOKEN, KNOWN, "[REDACTED]"]), st.text(max_size=8))
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.one_of(KEYS, st.integers(-3, 3)), inner, max_size=5),
    ),
    max_leaves=40,
)


@settings(max_examples=300)
@given(VALUES)
def test_the_walk_gives_what_the_recursive_definition_gives(value):
    # Keys that redact alike (two secrets) are numbered: no entry is lost.
    redactor = Redactor(WORKSPACE, secrets=[KNOWN])
    expected_counts: Counter[str] = Counter()
    expected = recursive_redact(redactor, value, expected_counts)
    counts: Counter[str] = Counter()
    copy = redactor.redact(value, counts)
    assert copy == expected
    assert list(keys_in_order(copy)) == list(keys_in_order(expected))
    assert counts == expected_counts
    assert entries(copy) == entries(value)


def entries(value: Any) -> int:
    """How many dict entries and list items ``value`` holds, at every depth."""
    if isinstance(value, dict):
        return len(value) + sum(entries(v) for v in value.values())
    if isinstance(value, list | tuple):
        return len(value) + sum(entries(v) for v in value)
    return 0


def keys_in_order(value: Any) -> Any:
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from keys_in_order(item)
    elif isinstance(value, list):
        for item in value:
            yield from keys_in_order(item)


@tool("t.deep")
def deep_output(levels: int) -> Any:
    """Return output nested ``levels`` deep.

    Args:
        levels: how deep.
    """
    return nested(levels)


@tool("t.loop")
def looping_output() -> Any:
    """Return output that contains itself."""
    loop: list[Any] = []
    loop.append(loop)
    return {"loop": loop}


@tool("t.ok")
def ok() -> dict[str, bool]:
    """Succeed."""
    return {"ok": True}


@pytest.fixture
def kernel(tmp_path: Path):
    kernel = make_kernel(tmp_path / "ws", CONFIG, workspace_tools=False)
    for definition in (deep_output, looping_output, ok):
        kernel.register(definition)
    yield kernel
    kernel.close()


@pytest.mark.parametrize("levels", [MAX_OUTPUT_DEPTH + 1, 500, 990, 5_000])
async def test_output_nested_too_deeply_fails_that_call_alone(kernel, levels):
    results = await kernel.call_many(
        kernel.start_run(),
        [
            ToolCall("t.ok", {}, tool_call_id="call_ok"),
            ToolCall("t.deep", {"levels": levels}, tool_call_id="call_deep"),
            ToolCall("t.ok", {}, tool_call_id="call_ok_2"),
        ],
    )
    fine, deep, also_fine = results
    assert fine.status is also_fine.status is Status.SUCCEEDED
    assert fine.structured_output == {"ok": True}
    assert (deep.status, deep.error_code) == (Status.FAILED, ErrorCode.OUTPUT_CONTRACT_VIOLATION)
    assert deep.structured_output is None
    assert f"more than {MAX_OUTPUT_DEPTH} levels" in deep.safe_message


async def test_output_at_the_depth_limit_is_returned_redacted(kernel):
    result = await kernel.call(kernel.start_run(), "t.deep", {"levels": MAX_OUTPUT_DEPTH})
    assert result.status is Status.SUCCEEDED
    assert depth_of(result.structured_output) == MAX_OUTPUT_DEPTH
    assert innermost(result.structured_output) == SECRET_MASK


async def test_output_that_contains_itself_fails_as_nested_too_deeply(kernel):
    result = await kernel.call(kernel.start_run(), "t.loop", {})
    assert (result.status, result.error_code) == (
        Status.FAILED,
        ErrorCode.OUTPUT_CONTRACT_VIOLATION,
    )

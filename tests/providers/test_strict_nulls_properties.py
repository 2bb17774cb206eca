"""Property tests for ``strip_strict_nulls``: it drops only nulls, leaves valid arguments
as they are, and undoes strict mode's spelling, ``anyOf``/``oneOf`` branches included."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion

from toolkernel.codes import Status
from toolkernel.config import Config
from toolkernel.functions import tool
from toolkernel.kernel import Kernel
from toolkernel.providers import (
    NameMap,
    StrictSchemaError,
    openai_strict_schema,
    parse_openai_chat,
    render_openai_chat_tools,
    strip_strict_nulls,
)
from toolkernel.schema import compile_schema

LEAVES: dict[str, tuple[dict[str, Any], st.SearchStrategy[Any]]] = {
    "string": ({"type": "string"}, st.text(max_size=3)),
    "integer": ({"type": "integer"}, st.integers(-3, 3)),
    "nullable": ({"type": ["string", "null"]}, st.none() | st.text(max_size=3)),
    "enum": ({"enum": ["a", "b"]}, st.sampled_from(["a", "b"])),
    "any": ({}, st.none() | st.integers() | st.text(max_size=3)),
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=12,
)


def schemas(depth: int, prefix: str, *, closed: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Schemas built the way tool schemas are: objects, arrays, tuples, anyOf, oneOf.
    Objects in different branches have different property names, so that the branch a
    strict spelling came from is the only one it fits."""
    leaf = st.sampled_from([schema for schema, _ in LEAVES.values()])
    if depth == 0:
        return leaf
    return st.one_of(
        leaf,
        _objects(depth, prefix, closed=closed),
        schemas(depth - 1, prefix, closed=closed).map(lambda i: {"type": "array", "items": i}),
        st.lists(schemas(depth - 1, prefix + "t", closed=closed), min_size=1, max_size=2).map(
            lambda positions: {
                "type": "array",
                "prefixItems": positions,
                "items": False,
                "minItems": len(positions),
            }
        ),
        _choices(depth, prefix, closed=closed),
    )


@st.composite
def _objects(draw: Any, depth: int, prefix: str, *, closed: bool) -> dict[str, Any]:
    count = draw(st.integers(1, 3))
    properties = {
        f"{prefix}p{i}": draw(schemas(depth - 1, f"{prefix}p{i}.", closed=closed))
        for i in range(count)
    }
    schema = {
        "type": "object",
        "properties": properties,
        "required": [name for name in properties if draw(st.booleans())],
    }
    if closed or draw(st.booleans()):
        schema["additionalProperties"] = False
    return schema


@st.composite
def _choices(draw: Any, depth: int, prefix: str, *, closed: bool) -> dict[str, Any]:
    count = draw(st.integers(1, 3))
    branches = [draw(schemas(depth - 1, f"{prefix}{i}_", closed=closed)) for i in range(count)]
    return {draw(st.sampled_from(["anyOf", "oneOf"])): branches}


@st.composite
def instances(draw: Any, schema: dict[str, Any]) -> tuple[Any, Any]:
    """A value of ``schema`` and the same value as strict mode spells it."""
    for leaf, values in LEAVES.values():
        if schema == leaf:
            value = draw(values)
            return value, value
    choices = schema.get("anyOf", schema.get("oneOf"))
    if choices is not None:
        return draw(instances(draw(st.sampled_from(choices))))
    if "properties" in schema:
        value: dict[str, Any] = {}
        spelled: dict[str, Any] = {}
        for name, sub in schema["properties"].items():
            kept = name in schema["required"] or accepts_null(sub) or draw(st.booleans())
            if kept:
                value[name], spelled[name] = draw(instances(sub))
            else:
                spelled[name] = None
        return value, spelled
    if "prefixItems" in schema:
        pairs = [draw(instances(p)) for p in schema["prefixItems"]]
    else:
        pairs = draw(st.lists(instances(schema["items"]), max_size=2))
    return [v for v, _ in pairs], [s for _, s in pairs]


def accepts_null(schema: dict[str, Any]) -> bool:
    choices = schema.get("anyOf", schema.get("oneOf"))
    if choices is not None:
        return any(accepts_null(c) for c in choices)
    return not schema or "null" in schema.get("type", ())


@st.composite
def tool_arguments(draw: Any, *, closed: bool) -> tuple[dict[str, Any], Any, Any]:
    """A tool's input schema (an object), a valid argument object and its spelling."""
    schema = draw(_objects(3, "", closed=closed))
    value, spelled = draw(instances(schema))
    assume(compile_schema(schema).is_valid(value))  # two oneOf branches may both fit
    return schema, value, spelled


def only_nulls_dropped(before: Any, after: Any) -> bool:
    if isinstance(before, dict):
        return (
            isinstance(after, dict)
            and after.keys() <= before.keys()
            and all(before[k] is None for k in before.keys() - after.keys())
            and all(only_nulls_dropped(before[k], after[k]) for k in after)
        )
    if isinstance(before, list):
        return (
            isinstance(after, list)
            and len(before) == len(after)
            and all(only_nulls_dropped(b, a) for b, a in zip(before, after, strict=True))
        )
    return type(before) is type(after) and before == after


@settings(max_examples=300)
@given(tool_arguments(closed=False), st.dictionaries(st.text(max_size=3), json_values))
def test_only_nulls_are_ever_dropped(case: Any, noise: dict[str, Any]) -> None:
    schema, _, spelled = case
    for arguments in (spelled, noise, {**noise, **spelled}):
        assert only_nulls_dropped(arguments, strip_strict_nulls(schema, arguments))


@settings(max_examples=300)
@given(tool_arguments(closed=False))
def test_a_valid_argument_comes_back_unchanged(case: Any) -> None:
    schema, value, _ = case
    assert strip_strict_nulls(schema, value) == value


@settings(max_examples=300)
@given(tool_arguments(closed=True))
def test_the_strict_spelling_of_a_valid_argument_comes_back_as_it_was(case: Any) -> None:
    schema, value, spelled = case
    try:
        strict = openai_strict_schema(schema)
    except StrictSchemaError:
        assume(False)  # e.g. an unconstrained value: the tool is not sent strict
    assert compile_schema(strict).is_valid(spelled)
    assert strip_strict_nulls(schema, spelled) == value


@dataclasses.dataclass
class Filter:
    pattern: str
    limit: int = 10


seen: list[Any] = []


@pytest.mark.anyio
async def test_a_strict_call_with_a_null_inside_an_optional_dataclass_succeeds(
    tmp_path: Any,
) -> None:
    @tool("t.search")
    def search(query: str, filter: Filter | None = None) -> None:
        """Search."""
        seen.append(filter)

    rendered = render_openai_chat_tools([search.definition])
    assert rendered[0]["function"]["strict"] is True
    arguments = json.dumps({"query": "x", "filter": {"pattern": "foo", "limit": None}})
    response = ChatCompletion.model_validate(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "t__search", "arguments": arguments},
                            }
                        ],
                    },
                }
            ],
        }
    )
    with Kernel(Config.default(tmp_path), workspace_tools=False) as kernel:
        kernel.register(search)
        run = kernel.start_run()
        (call,) = parse_openai_chat(response, NameMap.build([search.definition]))
        (result,) = await kernel.call_many(run, [call])
    assert result.status is Status.SUCCEEDED, result.safe_message
    assert seen.pop() == Filter(pattern="foo", limit=10)

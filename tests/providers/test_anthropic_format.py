"""Anthropic Messages: render tools → parse tool_use → execute → one tool_result message."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

import annotated_types as at
import anyio
import pytest
from anthropic.types import Message, MessageParam, ToolParam, ToolResultBlockParam
from pydantic import TypeAdapter

from toolkernel.arguments import ArgumentsRejected, parse_arguments
from toolkernel.calls import PROJECTION_KEYS, ToolCallResult
from toolkernel.codes import ErrorCode, Status
from toolkernel.config import Config
from toolkernel.errors import ToolFailed
from toolkernel.functions import tool
from toolkernel.kernel import Kernel
from toolkernel.providers import (
    NameMap,
    ProviderFormatError,
    parse_anthropic,
    render_anthropic_results,
    render_anthropic_tools,
)
from toolkernel.run import Run, ToolCall


@tool("repo.search")
def search(query: Annotated[str, at.MaxLen(200)], limit: Annotated[int, at.Ge(1)] = 10) -> dict:
    """Search the repository.

    Args:
        query: the text to find.
        limit: the most hits to return.
    """
    return {"query": query, "limit": limit}


@tool("repo.fail")
def fail(reason: str) -> None:
    """Always fails."""
    raise ToolFailed(f"cannot: {reason}")


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    with Kernel(Config.default(tmp_path), workspace_tools=False) as kernel:
        kernel.register(search)
        kernel.register(fail)
        yield kernel


def execute(kernel: Kernel, run: Run, calls: Sequence[ToolCall]) -> list[ToolCallResult]:
    async def go() -> list[ToolCallResult]:
        with anyio.fail_after(10):
            return await kernel.call_many(run, calls)

    return anyio.run(go)


def message(*blocks: dict[str, Any]) -> Message:
    return Message.model_validate(
        {
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5-20250929",
            "content": list(blocks),
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 410, "output_tokens": 96},
        }
    )


def tool_use(block_id: str, name: str, tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": block_id, "name": name, "input": tool_input}


def test_anthropic_round_trip_through_the_kernel(kernel: Kernel) -> None:
    run = kernel.start_run()
    definitions = kernel.expose(run)
    tools = render_anthropic_tools(definitions)
    for entry in tools:
        assert TypeAdapter(ToolParam).validate_python(entry) == entry
    by_name = {t["name"]: t for t in tools}
    assert by_name["repo__search"]["input_schema"] == search.definition.input_schema

    reply = message(
        {"type": "text", "text": "Let me look."},
        tool_use("toolu_01", "repo__search", {"query": "kernel"}),
        tool_use("toolu_02", "repo__fail", {"reason": "disk"}),
        tool_use("toolu_03", "repo__search", {"query": "x", "extra": 1}),
    )
    calls = parse_anthropic(reply, NameMap.build(definitions))
    assert [(c.tool_name, c.tool_call_id) for c in calls] == [
        ("repo.search", "toolu_01"),
        ("repo.fail", "toolu_02"),
        ("repo.search", "toolu_03"),
    ]
    results = execute(kernel, run, calls)
    assert [r.status for r in results] == [
        Status.SUCCEEDED,
        Status.FAILED,
        Status.INVALID_ARGUMENTS,
    ]
    assert results[2].error_code is ErrorCode.UNKNOWN_PROPERTY

    rendered = render_anthropic_results(results)
    validated = TypeAdapter(MessageParam).validate_python(rendered)
    assert validated["role"] == "user"
    blocks = rendered["content"]
    # MessageParam's content is an Iterable, which pydantic validates lazily (iterating
    # it outside validation panics in pydantic-core 2.50), so each block is checked too.
    for block in blocks:
        assert TypeAdapter(ToolResultBlockParam).validate_python(block) == block
    assert [b["tool_use_id"] for b in blocks] == ["toolu_01", "toolu_02", "toolu_03"]
    assert [b["is_error"] for b in blocks] == [False, True, True]
    for block in blocks:
        assert tuple(json.loads(block["content"])) == PROJECTION_KEYS


def test_sdk_objects_dicts_and_json_text_parse_alike() -> None:
    reply = message(tool_use("toolu_1", "a__b", {"x": [1, 2]}))
    names = NameMap()
    assert (
        parse_anthropic(reply, names)
        == parse_anthropic(reply.model_dump(), names)
        == parse_anthropic(reply.model_dump_json(), names)
    )


def test_server_tool_blocks_and_text_are_not_proposals() -> None:
    reply = message(
        {"type": "text", "text": "Searching the web."},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
         "input": {"query": "x"}},
    )  # fmt: skip
    assert parse_anthropic(reply, NameMap()) == []


@pytest.mark.parametrize(
    ("tool_input", "code"),
    [
        ('{"query": "x"}', ErrorCode.ARGUMENTS_NOT_OBJECT),
        ([1], ErrorCode.ARGUMENTS_NOT_OBJECT),
        (None, ErrorCode.ARGUMENTS_NOT_OBJECT),
        (3.5, ErrorCode.ARGUMENTS_NOT_OBJECT),
        (object(), ErrorCode.ARGUMENTS_NOT_JSON),
    ],
)
def test_an_input_that_is_not_an_object_is_refused_with_a_specific_code(
    tool_input: Any, code: ErrorCode
) -> None:
    (call,) = parse_anthropic({"content": [tool_use("toolu_9", "f", tool_input)]}, NameMap())
    assert call.tool_call_id == "toolu_9"
    parsed = parse_arguments(call.arguments)
    assert isinstance(parsed, ArgumentsRejected)
    assert parsed.code is code


@pytest.mark.parametrize(
    "document", ["{", {"choices": []}, {"content": "text"}, 5, [{"type": "tool_use"}]]
)
def test_messages_without_a_content_list_raise_provider_format_error(document: Any) -> None:
    with pytest.raises(ProviderFormatError):
        parse_anthropic(document, NameMap())


def test_all_results_of_a_turn_go_in_one_user_message_in_order() -> None:
    results = [
        ToolCallResult.from_code(f"toolu_{i}", ErrorCode.TIMEOUT, tool="t", seconds=1)
        for i in range(3)
    ]
    rendered = render_anthropic_results(results)
    assert [b["tool_use_id"] for b in rendered["content"]] == ["toolu_0", "toolu_1", "toolu_2"]
    assert all(b["is_error"] for b in rendered["content"])

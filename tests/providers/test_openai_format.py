"""OpenAI Chat Completions and Responses: render tools → parse → execute → render results.

Responses are built with the official SDK's own types and the rendered messages are
validated against the SDK's own parameter types.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

import annotated_types as at
import anyio
import pytest
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionToolMessageParam,
    ChatCompletionToolParam,
)
from openai.types.responses import FunctionToolParam, Response
from openai.types.responses.response_input_param import FunctionCallOutput
from pydantic import TypeAdapter

from toolkernel.arguments import ArgumentsRejected, parse_arguments
from toolkernel.calls import PROJECTION_KEYS, ToolCallResult
from toolkernel.codes import ErrorCode, Status
from toolkernel.config import Config
from toolkernel.functions import tool
from toolkernel.kernel import Kernel
from toolkernel.providers import (
    NameMap,
    ProviderFormatError,
    parse_openai_chat,
    parse_openai_responses,
    render_openai_chat_results,
    render_openai_chat_tools,
    render_openai_responses_results,
    render_openai_responses_tools,
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


@tool("math.add")
def add(a: int, b: int) -> dict:
    """Add two integers."""
    return {"sum": a + b}


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    with Kernel(Config.default(tmp_path), workspace_tools=False) as kernel:
        kernel.register(search)
        kernel.register(add)
        yield kernel


def execute(kernel: Kernel, run: Run, calls: Sequence[ToolCall]) -> list[ToolCallResult]:
    async def go() -> list[ToolCallResult]:
        with anyio.fail_after(10):
            return await kernel.call_many(run, calls)

    return anyio.run(go)


def chat_completion(*tool_calls: dict[str, Any]) -> ChatCompletion:
    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-AbC123",
            "object": "chat.completion",
            "created": 1_760_000_000,
            "model": "gpt-4.1-2025-04-14",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "logprobs": None,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "refusal": None,
                        "tool_calls": list(tool_calls),
                    },
                }
            ],
            "usage": {"prompt_tokens": 120, "completion_tokens": 40, "total_tokens": 160},
        }
    )


def chat_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def response(*items: dict[str, Any]) -> Response:
    return Response.model_validate(
        {
            "id": "resp_0123",
            "object": "response",
            "created_at": 1_760_000_000,
            "model": "gpt-4.1-2025-04-14",
            "status": "completed",
            "output": list(items),
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
    )


def function_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def test_chat_round_trip_through_the_kernel(kernel: Kernel) -> None:
    run = kernel.start_run()
    definitions = kernel.expose(run)
    tools = render_openai_chat_tools(definitions)
    for entry in tools:
        assert TypeAdapter(ChatCompletionToolParam).validate_python(entry) == entry
    rendered = {t["function"]["name"]: t["function"] for t in tools}
    assert rendered["repo__search"]["strict"] is True
    assert rendered["repo__search"]["parameters"]["required"] == ["query", "limit"]

    completion = chat_completion(
        chat_call("call_1", "repo__search", '{"query": "kernel", "limit": null}'),
        chat_call("call_2", "math__add", '{"a": 1, "b": 2}'),
        chat_call("call_3", "math__add", '{"a": 1, "b":'),
    )
    calls = parse_openai_chat(completion, NameMap.build(definitions))
    assert [(c.tool_name, c.tool_call_id) for c in calls] == [
        ("repo.search", "call_1"),
        ("math.add", "call_2"),
        ("math.add", "call_3"),
    ]
    results = execute(kernel, run, calls)
    assert [r.status for r in results] == [
        Status.SUCCEEDED,
        Status.SUCCEEDED,
        Status.INVALID_ARGUMENTS,
    ]
    assert results[0].structured_output == {"query": "kernel", "limit": 10}
    assert results[2].error_code is ErrorCode.ARGUMENTS_NOT_JSON

    messages = render_openai_chat_results(results)
    for message, call in zip(messages, calls, strict=True):
        assert TypeAdapter(ChatCompletionToolMessageParam).validate_python(message) == message
        assert message["tool_call_id"] == call.tool_call_id
        assert tuple(json.loads(message["content"])) == PROJECTION_KEYS


def test_responses_round_trip_through_the_kernel(kernel: Kernel) -> None:
    run = kernel.start_run()
    definitions = kernel.expose(run)
    tools = render_openai_responses_tools(definitions)
    for entry in tools:
        assert TypeAdapter(FunctionToolParam).validate_python(entry) == entry

    reply = response(
        {"type": "reasoning", "id": "rs_1", "summary": []},
        function_call("call_a", "math__add", '{"a": 2, "b": 3}'),
        function_call("call_b", "repo__search", '{"query": "x", "query": "y"}'),
        function_call("call_c", "repo__search", "[1, 2]"),
    )
    calls = parse_openai_responses(reply, NameMap.build(definitions))
    assert [c.tool_call_id for c in calls] == ["call_a", "call_b", "call_c"]
    results = execute(kernel, run, calls)
    assert results[0].structured_output == {"sum": 5}
    assert [r.error_code for r in results[1:]] == [
        ErrorCode.DUPLICATE_KEY,
        ErrorCode.ARGUMENTS_NOT_OBJECT,
    ]

    items = render_openai_responses_results(results)
    for item, call in zip(items, calls, strict=True):
        assert TypeAdapter(FunctionCallOutput).validate_python(item) == item
        assert item["call_id"] == call.tool_call_id
        assert tuple(json.loads(item["output"])) == PROJECTION_KEYS


def test_sdk_objects_dicts_and_json_text_parse_alike() -> None:
    names = NameMap()
    completion = chat_completion(chat_call("call_1", "f__g", '{"x": 1}'))
    assert (
        parse_openai_chat(completion, names)
        == parse_openai_chat(completion.model_dump(), names)
        == parse_openai_chat(completion.model_dump_json(), names)
    )
    reply = response(function_call("call_1", "f__g", '{"x": 1}'))
    assert (
        parse_openai_responses(reply, names)
        == parse_openai_responses(reply.model_dump(), names)
        == parse_openai_responses(reply.model_dump_json(), names)
    )


def test_a_reply_without_tool_calls_proposes_nothing() -> None:
    completion = chat_completion()
    completion.choices[0].message.tool_calls = None
    assert parse_openai_chat(completion, NameMap()) == []
    text_only = {
        "type": "message",
        "id": "m",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
    }
    assert parse_openai_responses(response(text_only), NameMap()) == []


def rejection(call: ToolCall) -> ErrorCode:
    parsed = parse_arguments(call.arguments)
    assert isinstance(parsed, ArgumentsRejected)
    return parsed.code


@pytest.mark.parametrize(
    ("arguments", "code"),
    [
        (7, ErrorCode.ARGUMENTS_NOT_OBJECT),
        ([1, 2], ErrorCode.ARGUMENTS_NOT_OBJECT),
        (True, ErrorCode.ARGUMENTS_NOT_OBJECT),
        (float("nan"), ErrorCode.NON_FINITE_NUMBER),
        (b'{"a": "\xff"}', ErrorCode.ARGUMENTS_INVALID_UTF8),
        ('{"a": NaN}', ErrorCode.NON_FINITE_NUMBER),
        ('{"a": ' + "1" * 500 + "}", ErrorCode.NUMBER_TOO_LARGE),
        ("[" * 100 + "]" * 100, ErrorCode.NESTING_TOO_DEEP),
        ('"just text"', ErrorCode.ARGUMENTS_NOT_OBJECT),
        ("x" * 300_000, ErrorCode.ARGUMENTS_TOO_LARGE),
        (object(), ErrorCode.ARGUMENTS_NOT_JSON),
    ],
)
def test_malformed_arguments_become_calls_the_kernel_refuses_with_a_specific_code(
    arguments: Any, code: ErrorCode
) -> None:
    document = {"choices": [{"message": {"tool_calls": [
        {"id": "call_9", "function": {"name": "math__add", "arguments": arguments}}
    ]}}]}  # fmt: skip
    (call,) = parse_openai_chat(document, NameMap())
    assert call.tool_call_id == "call_9"
    assert rejection(call) is code
    (call,) = parse_openai_responses({"output": [function_call("c", "f", arguments)]}, NameMap())
    assert rejection(call) is code


def test_a_tool_call_without_a_name_keeps_its_id_and_is_refused_as_unknown(kernel: Kernel) -> None:
    run = kernel.start_run()
    document = {"choices": [{"message": {"tool_calls": [{"id": "call_x", "function": {}}]}}]}
    (call,) = parse_openai_chat(document, NameMap())
    assert (call.tool_name, call.tool_call_id) == ("", "call_x")
    (result,) = execute(kernel, run, [call])
    assert result.tool_call_id == "call_x"
    assert result.error_code is ErrorCode.UNKNOWN_TOOL


def test_decoded_arguments_from_compatible_servers_pass_through() -> None:
    document = {"output": [function_call("c", "f", {"a": 1})]}  # type: ignore[arg-type]
    (call,) = parse_openai_responses(document, NameMap())
    assert call.arguments == {"a": 1}


@pytest.mark.parametrize(
    "document",
    [
        "not json",
        b"\xff\xfe",
        [],
        42,
        {"content": [{"type": "tool_use"}]},
        {"choices": "none"},
        {"choices": [{"message": "hi"}]},
        {"choices": [{"message": {"tool_calls": {"id": 1}}}]},
    ],
)
def test_responses_that_are_not_chat_completions_raise_provider_format_error(document: Any) -> None:
    with pytest.raises(ProviderFormatError):
        parse_openai_chat(document, NameMap())


@pytest.mark.parametrize("document", ["[]", {"choices": []}, {"output": "x"}, None])
def test_responses_without_an_output_list_raise_provider_format_error(document: Any) -> None:
    with pytest.raises(ProviderFormatError):
        parse_openai_responses(document, NameMap())


def test_a_completion_with_no_choices_proposes_nothing() -> None:
    assert parse_openai_chat({"choices": []}, NameMap()) == []

"""Whatever a model or a proxy emits, parsing yields ToolCalls or a ProviderFormatError.

Arbitrary bytes, text and JSON go in as the arguments of an otherwise well-formed call,
and as whole malformed responses. The only outcomes allowed: ToolCalls whose arguments
the kernel's parser accepts or refuses with an INVALID_ARGUMENTS code, or a clear
``ProviderFormatError`` for a document that is not that provider's shape at all.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion

from toolkernel.arguments import ArgumentsRejected, ParsedArguments, parse_arguments
from toolkernel.codes import CATALOG, Status
from toolkernel.config import Config
from toolkernel.functions import tool
from toolkernel.kernel import Kernel
from toolkernel.providers import (
    NameMap,
    ProviderFormatError,
    parse_anthropic,
    parse_openai_chat,
    parse_openai_responses,
)
from toolkernel.run import ToolCall

Parser = Callable[[Any, NameMap], list[ToolCall]]
PARSERS: list[Parser] = [parse_openai_chat, parse_openai_responses, parse_anthropic]

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
RAW = st.binary(max_size=300) | st.text(max_size=300) | JSON


@tool("calc.add")
def add(a: int, b: int = 0) -> dict:
    """Add two integers."""
    return {"sum": a + b}


NAMES = NameMap.build([add.definition])


def assert_usable(calls: list[ToolCall]) -> None:
    for call in calls:
        assert isinstance(call, ToolCall)
        assert isinstance(call.tool_name, str)
        parsed = parse_arguments(call.arguments)
        if isinstance(parsed, ArgumentsRejected):
            assert CATALOG[parsed.code].status is Status.INVALID_ARGUMENTS
        else:
            assert isinstance(parsed, ParsedArguments)


def chat(arguments: Any) -> dict[str, Any]:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "calc__add", "arguments": arguments},
    }
    return {"choices": [{"message": {"role": "assistant", "tool_calls": [call]}}]}


def responses(arguments: Any) -> dict[str, Any]:
    item = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "calc__add",
        "arguments": arguments,
    }
    return {"output": [item]}


def anthropic(tool_input: Any) -> dict[str, Any]:
    return {
        "content": [{"type": "tool_use", "id": "call_1", "name": "calc__add", "input": tool_input}]
    }


@given(RAW)
def test_any_arguments_in_a_well_formed_response_give_one_usable_call(raw: Any) -> None:
    for parser, document in (
        (parse_openai_chat, chat(raw)),
        (parse_openai_responses, responses(raw)),
        (parse_anthropic, anthropic(raw)),
    ):
        calls = parser(document, NAMES)
        assert [(c.tool_name, c.tool_call_id) for c in calls] == [("calc.add", "call_1")]
        assert_usable(calls)


@given(st.text(max_size=300))
def test_any_argument_text_inside_the_sdk_type_gives_one_usable_call(text: str) -> None:
    completion = ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-4.1",
            "choices": [{"index": 0, "finish_reason": "tool_calls", **chat(text)["choices"][0]}],
        }
    )
    calls = parse_openai_chat(completion, NAMES)
    assert len(calls) == 1
    assert_usable(calls)


TOOL_CALLISH = st.fixed_dictionaries(
    {},
    optional={
        "id": JSON,
        "type": st.sampled_from(["function", "custom", "tool_use", "function_call"]) | JSON,
        "function": st.fixed_dictionaries({}, optional={"name": JSON, "arguments": RAW}) | JSON,
        "name": st.sampled_from(["calc__add", "calc.add", ""]) | JSON,
        "arguments": RAW,
        "call_id": JSON,
        "input": RAW,
    },
)
DOCUMENTS = st.fixed_dictionaries(
    {},
    optional={
        "choices": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "message": st.fixed_dictionaries(
                        {}, optional={"tool_calls": st.lists(TOOL_CALLISH | JSON) | JSON}
                    )
                    | JSON
                },
            )
            | JSON,
            max_size=2,
        )
        | JSON,
        "output": st.lists(TOOL_CALLISH | JSON, max_size=4) | JSON,
        "content": st.lists(TOOL_CALLISH | JSON, max_size=4) | JSON,
    },
)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(DOCUMENTS | JSON | st.binary(max_size=200) | st.text(max_size=200))
def test_any_document_gives_usable_calls_or_a_provider_format_error(document: Any) -> None:
    for parser in PARSERS:
        try:
            calls = parser(document, NAMES)
        except ProviderFormatError:
            continue
        assert_usable(calls)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Any:
    workspace: Path = tmp_path_factory.mktemp("workspace")
    with Kernel(Config.default(workspace), workspace_tools=False) as kernel:
        kernel.register(add)
        yield kernel


@settings(max_examples=40, deadline=None)
@given(raw=RAW)
def test_the_kernel_answers_every_fuzzed_call_without_raising(kernel: Kernel, raw: Any) -> None:
    run = kernel.start_run()
    calls = parse_openai_chat(chat(raw), NAMES) + parse_anthropic(anthropic(raw), NAMES)

    async def go() -> list[Any]:
        with anyio.fail_after(10):
            return await kernel.call_many(run, calls)

    results = anyio.run(go)
    assert [r.tool_call_id for r in results] == ["call_1", "call_1"]
    for result in results:
        assert result.status in (Status.SUCCEEDED, Status.INVALID_ARGUMENTS)

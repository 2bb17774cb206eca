"""AgentLoop: provider responses built with the SDKs' own types, run through a real
kernel on a temporary workspace, and the returned messages checked against the SDKs'
own parameter types."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from anthropic.types import MessageParam, ToolParam
from openai.types.chat import (
    ChatCompletionToolMessageParam,
    ChatCompletionToolParam,
)
from openai.types.responses import FunctionToolParam
from openai.types.responses.response_input_param import FunctionCallOutput
from pydantic import TypeAdapter

from sdk_responses import anthropic, chat, responses
from toolkernel.codes import ErrorCode, Status
from toolkernel.errors import UsageError
from toolkernel.functions import tool
from toolkernel.kernel import Kernel
from toolkernel.ledger import EventType
from toolkernel.loop import AgentLoop
from toolkernel.providers import ProviderFormatError
from toolkernel.testing import make_kernel

EDITING = """
[run]
state = "EDITING"
profile = "developer"

[policy]
write_scope = ["src/**"]

[[exposure]]
tools = ["*"]
"""


class Rendezvous:
    """Two read-only tools that finish only if they run at the same time.

    ``probe.first`` waits until ``probe.second`` has finished, so a kernel that ran
    them one after the other would time ``probe.first`` out, and results returned in
    completion order would put ``probe.second`` first.
    """

    def __init__(self) -> None:
        self.second_done: anyio.Event | None = None
        self.finished: list[str] = []

    def event(self) -> anyio.Event:
        if self.second_done is None:
            self.second_done = anyio.Event()
        return self.second_done

    def tools(self) -> list[Any]:
        @tool("probe.first", timeout_ms=5_000)
        async def first() -> str:
            """Wait for the second probe."""
            await self.event().wait()
            self.finished.append("first")
            return "first"

        @tool("probe.second", timeout_ms=5_000)
        async def second() -> str:
            """Finish at once."""
            self.finished.append("second")
            self.event().set()
            return "second"

        return [first, second]


@pytest.fixture
def rendezvous() -> Rendezvous:
    return Rendezvous()


@pytest.fixture
def kernel(tmp_path: Path, rendezvous: Rendezvous) -> Iterator[Kernel]:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('hello')\n")
    (root / "README.md").write_text("# app\n")
    with make_kernel(root, EDITING) as kernel:
        for probe in rendezvous.tools():
            kernel.register(probe)
        yield kernel


def handle(loop: AgentLoop, response: Any) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        with anyio.fail_after(20):
            return await loop.handle(response)

    return anyio.run(go)


def projection(content: str) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(content)
    return decoded


def test_chat_tool_calls_become_tool_messages_in_the_models_order(kernel):
    loop = AgentLoop(kernel, kernel.start_run(), "openai-chat")
    TypeAdapter(list[ChatCompletionToolParam]).validate_python(loop.tools())

    messages = handle(
        loop,
        chat(
            ("call_1", "file__read", '{"path": "src/app.py"}'),
            ("call_2", "repo__search", '{"query": "hello"}'),
            ("call_3", "file__patch", '{"path": "README.md", "edits": []}'),
        ),
    )

    TypeAdapter(list[ChatCompletionToolMessageParam]).validate_python(messages)
    assert [m["tool_call_id"] for m in messages] == ["call_1", "call_2", "call_3"]
    results = [projection(m["content"]) for m in messages]
    assert [r["status"] for r in results] == [
        Status.SUCCEEDED,
        Status.SUCCEEDED,
        Status.DENIED,
    ]
    assert results[0]["structuredOutput"]["content"] == "print('hello')\n"
    assert results[2]["errorCode"] == ErrorCode.WRITE_SCOPE_DENIED


def test_parallel_reads_overlap_and_keep_the_models_order(kernel, rendezvous):
    loop = AgentLoop(kernel, kernel.start_run(), "openai-chat")
    loop.tools()

    messages = loop.handle_sync(
        chat(("call_a", "probe__first", "{}"), ("call_b", "probe__second", "{}"))
    )

    assert rendezvous.finished == ["second", "first"]  # they really ran together
    assert [m["tool_call_id"] for m in messages] == ["call_a", "call_b"]
    assert [projection(m["content"])["structuredOutput"] for m in messages] == [
        "first",
        "second",
    ]


@pytest.mark.parametrize(
    ("arguments", "code"),
    [
        ('{"path": "src/app.py"', ErrorCode.ARGUMENTS_NOT_JSON),
        ("[1, 2]", ErrorCode.ARGUMENTS_NOT_OBJECT),
        ('{"path": "a", "path": "b"}', ErrorCode.DUPLICATE_KEY),
        ('{"path": "src/app.py", "n": NaN}', ErrorCode.NON_FINITE_NUMBER),
        ('{"path": "../../etc/passwd"}', ErrorCode.PATH_TRAVERSAL),
    ],
)
def test_malformed_arguments_come_back_as_invalid_arguments_messages(kernel, arguments, code):
    loop = AgentLoop(kernel, kernel.start_run(), "openai-chat")
    loop.tools()

    messages = loop.handle_sync(chat(("call_x", "file__read", arguments)))

    TypeAdapter(list[ChatCompletionToolMessageParam]).validate_python(messages)
    result = projection(messages[0]["content"])
    assert (result["status"], result["errorCode"]) == (Status.INVALID_ARGUMENTS, code)


def test_responses_function_calls_become_function_call_outputs(kernel):
    loop = AgentLoop(kernel, kernel.start_run(), "openai-responses")
    TypeAdapter(list[FunctionToolParam]).validate_python(loop.tools())

    items = handle(
        loop,
        responses(
            ("call_1", "repo__search", '{"query": "print"}'),
            ("call_2", "file__read", '{"path": "src/app.py", "startLine": 0}'),
        ),
    )

    TypeAdapter(list[FunctionCallOutput]).validate_python(items)
    assert [item["call_id"] for item in items] == ["call_1", "call_2"]
    results = [projection(item["output"]) for item in items]
    assert results[0]["status"] == Status.SUCCEEDED
    assert results[1]["errorCode"] == ErrorCode.OUT_OF_BOUNDS


def test_anthropic_tool_uses_become_one_user_message_of_tool_results(kernel):
    loop = AgentLoop(kernel, kernel.start_run(), "anthropic")
    TypeAdapter(list[ToolParam]).validate_python(loop.tools())

    messages = handle(
        loop,
        anthropic(
            ("toolu_1", "file__read", {"path": "src/app.py"}),
            ("toolu_2", "file__read", {"path": ".env"}),
            ("toolu_3", "web__fetch", {"url": "https://example.com"}),
        ),
    )

    TypeAdapter(list[MessageParam]).validate_python(messages)
    assert len(messages) == 1
    assert messages[0]["role"] == "user"
    blocks = messages[0]["content"]
    assert [b["tool_use_id"] for b in blocks] == ["toolu_1", "toolu_2", "toolu_3"]
    assert [b["is_error"] for b in blocks] == [False, True, True]
    assert [projection(b["content"])["errorCode"] for b in blocks] == [
        None,
        ErrorCode.FORBIDDEN_PATH,
        ErrorCode.UNKNOWN_TOOL,
    ]


@pytest.mark.parametrize(
    ("provider", "response"),
    [("openai-chat", chat()), ("openai-responses", responses()), ("anthropic", anthropic())],
)
def test_a_response_without_tool_calls_gives_nothing_to_append(kernel, provider, response):
    loop = AgentLoop(kernel, kernel.start_run(), provider)
    loop.tools()

    assert loop.handle_sync(response) == []


def test_a_tool_that_exists_but_is_not_shown_reads_back_as_not_exposed(tmp_path):
    with make_kernel(tmp_path / "ws") as kernel:  # default policy: read-only tools
        loop = AgentLoop(kernel, kernel.start_run(), "openai-chat")
        shown = {t["function"]["name"] for t in loop.tools()}
        assert "shell__run" not in shown

        messages = loop.handle_sync(chat(("call_1", "shell__run", '{"argv": ["ls"]}')))

    assert projection(messages[0]["content"])["errorCode"] == ErrorCode.TOOL_NOT_EXPOSED


@pytest.mark.parametrize(
    ("provider", "response"),
    [
        ("openai-chat", chat(("c1", "file__reed", "{}"), ("c2", "file__read", "{}"))),
        ("anthropic", anthropic(("c1", "file__reed", {}), ("c2", "file__read", {}))),
    ],
)
def test_messages_name_tools_as_the_model_was_shown_them(kernel, provider, response):
    """A model told "no tool file.read" or "available: repo.search, …" is pointed at
    names it was never given; it sees the names in its tools list."""
    loop = AgentLoop(kernel, kernel.start_run(), provider)
    shown = {t.get("name") or t["function"]["name"] for t in loop.tools()}

    messages = loop.handle_sync(response)

    contents = (
        [m["content"] for m in messages]
        if provider == "openai-chat"
        else [b["content"] for b in messages[0]["content"]]
    )
    unknown, invalid = (projection(c)["safeMessage"] for c in contents)
    assert unknown.startswith("There is no tool named 'file__reed'. Available tools: ")
    listed = unknown.removeprefix("There is no tool named 'file__reed'. Available tools: ")
    assert set(listed.rstrip(".").split(", ")) == shown
    assert "file__read" in invalid
    assert "file.read" not in invalid


def test_handle_works_before_tools_were_rendered(kernel):
    loop = AgentLoop(kernel, kernel.start_run(), "anthropic")

    messages = loop.handle_sync(anthropic(("toolu_1", "file__read", {"path": "src/app.py"})))

    assert messages[0]["content"][0]["is_error"] is False


def test_tools_records_what_the_model_was_shown(kernel):
    run = kernel.start_run()
    loop = AgentLoop(kernel, run, "openai-responses")

    shown = {t["name"] for t in loop.tools()}

    events = [e for e in kernel.ledger.events(run.id) if e.type is EventType.TOOLS_EXPOSED]
    assert len(events) == 1
    recorded = {t["name"].replace(".", "__") for t in events[0].payload["tools"]}
    assert recorded == shown


def test_execute_returns_the_results_for_callers_that_want_them(kernel):
    loop = AgentLoop(kernel, kernel.start_run(), "openai-chat")

    async def go() -> list[Any]:
        with anyio.fail_after(20):
            return await loop.execute(chat(("call_1", "file__read", '{"path": "src/app.py"}')))

    results = anyio.run(go)

    assert [r.status for r in results] == [Status.SUCCEEDED]
    assert loop.render(results)[0]["tool_call_id"] == "call_1"


def test_a_response_of_another_provider_is_a_format_error(kernel):
    loop = AgentLoop(kernel, kernel.start_run(), "openai-chat")

    with pytest.raises(ProviderFormatError):
        loop.handle_sync(anthropic(("toolu_1", "file__read", {"path": "src/app.py"})))


def test_an_unknown_provider_is_a_usage_error(kernel):
    with pytest.raises(UsageError):
        AgentLoop(kernel, kernel.start_run(), "gemini")  # type: ignore[arg-type]


@pytest.mark.parametrize("provider", ["openai-chat", "anthropic"])
def test_results_answer_the_ids_the_model_sent_even_those_the_ledger_rewrites(kernel, provider):
    """An empty id (some OpenAI-compatible servers send one) gets an id of the ledger's
    own, NUL and lone surrogates are stored escaped; the provider still expects every
    call answered under the id it sent."""
    ids = ["", "call\x00A", "call\ud800B"]
    loop = AgentLoop(kernel, kernel.start_run(), provider)
    loop.tools()
    if provider == "openai-chat":
        messages = handle(loop, chat(*((i, "file__read", '{"path": "README.md"}') for i in ids)))
        answered = [m["tool_call_id"] for m in messages]
        statuses = [projection(m["content"])["status"] for m in messages]
    else:
        (message,) = handle(
            loop, anthropic(*((i, "file__read", {"path": "README.md"}) for i in ids))
        )
        answered = [block["tool_use_id"] for block in message["content"]]
        statuses = [projection(block["content"])["status"] for block in message["content"]]
    assert answered == ids
    assert statuses == [Status.SUCCEEDED] * 3
    stored = [
        e.tool_call_id
        for e in kernel.ledger.events(loop.run.id)
        if e.type is EventType.TOOL_CALL_REQUEST
    ]
    assert stored[0].startswith("call_")
    assert stored[1:] == ["call\\x00A", "call\\ud800B"]


def test_handle_sync_inside_a_running_event_loop_says_to_await_handle(kernel):
    loop = AgentLoop(kernel, kernel.start_run(), "openai-chat")
    loop.tools()
    response = chat(("call_a", "probe__first", "{}"))

    async def inside() -> None:
        with pytest.raises(UsageError, match=r"await loop\.handle\("):
            loop.handle_sync(response)

    anyio.run(inside)

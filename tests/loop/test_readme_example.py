"""The agent-loop example of docs/agent-loop.md, run as written.

The page's code blocks are executed against the official ``openai`` and ``anthropic``
clients whose HTTP transport is an ``httpx2.MockTransport`` (httpx2 is the SDKs' HTTP
library) serving scripted responses.
Every request the example sends is checked against the SDK's own parameter types, so
the example is correct code even though no test can call the real APIs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from anthropic import AsyncAnthropic
from anthropic.types import MessageParam, ToolParam
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
from openai.types.responses import FunctionToolParam, ResponseInputParam
from pydantic import TypeAdapter

from sdk_responses import anthropic_document, chat_document, responses_document
from toolkernel.kernel import Kernel
from toolkernel.testing import make_kernel

PAGE = Path(__file__).resolve().parents[2] / "docs" / "agent-loop.md"
TASK = "Find where mean() is defined."


def example() -> dict[str, Any]:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL)
    namespace: dict[str, Any] = {"__name__": "agent_loop_example"}
    exec(compile("\n".join(blocks), str(PAGE), "exec"), namespace)
    return namespace


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "stats.py").write_text(
        "def mean(values):\n    return sum(values) / len(values)\n"
    )
    with make_kernel(root) as kernel:
        yield kernel


class Script:
    """Serves scripted responses in order and keeps the JSON bodies it was sent."""

    def __init__(self, responses: list[dict[str, Any]]) -> None:
        self.responses = responses
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(json.loads(request.content))
        if len(self.requests) > len(self.responses):
            return httpx2.Response(500, json={"error": {"message": "script exhausted"}})
        return httpx2.Response(200, json=self.responses[len(self.requests) - 1])


def openai_client(script: Script) -> OpenAI:
    return OpenAI(
        api_key="sk-test",
        base_url="https://api.openai.test/v1",
        http_client=httpx2.Client(transport=httpx2.MockTransport(script)),
        max_retries=0,
    )


def run_bounded(function: Callable[..., Any], *args: Any) -> Any:
    async def go() -> Any:
        with anyio.fail_after(20):
            return await anyio.to_thread.run_sync(lambda: function(*args))

    return anyio.run(go)


def test_the_chat_completions_example_sends_valid_messages_and_returns_the_answer(kernel):
    script = Script(
        [
            chat_document(
                ("call_a", "repo__search", '{"query": "def mean"}'),
                ("call_b", "file__read", '{"path": "src/stats.py"}'),
            ),
            chat_document(("call_c", "file__read", '{"path": "src/stats.py", "endLine": ')),
            chat_document(content="mean() is in src/stats.py."),
        ]
    )
    answer = run_bounded(example()["run_task_chat"], openai_client(script), kernel, TASK)

    assert answer == "mean() is in src/stats.py."
    assert len(script.requests) == 3
    TypeAdapter(list[ChatCompletionToolParam]).validate_python(script.requests[0]["tools"])
    for body in script.requests:
        TypeAdapter(list[ChatCompletionMessageParam]).validate_python(body["messages"])
    last = script.requests[-1]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "tool", "tool", "assistant", "tool"]
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == [
        "call_a",
        "call_b",
        "call_c",
    ]
    projections = [json.loads(m["content"]) for m in last if m["role"] == "tool"]
    assert [p["status"] for p in projections] == ["SUCCEEDED", "SUCCEEDED", "INVALID_ARGUMENTS"]
    assert projections[2]["errorCode"] == "ARGUMENTS_NOT_JSON"


def test_the_responses_example_sends_valid_input_items_and_returns_the_answer(kernel):
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_a",
        "name": "file__read",
        "arguments": '{"path": "src/stats.py"}',
        "status": "completed",
    }
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    answer_item = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "It is in src/stats.py.", "annotations": []}],
    }
    script = Script([responses_document(reasoning, call), responses_document(answer_item)])

    answer = run_bounded(example()["run_task_responses"], openai_client(script), kernel, TASK)

    assert answer == "It is in src/stats.py."
    TypeAdapter(list[FunctionToolParam]).validate_python(script.requests[0]["tools"])
    items = script.requests[1]["input"]
    TypeAdapter(ResponseInputParam).validate_python(items)
    assert [item.get("type") for item in items[1:]] == [
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert items[3]["call_id"] == "call_a"
    assert json.loads(items[3]["output"])["status"] == "SUCCEEDED"


def test_the_async_anthropic_example_sends_valid_messages_and_returns_the_answer(kernel):
    script = Script(
        [
            anthropic_document(
                {"type": "text", "text": "Looking."},
                {
                    "type": "tool_use",
                    "id": "toolu_a",
                    "name": "repo__search",
                    "input": {"query": "mean"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_b",
                    "name": "shell__run",
                    "input": {"argv": ["ls"]},
                },
            ),
            anthropic_document({"type": "text", "text": "Found it."}),
        ]
    )
    client = AsyncAnthropic(
        api_key="test",
        base_url="https://api.anthropic.test",
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(script)),
        max_retries=0,
    )

    async def go() -> str:
        with anyio.fail_after(20):
            result: str = await example()["run_task_anthropic"](client, kernel, TASK)
            return result

    assert anyio.run(go) == "Found it."
    TypeAdapter(list[ToolParam]).validate_python(script.requests[0]["tools"])
    messages = script.requests[1]["messages"]
    TypeAdapter(list[MessageParam]).validate_python(messages)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    blocks = messages[2]["content"]
    assert [b["tool_use_id"] for b in blocks] == ["toolu_a", "toolu_b"]
    # The default policy shows read-only tools only: shell.run reads back, and is refused.
    assert [b["is_error"] for b in blocks] == [False, True]
    assert json.loads(blocks[1]["content"])["errorCode"] == "TOOL_NOT_EXPOSED"


def test_the_example_runs_nothing_when_imported():
    namespace = example()

    assert {"run_task_chat", "run_task_responses", "run_task_anthropic"} <= namespace.keys()

"""Provider responses built from the official SDKs' own types, as the tests' models
"answer": one tool call per ``(id, name, arguments)``. The ``*_document`` forms are
the JSON the API sends (checked against the SDK's type), for tests that serve it."""

from __future__ import annotations

from typing import Any

from anthropic.types import Message
from openai.types.chat import ChatCompletion
from openai.types.responses import Response


def chat_document(*calls: tuple[str, str, str], content: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ]
    document = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1767225600,
        "model": "gpt-4.1",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
            }
        ],
    }
    ChatCompletion.model_validate(document)
    return document


def chat(*calls: tuple[str, str, str]) -> ChatCompletion:
    return ChatCompletion.model_validate(chat_document(*calls))


def responses_document(*items: dict[str, Any]) -> dict[str, Any]:
    document = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1767225600,
        "model": "gpt-5",
        "output": list(items),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    Response.model_validate(document)
    return document


def responses(*calls: tuple[str, str, str]) -> Response:
    items = (
        {"type": "function_call", "call_id": i, "name": n, "arguments": a} for i, n, a in calls
    )
    return Response.model_validate(responses_document(*items))


def anthropic_document(*content: dict[str, Any]) -> dict[str, Any]:
    stop = "tool_use" if any(block["type"] == "tool_use" for block in content) else "end_turn"
    document = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-6",
        "content": list(content),
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 10},
    }
    Message.model_validate(document)
    return document


def anthropic(*calls: tuple[str, str, dict[str, Any]]) -> Message:
    text = {"type": "text", "text": "Working on it."}
    uses = ({"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in calls)
    return Message.model_validate(anthropic_document(text, *uses))

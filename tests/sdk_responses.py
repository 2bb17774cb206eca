"""Provider responses built from the official SDKs' own types, as the tests' models
"answer": one tool call per ``(id, name, arguments)``."""

from __future__ import annotations

from typing import Any

from anthropic.types import Message
from openai.types.chat import ChatCompletion
from openai.types.responses import Response


def chat(*calls: tuple[str, str, str]) -> ChatCompletion:
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ]
    return ChatCompletion.model_validate(
        {
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
    )


def responses(*calls: tuple[str, str, str]) -> Response:
    return Response.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 1767225600,
            "model": "gpt-5",
            "output": [
                {"type": "function_call", "call_id": i, "name": n, "arguments": a}
                for i, n, a in calls
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
    )


def anthropic(*calls: tuple[str, str, dict[str, Any]]) -> Message:
    return Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-6",
            "content": [
                {"type": "text", "text": "Working on it."},
                *({"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in calls),
            ],
            "stop_reason": "tool_use" if calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 10},
        }
    )

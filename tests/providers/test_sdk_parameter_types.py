"""What the renderers return type-checks as the provider SDKs' own parameters: an
embedder running ``mypy --strict`` passes them to ``create(...)`` without a cast."""

from __future__ import annotations

from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

EMBEDDER = """
from anthropic import Anthropic
from anthropic.types import MessageParam
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

from toolkernel.calls import ToolCallResult
from toolkernel.definition import ToolDefinition
from toolkernel.providers.anthropic import render_anthropic_results, render_anthropic_tools
from toolkernel.providers.openai import (
    render_openai_chat_results,
    render_openai_chat_tools,
    render_openai_responses_results,
    render_openai_responses_tools,
)


def turn(definitions: list[ToolDefinition], results: list[ToolCallResult]) -> None:
    openai = OpenAI()
    messages: list[ChatCompletionMessageParam] = []
    messages.extend(render_openai_chat_results(results))
    openai.chat.completions.create(
        model="m", messages=messages, tools=render_openai_chat_tools(definitions)
    )
    openai.responses.create(
        model="m",
        input=render_openai_responses_results(results),
        tools=render_openai_responses_tools(definitions),
    )
    history: list[MessageParam] = [render_anthropic_results(results)]
    Anthropic().messages.create(
        model="m", max_tokens=1, messages=history, tools=render_anthropic_tools(definitions)
    )
"""


def test_rendered_tools_and_results_are_the_sdks_parameter_types(tmp_path: Path) -> None:
    pytest.importorskip("openai")
    pytest.importorskip("anthropic")
    embedder = tmp_path / "embedder.py"
    embedder.write_text(EMBEDDER, encoding="utf-8")
    out, err, status = mypy_api.run(["--strict", "--no-error-summary", str(embedder)])
    assert status == 0, out + err
    assert out == ""

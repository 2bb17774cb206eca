"""The agent-loop helper: a provider response in, the messages to append out.

::

    loop = AgentLoop(kernel, run, "openai-chat")
    tools = loop.tools()                                   # records TOOLS_EXPOSED
    while True:
        completion = client.chat.completions.create(..., messages=messages, tools=tools)
        messages.append(completion.choices[0].message)     # the model's own turn: yours
        results = loop.handle_sync(completion)             # or: await loop.handle(...)
        if not results:
            break                                          # no tool calls: done
        messages.extend(results)

``handle`` returns only what the runtime produces: the tool results, in the model's
order, shaped for the provider (OpenAI Chat: one ``role: "tool"`` message per call;
Responses: one ``function_call_output`` item per call; Anthropic: one ``user`` message
holding every ``tool_result`` block). The model's own turn is appended by the caller
exactly as each SDK documents it (``choices[0].message``, ``response.output``,
``{"role": "assistant", "content": message.content}``): re-serializing it here could
drop what the provider needs back, such as reasoning items or thinking signatures.
An empty list means the response proposed no tool call.

The calls of one response are one model turn: ``Kernel.call_many`` runs consecutive
read-only calls in parallel and every other call alone, and keeps the model's order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Final, Literal, Protocol, get_args

import anyio

from toolkernel.arguments import DEFAULT_MAX_BYTES
from toolkernel.calls import ToolCallResult
from toolkernel.definition import ToolDefinition
from toolkernel.errors import UsageError
from toolkernel.kernel import Kernel, ProgressListener, outside_event_loop
from toolkernel.providers import (
    NameMap,
    parse_anthropic,
    parse_openai_chat,
    parse_openai_responses,
    provider_name,
    render_anthropic_results,
    render_anthropic_tools,
    render_openai_chat_results,
    render_openai_chat_tools,
    render_openai_responses_results,
    render_openai_responses_tools,
)
from toolkernel.providers.names import answering
from toolkernel.run import Run, ToolCall
from toolkernel.tracing import current_traceparent

__all__ = ["FORMATS", "AgentLoop", "Provider", "ProviderFormat", "tool_names"]

Provider = Literal["openai-chat", "openai-responses", "anthropic"]
"""The provider API a loop speaks: OpenAI Chat Completions, OpenAI Responses, Anthropic."""


class CallParser(Protocol):
    """Reads a provider response's tool calls (``parse_openai_chat`` and the others).

    ``max_argument_bytes`` is the kernel's cap on one call's arguments, within which a
    parser may read them (the OpenAI parsers do, to drop strict mode's nulls).
    """

    def __call__(
        self, response: Any, names: NameMap, /, *, max_argument_bytes: int = ...
    ) -> list[ToolCall]: ...


class ResultRenderer(Protocol):
    """Writes results as the provider's messages (``render_openai_chat_results`` and
    the others); with ``names``, tools are named as the model was shown them."""

    def __call__(
        self, results: Sequence[ToolCallResult], /, *, names: NameMap | None = ...
    ) -> Sequence[Mapping[str, Any]]: ...


@dataclass(frozen=True, slots=True)
class ProviderFormat:
    """One provider API's three translations."""

    # The renderers return the SDK's parameter types (TypedDicts); a loop, for any of
    # the providers, hands them on as plain dicts.
    render_tools: Callable[[Sequence[ToolDefinition]], Sequence[Mapping[str, Any]]]
    parse: CallParser
    render_results: ResultRenderer


def _anthropic_calls(
    message: Any, names: NameMap, *, max_argument_bytes: int = DEFAULT_MAX_BYTES
) -> list[ToolCall]:
    # Anthropic's input arrives decoded and its tools are not strict: nothing to read.
    return parse_anthropic(message, names)


def _anthropic_results(
    results: Sequence[ToolCallResult], /, *, names: NameMap | None = None
) -> Sequence[Mapping[str, Any]]:
    # Every tool_result of a turn goes in the one user message that follows it.
    return [render_anthropic_results(results, names=names)] if results else []


FORMATS: Final[Mapping[Provider, ProviderFormat]] = MappingProxyType(
    {
        "openai-chat": ProviderFormat(
            render_openai_chat_tools, parse_openai_chat, render_openai_chat_results
        ),
        "openai-responses": ProviderFormat(
            render_openai_responses_tools, parse_openai_responses, render_openai_responses_results
        ),
        "anthropic": ProviderFormat(render_anthropic_tools, _anthropic_calls, _anthropic_results),
    }
)


def tool_names(kernel: Kernel, shown: Sequence[ToolDefinition]) -> NameMap:
    """The name map for reading a model's calls back.

    The tools the model was shown are mapped first (two of them sharing a provider name
    is an error). Every other registered tool is mapped too where its provider name is
    free, so a call to a tool that exists but was not shown reads back as that tool and
    the kernel refuses it as TOOL_NOT_EXPOSED rather than UNKNOWN_TOOL.

    Raises:
        ProviderNameError: two shown tools map to the same provider name.
    """
    names = NameMap.build(shown)
    to_provider, to_tool = dict(names.to_provider), dict(names.to_tool)
    schemas = dict(names.schemas)
    for registered in kernel.registry.latest():
        name, mapped = registered.name, provider_name(registered.name)
        if name not in to_provider and mapped not in to_tool:
            to_provider[name], to_tool[mapped] = mapped, name
            schemas[name] = registered.definition.input_schema
    return NameMap(
        MappingProxyType(to_provider), MappingProxyType(to_tool), MappingProxyType(schemas)
    )


class AgentLoop:
    """Runs the tool calls of provider responses through a kernel, for one run.

    Args:
        kernel: the kernel that executes the calls.
        run: the run they belong to (``kernel.start_run()``).
        provider: which API the responses come from and the results go to.
        on_progress: called as long-running tools report progress.

    Raises:
        UsageError: ``provider`` is not one of ``Provider``.
    """

    def __init__(
        self,
        kernel: Kernel,
        run: Run,
        provider: Provider,
        *,
        on_progress: ProgressListener | None = None,
    ) -> None:
        if provider not in FORMATS:
            raise UsageError(f"provider must be one of {', '.join(get_args(Provider))}")
        self.kernel = kernel
        self.run = run
        self.provider = provider
        self.on_progress = on_progress
        self._format = FORMATS[provider]
        self._names: NameMap | None = None

    def tools(self) -> list[dict[str, Any]]:
        """The ``tools`` request parameter: the run's tools, shown to the model now.

        Each call records TOOLS_EXPOSED in the ledger (``Kernel.expose``); call it again
        when the run's state changes so the model sees the tools it may use now.

        Raises:
            ProviderNameError: two exposed tools map to the same provider name.
        """
        shown = self.kernel.expose(self.run)
        self._names = tool_names(self.kernel, shown)
        return [dict(tool) for tool in self._format.render_tools(shown)]

    def calls(self, response: Any) -> list[ToolCall]:
        """The tool calls ``response`` proposes, in the model's order, provider ids kept.

        Calls carry the current OpenTelemetry trace context when there is one, so the
        ledger records it and the kernel's spans continue the caller's trace.

        Raises:
            ProviderFormatError: ``response`` is not this provider's shape at all.
        """
        if self._names is None:
            self._names = tool_names(self.kernel, self.kernel.list_available(self.run.context))
        calls = self._format.parse(
            response, self._names, max_argument_bytes=self.kernel.config.max_argument_bytes
        )
        traceparent = current_traceparent()
        if traceparent is None:
            return calls
        return [c if c.trace_context else replace(c, trace_context=traceparent) for c in calls]

    async def execute(self, response: Any) -> list[ToolCallResult]:
        """Run the calls of ``response`` as one model turn; results in the model's order,
        each under the id the model gave its call (the ledger may keep another).

        A malformed, unknown or forbidden call becomes a result, never an exception.

        Raises:
            ProviderFormatError: ``response`` is not this provider's shape at all.
        """
        calls = self.calls(response)
        if not calls:
            return []
        results = await self.kernel.call_many(self.run, calls, on_progress=self.on_progress)
        return list(answering(calls, results))

    def render(self, results: Sequence[ToolCallResult]) -> list[dict[str, Any]]:
        """The messages that carry ``results`` back to the model (their projections,
        tools named as the model was shown them)."""
        return [
            dict(message) for message in self._format.render_results(results, names=self._names)
        ]

    async def handle(self, response: Any) -> list[dict[str, Any]]:
        """Execute the calls of ``response``; return the messages to append after it.

        Args:
            response: the provider's response: an SDK object (``ChatCompletion``,
                ``Response``, ``Message``), its ``model_dump()``, or its JSON text.

        Returns:
            The tool-result messages, in the model's order; empty when the response
            proposed no tool call (the model is done).

        Raises:
            ProviderFormatError: ``response`` is not this provider's shape at all.
        """
        return self.render(await self.execute(response))

    def handle_sync(self, response: Any) -> list[dict[str, Any]]:
        """``handle`` for synchronous programs; starts an event loop for the turn.

        Call it from plain (non-async) code only; async code awaits ``handle``.

        Raises:
            ProviderFormatError: ``response`` is not this provider's shape at all.
            UsageError: called where an event loop runs.
        """
        outside_event_loop("handle_sync", "await loop.handle(...)")
        return anyio.run(self.handle, response)

"""OpenAI: tools for Chat Completions and the Responses API, their calls, their results.

::

    names = NameMap.build(definitions)
    tools = render_openai_chat_tools(definitions)          # → tools=[...]
    calls = parse_openai_chat(completion, names)            # → kernel.call_many(run, calls)
    messages = render_openai_chat_results(results)          # → append to the conversation

Tools are sent in strict mode where their schema allows it (see
``toolkernel.providers.schemas``), with ``strict: false`` and the real schema where it
does not. Parsing keeps the model's order and call ids and never judges the arguments:
the kernel parses and bounds them, so malformed ones come back as INVALID_ARGUMENTS
results with a specific code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from toolkernel.arguments import ArgumentsRejected, parse_arguments
from toolkernel.calls import ToolCallResult
from toolkernel.definition import ToolDefinition
from toolkernel.providers.names import (
    NameMap,
    ProviderFormatError,
    as_json_text,
    is_record,
    load_document,
    projection_json,
    read_field,
)
from toolkernel.providers.schemas import (
    StrictSchemaError,
    openai_strict_schema,
    strip_strict_nulls,
)
from toolkernel.run import ToolCall

__all__ = [
    "parse_openai_chat",
    "parse_openai_responses",
    "render_openai_chat_results",
    "render_openai_chat_tools",
    "render_openai_responses_results",
    "render_openai_responses_tools",
]

RawArguments = str | bytes | Mapping[str, Any] | None


def render_openai_chat_tools(definitions: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    """The ``tools`` parameter of ``client.chat.completions.create``.

    Args:
        definitions: the tool set the model may see (``Kernel.expose(run)``).

    Returns:
        One ``{"type": "function", "function": {...}}`` entry per definition.

    Raises:
        ProviderNameError: two tools map to the same provider name.
    """
    return [{"type": "function", "function": fn} for fn in _functions(definitions)]


def render_openai_responses_tools(
    definitions: Sequence[ToolDefinition],
) -> list[dict[str, Any]]:
    """The ``tools`` parameter of ``client.responses.create``.

    Args:
        definitions: the tool set the model may see (``Kernel.expose(run)``).

    Returns:
        One ``{"type": "function", "name": ..., ...}`` entry per definition.

    Raises:
        ProviderNameError: two tools map to the same provider name.
    """
    return [{"type": "function", **fn} for fn in _functions(definitions)]


def parse_openai_chat(response: Any, names: NameMap) -> list[ToolCall]:
    """The tool calls a Chat Completions response proposes, in the model's order.

    Only the first choice is read (agents ask for one).

    Args:
        response: a ``ChatCompletion``, its ``model_dump()``, or its JSON text.
        names: the map the tools were rendered with.

    Returns:
        One ToolCall per entry of ``choices[0].message.tool_calls``, its ``id`` kept.

    Raises:
        ProviderFormatError: the response has no ``choices`` list, or its first
            choice has no message, or ``tool_calls`` is not a list.
    """
    document = load_document(response, "OpenAI chat completion")
    choices = read_field(document, "choices")
    if not isinstance(choices, list | tuple):
        raise ProviderFormatError("OpenAI chat completion: no 'choices' list")
    if not choices:
        return []
    message = read_field(choices[0], "message")
    if not is_record(message):
        raise ProviderFormatError("OpenAI chat completion: choices[0] has no message")
    entries = read_field(message, "tool_calls")
    if entries is None:
        return []
    if not isinstance(entries, list | tuple):
        raise ProviderFormatError("OpenAI chat completion: 'tool_calls' is not a list")
    return [_chat_call(entry, names) for entry in entries]


def parse_openai_responses(response: Any, names: NameMap) -> list[ToolCall]:
    """The ``function_call`` items of a Responses API response, in the model's order.

    Args:
        response: a ``Response``, its ``model_dump()``, or its JSON text.
        names: the map the tools were rendered with.

    Returns:
        One ToolCall per ``function_call`` item, its ``call_id`` kept as the id.

    Raises:
        ProviderFormatError: the response has no ``output`` list.
    """
    document = load_document(response, "OpenAI response")
    output = read_field(document, "output")
    if not isinstance(output, list | tuple):
        raise ProviderFormatError("OpenAI response: no 'output' list")
    return [
        _call(names, *(read_field(item, key) for key in ("name", "arguments", "call_id")))
        for item in output
        if read_field(item, "type") == "function_call"
    ]


def render_openai_chat_results(results: Sequence[ToolCallResult]) -> list[dict[str, Any]]:
    """One ``role: "tool"`` message per result, in order, carrying its projection."""
    return [
        {"role": "tool", "tool_call_id": r.tool_call_id, "content": projection_json(r)}
        for r in results
    ]


def render_openai_responses_results(
    results: Sequence[ToolCallResult],
) -> list[dict[str, Any]]:
    """One ``function_call_output`` input item per result, in order."""
    return [
        {"type": "function_call_output", "call_id": r.tool_call_id, "output": projection_json(r)}
        for r in results
    ]


def _functions(definitions: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    names = NameMap.build(definitions)
    functions = []
    for definition in definitions:
        try:
            parameters, strict = openai_strict_schema(definition.input_schema), True
        except StrictSchemaError:
            # The kernel validates against the real schema either way; strict mode only
            # shapes decoding, so a tool it cannot express is still offered, unconstrained.
            parameters, strict = json.loads(json.dumps(definition.input_schema)), False
        functions.append(
            {
                "name": names.provider_name(definition.name),
                "description": definition.description,
                "parameters": parameters,
                "strict": strict,
            }
        )
    return functions


def _chat_call(entry: Any, names: NameMap) -> ToolCall:
    function = read_field(entry, "function")
    if is_record(function):
        name, raw = read_field(function, "name"), read_field(function, "arguments")
    else:
        # A custom tool's call carries free text; the kernel refuses it as not JSON.
        custom = read_field(entry, "custom")
        name, raw = read_field(custom, "name"), read_field(custom, "input")
    return _call(names, name, raw, read_field(entry, "id"))


def _call(names: NameMap, name: Any, raw: Any, call_id: Any) -> ToolCall:
    tool = names.tool_name(name) if isinstance(name, str) else ""
    return ToolCall(
        tool,
        _arguments(raw, names.schemas.get(tool)),
        # Kept as sent, empty too: the result must answer the id the model used.
        tool_call_id=call_id if isinstance(call_id, str) else None,
    )


def _arguments(raw: Any, schema: Mapping[str, Any] | None) -> RawArguments:
    """The arguments as the kernel should see them.

    Text passes through unless it decodes to an object holding strict mode's "left
    out" nulls; those are dropped (``strip_strict_nulls``). An object passes through
    (some OpenAI-compatible servers send arguments decoded); anything else becomes
    JSON text that the kernel refuses with a specific code.
    """
    if isinstance(raw, bytearray):
        raw = bytes(raw)
    if not (raw is None or isinstance(raw, str | bytes | Mapping)):
        return as_json_text(raw)
    if schema is None:
        return raw
    # Parsed here with the default bounds only to find those nulls; anything rejected
    # (or larger than the default cap) goes to the kernel untouched, which applies its
    # own configured bounds before parsing.
    parsed = parse_arguments(raw)
    if isinstance(parsed, ArgumentsRejected):
        return raw
    stripped = strip_strict_nulls(schema, parsed.value)
    return raw if stripped == parsed.value else stripped

"""OpenAI: tools for Chat Completions and the Responses API, their calls, their results.

::

    names = NameMap.build(definitions)
    tools = render_openai_chat_tools(definitions)          # → tools=[...]
    calls = parse_openai_chat(completion, names, max_argument_bytes=config.max_argument_bytes)
    results = await kernel.call_many(run, calls)
    messages = render_openai_chat_results(results, calls=calls)   # → append to the conversation

``config`` is the kernel's (``kernel.config``): arguments within its size cap are read
for strict mode's "left out" nulls, and ``calls=`` answers every call under the id the
model sent, which the kernel may have replaced in its own records.

Tools are sent in strict mode where their schema allows it (see
``toolkernel.providers.schemas``), with ``strict: false`` and the real schema (as a plain
object at the top level) where it does not. Descriptions are cut to the 1,024
characters Chat Completions accepts. Parsing keeps the model's order and call ids and
never judges the arguments: the kernel parses and bounds them, so malformed ones come
back as INVALID_ARGUMENTS results with a specific code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from toolkernel.arguments import DEFAULT_MAX_BYTES, ArgumentsRejected, parse_arguments
from toolkernel.calls import ToolCallResult
from toolkernel.definition import ToolDefinition
from toolkernel.providers.names import (
    NameMap,
    ProviderFormatError,
    answering,
    as_json_text,
    is_record,
    load_document,
    projection_json,
    read_field,
)
from toolkernel.providers.schemas import (
    StrictSchemaError,
    openai_strict_schema,
    plain_object_schema,
    strip_strict_nulls,
)
from toolkernel.run import ToolCall

if TYPE_CHECKING:  # the SDK's own parameter types, for embedders type-checking their calls
    from openai.types.chat import ChatCompletionToolMessageParam, ChatCompletionToolParam
    from openai.types.responses import FunctionToolParam, ResponseInputItemParam

__all__ = [
    "parse_openai_chat",
    "parse_openai_responses",
    "render_openai_chat_results",
    "render_openai_chat_tools",
    "render_openai_responses_results",
    "render_openai_responses_tools",
]

RawArguments = str | bytes | Mapping[str, Any] | None

# Chat Completions refuses the whole request when one function's description is longer
# ("string_above_max_length"). The Responses API does not document a limit either way;
# a description cut for it too costs nothing, a refused request costs the turn.
MAX_DESCRIPTION_CHARS: Final = 1024
_ELLIPSIS: Final = "…"
_TRAILING_WORD: Final = re.compile(r"\s+\S*\Z")


def render_openai_chat_tools(
    definitions: Sequence[ToolDefinition],
) -> list[ChatCompletionToolParam]:
    """The ``tools`` parameter of ``client.chat.completions.create``.

    Args:
        definitions: the tool set the model may see (``Kernel.expose(run)``).

    Returns:
        One ``{"type": "function", "function": {...}}`` entry per definition.

    Raises:
        ProviderNameError: two tools map to the same provider name.
    """
    return [
        {
            "type": "function",
            "function": {
                "name": fn.name,
                "description": fn.description,
                "parameters": fn.parameters,
                "strict": fn.strict,
            },
        }
        for fn in _functions(definitions)
    ]


def render_openai_responses_tools(
    definitions: Sequence[ToolDefinition],
) -> list[FunctionToolParam]:
    """The ``tools`` parameter of ``client.responses.create``.

    Args:
        definitions: the tool set the model may see (``Kernel.expose(run)``).

    Returns:
        One ``{"type": "function", "name": ..., ...}`` entry per definition.

    Raises:
        ProviderNameError: two tools map to the same provider name.
    """
    return [
        {
            "type": "function",
            "name": fn.name,
            "description": fn.description,
            "parameters": fn.parameters,
            "strict": fn.strict,
        }
        for fn in _functions(definitions)
    ]


def parse_openai_chat(
    response: Any, names: NameMap, *, max_argument_bytes: int = DEFAULT_MAX_BYTES
) -> list[ToolCall]:
    """The tool calls a Chat Completions response proposes, in the model's order.

    Only the first choice is read (agents ask for one).

    Args:
        response: a ``ChatCompletion``, its ``model_dump()``, or its JSON text.
        names: the map the tools were rendered with.
        max_argument_bytes: the kernel's ``Config.max_argument_bytes``; arguments up
            to that size are read for the ``null`` values strict mode sends for "left
            out", which are dropped (larger ones go to the kernel as sent).

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
    return [_chat_call(entry, names, max_argument_bytes) for entry in entries]


def parse_openai_responses(
    response: Any, names: NameMap, *, max_argument_bytes: int = DEFAULT_MAX_BYTES
) -> list[ToolCall]:
    """The ``function_call`` items of a Responses API response, in the model's order.

    Args:
        response: a ``Response``, its ``model_dump()``, or its JSON text.
        names: the map the tools were rendered with.
        max_argument_bytes: as for ``parse_openai_chat``.

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
        _function_call(item, names, max_argument_bytes)
        for item in output
        if read_field(item, "type") == "function_call"
    ]


def render_openai_chat_results(
    results: Sequence[ToolCallResult],
    *,
    calls: Sequence[ToolCall] | None = None,
    names: NameMap | None = None,
) -> list[ChatCompletionToolMessageParam]:
    """One ``role: "tool"`` message per result, in order, carrying its projection.

    Args:
        results: the results of one model turn (``Kernel.call_many``).
        calls: the calls they answer, as parsed. Pass them: the kernel records a call
            sent without an id (some OpenAI-compatible servers send ``""``) under an
            id it makes up, and the model must be answered under the id it sent.
        names: the map the tools were rendered with: messages then name tools as
            the model was shown them (``file__read``, not ``file.read``).

    Raises:
        UsageError: ``calls`` and ``results`` differ in number.
    """
    return [
        {"role": "tool", "tool_call_id": r.tool_call_id, "content": projection_json(r, names)}
        for r in answering(calls, results)
    ]


def render_openai_responses_results(
    results: Sequence[ToolCallResult],
    *,
    calls: Sequence[ToolCall] | None = None,
    names: NameMap | None = None,
) -> list[ResponseInputItemParam]:
    """One ``function_call_output`` input item per result, in order (typed as the
    ``input`` list's items, which a list of the one item type would not match).

    ``calls`` and ``names`` as for ``render_openai_chat_results``.

    Raises:
        UsageError: ``calls`` and ``results`` differ in number.
    """
    return [
        {
            "type": "function_call_output",
            "call_id": r.tool_call_id,
            "output": projection_json(r, names),
        }
        for r in answering(calls, results)
    ]


class _Function(NamedTuple):
    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool


def _functions(definitions: Sequence[ToolDefinition]) -> list[_Function]:
    names = NameMap.build(definitions)
    functions = []
    for definition in definitions:
        parameters, strict, note = _parameters(definition.input_schema)
        name = names.provider_name(definition.name)
        description = _description(definition.description, note)
        functions.append(_Function(name, description, parameters, strict))
    return functions


def _parameters(schema: Mapping[str, Any]) -> tuple[dict[str, Any], bool, str]:
    """The ``parameters`` to send, whether they are strict, and a note for the
    description saying what a plain schema had to leave out."""
    try:
        return openai_strict_schema(schema), True, ""
    except StrictSchemaError:
        # The kernel validates against the real schema either way; strict mode only
        # shapes decoding, so a tool it cannot express is still offered, unconstrained.
        parameters, note = plain_object_schema(schema)
        return parameters, False, note


def _description(text: str, note: str) -> str:
    """``text`` and ``note`` in at most MAX_DESCRIPTION_CHARS, ``text`` cut at a word."""
    suffix = f" {note}" if note else ""
    return _shortened(text, MAX_DESCRIPTION_CHARS - len(suffix)) + suffix


def _shortened(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[: limit - len(_ELLIPSIS)]
    if not text[len(cut)].isspace():
        partial = _TRAILING_WORD.search(cut)
        # A description without a space in its second half is cut mid-word instead.
        if partial and partial.start() >= limit // 2:
            cut = cut[: partial.start()]
    return cut.rstrip() + _ELLIPSIS


def _chat_call(entry: Any, names: NameMap, max_argument_bytes: int) -> ToolCall:
    function = read_field(entry, "function")
    if is_record(function):
        name, raw = read_field(function, "name"), read_field(function, "arguments")
    else:
        # A custom tool's call carries free text; the kernel refuses it as not JSON.
        custom = read_field(entry, "custom")
        name, raw = read_field(custom, "name"), read_field(custom, "input")
    return _call(names, name, raw, read_field(entry, "id"), max_argument_bytes)


def _function_call(item: Any, names: NameMap, max_argument_bytes: int) -> ToolCall:
    name, raw, call_id = (read_field(item, key) for key in ("name", "arguments", "call_id"))
    return _call(names, name, raw, call_id, max_argument_bytes)


def _call(names: NameMap, name: Any, raw: Any, call_id: Any, max_argument_bytes: int) -> ToolCall:
    tool = names.tool_name(name) if isinstance(name, str) else ""
    return ToolCall(
        tool,
        _arguments(raw, names.schemas.get(tool), max_argument_bytes),
        # Kept as sent, empty too: the result must answer the id the model used.
        tool_call_id=call_id if isinstance(call_id, str) else None,
    )


def _arguments(raw: Any, schema: Mapping[str, Any] | None, max_bytes: int) -> RawArguments:
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
    # Parsed here, within the kernel's size cap, only to find those nulls; anything
    # rejected goes to the kernel untouched, which applies its own bounds and says why.
    parsed = parse_arguments(raw, max_bytes=max_bytes)
    if isinstance(parsed, ArgumentsRejected):
        return raw
    stripped = strip_strict_nulls(schema, parsed.value)
    return raw if stripped == parsed.value else stripped

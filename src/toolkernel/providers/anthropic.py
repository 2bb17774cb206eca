"""Anthropic Messages: tools, ``tool_use`` blocks, and ``tool_result`` blocks.

::

    names = NameMap.build(definitions)
    tools = render_anthropic_tools(definitions)             # → tools=[...]
    calls = parse_anthropic(message, names)
    results = await kernel.call_many(run, calls)
    messages.append(render_anthropic_results(results, calls=calls))  # one user message

Anthropic sends ``input`` already decoded; an ``input`` that is not an object is
handed to the kernel as JSON text, which refuses it as ARGUMENTS_NOT_OBJECT.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from toolkernel.calls import ToolCallResult
from toolkernel.codes import Status
from toolkernel.definition import ToolDefinition
from toolkernel.providers.names import (
    NameMap,
    ProviderFormatError,
    answering,
    as_json_text,
    load_document,
    projection_json,
    read_field,
)
from toolkernel.providers.schemas import plain_object_schema
from toolkernel.run import ToolCall

if TYPE_CHECKING:  # the SDK's own parameter types, for embedders type-checking their calls
    from anthropic.types import MessageParam, ToolParam

__all__ = ["parse_anthropic", "render_anthropic_results", "render_anthropic_tools"]

_USABLE: Final = frozenset({Status.SUCCEEDED, Status.PARTIAL})


def render_anthropic_tools(definitions: Sequence[ToolDefinition]) -> list[ToolParam]:
    """The ``tools`` parameter of ``client.messages.create``.

    Args:
        definitions: the tool set the model may see (``Kernel.expose(run)``).

    Returns:
        One ``{"name", "description", "input_schema"}`` entry per definition; the
        input schema is the tool's own, made a plain object at its top level
        (``plain_object_schema``: Anthropic refuses the whole request over a top-level
        ``anyOf``/``oneOf``/``allOf``), with what that left out said in the description.

    Raises:
        ProviderNameError: two tools map to the same provider name.
    """
    names = NameMap.build(definitions)
    return [_tool(names, d) for d in definitions]


def parse_anthropic(message: Any, names: NameMap) -> list[ToolCall]:
    """The ``tool_use`` blocks of a Messages response, in the model's order.

    Args:
        message: an ``anthropic.types.Message``, its ``model_dump()``, or its JSON text.
        names: the map the tools were rendered with.

    Returns:
        One ToolCall per ``tool_use`` block, its ``id`` kept.

    Raises:
        ProviderFormatError: the message has no ``content`` list.
    """
    document = load_document(message, "Anthropic message")
    content = read_field(document, "content")
    if not isinstance(content, list | tuple):
        raise ProviderFormatError("Anthropic message: no 'content' list")
    return [_call(block, names) for block in content if read_field(block, "type") == "tool_use"]


def render_anthropic_results(
    results: Sequence[ToolCallResult],
    *,
    calls: Sequence[ToolCall] | None = None,
    names: NameMap | None = None,
) -> MessageParam:
    """One user message with a ``tool_result`` block per result, in order.

    Anthropic wants every result of a turn in the one user message that follows it.
    ``is_error`` is set unless the call succeeded (fully or partly).

    Args:
        results: the results of one model turn (``Kernel.call_many``).
        calls: the calls they answer, as parsed. Pass them: the kernel records a call
            under an id of its own where it cannot keep the one sent, and the model
            must be answered under the id it sent.
        names: the map the tools were rendered with: messages then name tools as
            the model was shown them (``file__read``, not ``file.read``).

    Raises:
        UsageError: ``calls`` and ``results`` differ in number.
    """
    return {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": r.tool_call_id,
                "content": projection_json(r, names),
                "is_error": r.status not in _USABLE,
            }
            for r in answering(calls, results)
        ],
    }


def _tool(names: NameMap, definition: ToolDefinition) -> ToolParam:
    schema, note = plain_object_schema(definition.input_schema)
    return {
        "name": names.provider_name(definition.name),
        "description": f"{definition.description} {note}" if note else definition.description,
        "input_schema": schema,
    }


def _call(block: Any, names: NameMap) -> ToolCall:
    name, block_id, raw = (read_field(block, key) for key in ("name", "id", "input"))
    return ToolCall(
        names.tool_name(name) if isinstance(name, str) else "",
        raw if isinstance(raw, Mapping) else as_json_text(raw),
        # Kept as sent, empty too: the result must answer the id the model used.
        tool_call_id=block_id if isinstance(block_id, str) else None,
    )

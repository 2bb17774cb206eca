"""How the gateway shows kernel objects to an MCP client.

A ``ToolDefinition`` becomes an MCP ``Tool`` (annotations derived from its safety
profile, the output schema from its output contract); a ``ToolCallResult`` becomes a
``CallToolResult``. Only the model projection crosses: SUCCEEDED and PARTIAL render as
normal results, every other status as ``isError: true`` with the safe message first,
never as a protocol error. The whole projection also rides in ``_meta`` under
``PROJECTION_META`` so programs can read the status and error code without parsing text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import mcp_types as types

from toolkernel.calls import ToolCallResult
from toolkernel.codes import Status
from toolkernel.definition import ToolDefinition
from toolkernel.registry import RegisteredTool

__all__ = [
    "META_PREFIX",
    "PROJECTION_META",
    "RUN_META",
    "output_schema",
    "render_result",
    "render_tool",
]

META_PREFIX: Final = "toolkernel.dev/"
PROJECTION_META: Final = META_PREFIX + "projection"
RUN_META: Final = META_PREFIX + "runId"
_SUCCESS: Final = frozenset({Status.SUCCEEDED, Status.PARTIAL})


def output_schema(definition: ToolDefinition) -> dict[str, Any] | None:
    """The contract's output schema when MCP can carry it (an object at the root)."""
    schema = definition.output_contract.schema
    if isinstance(schema, Mapping) and schema.get("type") == "object":
        return dict(schema)
    return None


def render_tool(definition: ToolDefinition) -> types.Tool:
    """The MCP form of a definition; the name is kept as is (MCP allows dots)."""
    d = definition
    return types.Tool(
        name=d.name,
        title=d.title,
        description=d.description,
        input_schema=dict(d.input_schema),
        output_schema=output_schema(d),
        annotations=types.ToolAnnotations(
            title=d.title,
            read_only_hint=d.read_only,
            destructive_hint=d.safety.destructive,
            idempotent_hint=d.idempotent,
            open_world_hint=d.safety.external or d.permissions.network,
        ),
        _meta={
            META_PREFIX + "version": d.version,
            META_PREFIX + "executionMode": str(d.execution_mode),
            META_PREFIX + "trust": str(d.safety.trust),
            META_PREFIX + "source": d.safety.source,
        },
    )


def render_result(
    result: ToolCallResult, tool: RegisteredTool | None, *, run_id: str
) -> types.CallToolResult:
    """The MCP form of a result: isError for anything but SUCCEEDED and PARTIAL."""
    projection = result.projection()
    meta = {PROJECTION_META: projection, RUN_META: run_id}
    success = result.status in _SUCCESS
    if success and _fits_schema(result, tool):
        output = result.structured_output
        lines = [result.safe_message]
        if output is not None:
            lines.append(_json(output))
        if result.artifacts:
            lines.append("artifacts: " + _json([ref.to_dict() for ref in result.artifacts]))
        return types.CallToolResult(
            content=[types.TextContent(text="\n".join(lines))],
            structured_content=output if isinstance(output, dict) else None,
            is_error=False,
            _meta=meta,
        )
    message = _unfit_message(result) if success else result.safe_message
    return types.CallToolResult(
        content=[
            types.TextContent(text=message),
            types.TextContent(text=_json(projection)),
        ],
        is_error=True,
        _meta=meta,
    )


def _fits_schema(result: ToolCallResult, tool: RegisteredTool | None) -> bool:
    """Whether a success can carry its output as the advertised structured content.

    A SUCCEEDED output passed the contract before redaction, which may break it (a
    secret masked in a string the schema constrains); a PARTIAL one was cut to fit the
    projection budget and may no longer match. Clients reject structured content that
    breaks the advertised schema, so such a result is shown as an error whose message
    says why and names the artifact holding the full output (``_unfit_message``).
    """
    if tool is None or output_schema(tool.definition) is None:
        return True
    validator = tool.output_validator
    output = result.structured_output
    return isinstance(output, dict) and (validator is None or validator.is_valid(output))


def _unfit_message(result: ToolCallResult) -> str:
    """Why a success comes as an error, and where its full output is: the model would
    otherwise read a tool that succeeded and a result that says it failed."""
    if result.status is Status.PARTIAL:
        changed = "cut to fit"
    else:
        changed = "with secrets redacted" if result.redactions else "as sent"
    message = (
        f"{result.safe_message} Its output {changed} no longer matches the tool's output "
        "schema, so it comes as this error, not as structured content: it is in the "
        "projection below."
    )
    unnamed = [ref.id for ref in result.artifacts if ref.id not in result.safe_message]
    if unnamed:
        message += (
            f" The full output is in artifact {', '.join(unnamed)} (read it with artifact.read)."
        )
    return message


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

"""Built-in in-process tools: ``memory.read`` and ``policy.explain``."""

from __future__ import annotations

from typing import Annotated, Any

from annotated_types import MaxLen, MinLen

from toolkernel.codes import ErrorCode
from toolkernel.context import ToolContext
from toolkernel.errors import ToolFailed
from toolkernel.functions import tool

__all__ = ["BUILTIN_TOOLS", "memory_read", "policy_explain"]


@tool("memory.read", idempotent=True, timeout_ms=2_000, tags=("builtin",))
def memory_read(
    ctx: ToolContext, key: Annotated[str, MinLen(1), MaxLen(128)] | None = None
) -> dict[str, Any]:
    """Read the notes the runtime keeps for this run.

    Args:
        key: the note to read; leave it out to get every note.
    """
    if key is None:
        return {"notes": dict(ctx.notes)}
    if key not in ctx.notes:
        known = ", ".join(sorted(ctx.notes)[:50]) or "none"
        raise ToolFailed(
            f"There is no note named '{key}'. Known notes: {known}.", code=ErrorCode.NOT_FOUND
        )
    return {"key": key, "value": ctx.notes[key]}


@tool("policy.explain", idempotent=True, timeout_ms=2_000, tags=("builtin",))
def policy_explain(
    ctx: ToolContext,
    tool: Annotated[str, MinLen(1), MaxLen(128)],
    arguments: dict[str, Any] | None = None,
    version: Annotated[str, MaxLen(32)] | None = None,
) -> dict[str, Any]:
    """Explain whether a call would be allowed now, and if not, why and what to do instead.

    Args:
        tool: the tool to ask about, e.g. "file.patch".
        arguments: the arguments you would pass.
        version: a specific version of the tool; the newest when left out.
    """
    if ctx.kernel is None or ctx.run is None:
        raise ToolFailed("policy.explain needs a running kernel", code=ErrorCode.INTERNAL_ERROR)
    return ctx.kernel.explain(ctx.run, tool, arguments or {}, version=version)


BUILTIN_TOOLS = (memory_read, policy_explain)

"""Tools the gateway tests serve next to the built-in ones (``tools.modules``)."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from annotated_types import Ge, Le, MaxLen

from toolkernel import ToolContext, tool
from toolkernel.definition import Permissions


@tool("fixture.steps", idempotent=True, timeout_ms=10_000)
async def steps(ctx: ToolContext, count: Annotated[int, Ge(1), Le(20)] = 3) -> dict[str, Any]:
    """Report progress ``count`` times, then finish.

    Args:
        count: how many steps to report.
    """
    for step in range(1, count + 1):
        ctx.progress(step, count, f"step {step}")
        await anyio.lowlevel.checkpoint()
    return {"steps": count}


@tool("fixture.wait", timeout_ms=60_000)
async def wait(ctx: ToolContext) -> dict[str, Any]:
    """Say that it started, then wait until the call is cancelled."""
    ctx.progress(0, None, "started")
    await anyio.sleep_forever()
    return {}


@tool("fixture.erase", mutating=True, destructive=True, timeout_ms=5_000)
def erase(target: Annotated[str, MaxLen(64)]) -> dict[str, Any]:
    """Pretend to erase ``target``; destructive, so every call needs approval.

    Args:
        target: what to erase.
    """
    return {"erased": target}


@tool("fixture.echo", idempotent=True, timeout_ms=5_000)
def echo(text: Annotated[str, MaxLen(200)]) -> dict[str, Any]:
    """Return the text; the tests' policy denies it.

    Args:
        text: the text to return.
    """
    return {"text": text}


@tool("fixture.fetch", permissions=Permissions(network=True), timeout_ms=5_000)
def fetch(url: Annotated[str, MaxLen(200)]) -> dict[str, Any]:
    """Pretend to fetch a URL (it needs the network permission)."""
    return {"fetched": url}

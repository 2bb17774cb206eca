"""Helpers the workspace-tool tests share (fixtures are in conftest.py)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from toolkernel.calls import ToolCallResult
from toolkernel.functions import FunctionTool


def exposing_all(profile: str) -> str:
    """A toolkernel.toml that runs under ``profile`` and shows the model every tool."""
    return f'[run]\nprofile = "{profile}"\n\n[[exposure]]\ntools = ["*"]\n'


def with_timeout(tool: FunctionTool, timeout_ms: int) -> FunctionTool:
    """``tool`` with another timeout."""
    definition = dataclasses.replace(tool.definition, timeout_ms=timeout_ms)
    return dataclasses.replace(tool, definition=definition)


async def call_while_stuck(
    call: Callable[[], Awaitable[ToolCallResult]],
    entered: threading.Event,
    release: threading.Event,
) -> tuple[ToolCallResult, int]:
    """``call``'s result while the test holds its tool's work (``entered`` set, waiting
    for ``release``), and how often the event loop ran meanwhile."""
    ticks = 0

    async def heartbeat() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += entered.is_set() and not release.is_set()

    result: Any = None
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(heartbeat)
                result = await call()
                group.cancel_scope.cancel()
    finally:
        release.set()
    return result, ticks

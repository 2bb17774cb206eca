"""Dispatch: run an authorized call through its execution mode's adapter.

The adapter call is the one isolation boundary where any exception from tool code is
caught and turned into a FAILED result (its traceback kept for the ledger). Around it:
a timeout scope, the call's cancellation token, and retries — only for idempotent
tools or for error codes the definition lists, with exponential backoff.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import anyio
import anyio.to_thread
import sniffio

from toolkernel.calls import ArtifactRef
from toolkernel.cancel import CancellationToken, CancelledByRuntime
from toolkernel.codes import CATALOG, ErrorCode, Status, safe_message
from toolkernel.context import ToolContext
from toolkernel.errors import ToolFailed, ToolPartial
from toolkernel.registry import RegisteredTool

__all__ = ["Adapter", "Invocation", "NativeAdapter", "Outcome", "ToolOutput", "dispatch"]


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """What a tool may return to give the model a summary and artifact refs too."""

    data: Any = None
    summary: str = ""
    artifacts: tuple[ArtifactRef, ...] = ()


@dataclass(frozen=True, slots=True)
class Invocation:
    """One authorized call, as an adapter receives it."""

    tool: RegisteredTool
    arguments: Mapping[str, Any]
    context: ToolContext


@dataclass(slots=True)
class Outcome:
    """What dispatch produced, before normalization and projection."""

    status: Status
    code: ErrorCode | None = None
    message: str = ""
    output: Any = None
    artifacts: tuple[ArtifactRef, ...] = ()
    retryable: bool = False
    attempts: int = 0
    duration_ms: float = 0.0
    internal: dict[str, Any] = field(default_factory=dict)


class Adapter(Protocol):
    """Runs a call in one execution mode. Raise ``ToolFailed``/``ToolPartial`` to shape
    the result; anything else raised becomes FAILED/TOOL_ERROR."""

    async def invoke(self, invocation: Invocation) -> Any: ...


class NativeAdapter:
    """In-process Python tools: async functions run directly, sync ones in a worker thread.

    A sync tool cannot be killed: on timeout or cancel its thread is abandoned (the
    result is discarded) and the tool should poll ``ctx.token`` to stop early.
    """

    def __init__(self, *, max_threads: int = 16) -> None:
        self._limiter = anyio.CapacityLimiter(max_threads)
        self._executor = ThreadPoolExecutor(max_threads, thread_name_prefix="toolkernel")

    async def invoke(self, invocation: Invocation) -> Any:
        tool = invocation.tool
        handler = tool.handler
        if handler is None:
            raise ToolFailed("this tool has no implementation", code=ErrorCode.INTERNAL_ERROR)
        kwargs = dict(invocation.arguments)
        if tool.context_parameter:
            kwargs[tool.context_parameter] = invocation.context
        if tool.is_async:
            return await handler(**kwargs)
        if sniffio.current_async_library() == "asyncio":
            # asyncio's executor hop costs about half of anyio's generic one; an awaiting
            # task that is cancelled abandons the future, as abandon_on_cancel does.
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, partial(handler, **kwargs))
        return await anyio.to_thread.run_sync(
            partial(handler, **kwargs), abandon_on_cancel=True, limiter=self._limiter
        )


async def dispatch(adapter: Adapter, invocation: Invocation, token: CancellationToken) -> Outcome:
    """Run the call with its timeout, cancellation token and retry policy."""
    definition = invocation.tool.definition
    retry = definition.retry
    started = time.perf_counter()
    attempt = 0
    history: list[str | None] = []
    while True:
        attempt += 1
        outcome = await _attempt(adapter, invocation, token, definition.timeout_ms / 1000)
        history.append(str(outcome.code) if outcome.code else None)
        if outcome.status is Status.SUCCEEDED or attempt >= retry.attempts or token.cancelled:
            break
        may_retry = outcome.code in retry.on or (definition.idempotent and outcome.retryable)
        if not may_retry:
            break
        if await _backoff(retry.delay_s(attempt), token):
            break
    outcome.attempts = attempt
    if attempt > 1:
        outcome.internal["attemptCodes"] = history
    outcome.duration_ms = (time.perf_counter() - started) * 1000
    return outcome


async def _attempt(
    adapter: Adapter, invocation: Invocation, token: CancellationToken, timeout_s: float
) -> Outcome:
    name = invocation.tool.name
    try:
        # One scope carries both the deadline and the token: cheaper than nesting a
        # fail_after inside a token scope, and the cause is told apart afterwards.
        with anyio.CancelScope(deadline=anyio.current_time() + timeout_s) as scope:
            token.attach(scope)
            try:
                output = await adapter.invoke(invocation)
            finally:
                token.detach(scope)
        if scope.cancelled_caught:
            if token.reason is not None:
                return _from_code(token.reason, tool=name)
            return _from_code(ErrorCode.TIMEOUT, tool=name, seconds=f"{timeout_s:g}")
    except ToolFailed as signal:
        info = CATALOG[signal.code]
        return Outcome(
            status=info.status,
            code=signal.code,
            message=signal.safe_message,
            output=signal.output,
            artifacts=signal.artifacts,
            retryable=info.retryable if signal.retryable is None else signal.retryable,
        )
    except ToolPartial as signal:
        return Outcome(
            Status.PARTIAL,
            message=signal.safe_message,
            output=signal.output,
            artifacts=signal.artifacts,
        )
    except CancelledByRuntime as signal:
        return _from_code(signal.reason, tool=name)
    except Exception as exc:  # noqa: BLE001 - the isolation boundary around tool code
        outcome = _from_code(
            ErrorCode.TOOL_ERROR, tool=name, detail=f"the tool raised {type(exc).__name__}."
        )
        outcome.internal["traceback"] = traceback.format_exc()
        return outcome
    if isinstance(output, ToolOutput):
        return Outcome(
            Status.SUCCEEDED, message=output.summary, output=output.data, artifacts=output.artifacts
        )
    return Outcome(Status.SUCCEEDED, output=output)


async def _backoff(delay_s: float, token: CancellationToken) -> bool:
    """Sleep before a retry; True when the token cancelled the wait."""
    with anyio.CancelScope() as scope:
        token.attach(scope)
        try:
            await anyio.sleep(delay_s)
        finally:
            token.detach(scope)
    return scope.cancelled_caught


def _from_code(code: ErrorCode, **fields: object) -> Outcome:
    info = CATALOG[code]
    return Outcome(
        info.status, code=code, message=safe_message(code, **fields), retryable=info.retryable
    )

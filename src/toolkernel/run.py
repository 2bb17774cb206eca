"""A run: one agent task's mutable state inside the kernel.

It holds the run's context (state, profile, verification, approval), its cancellation
token, what it has spent, the notes ``memory.read`` serves, what was last exposed to
the model, and the lock that keeps non-read-only calls one at a time.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Final

import anyio
import anyio.lowlevel

from toolkernel.cancel import CancellationToken
from toolkernel.codes import ErrorCode
from toolkernel.context import RunContext
from toolkernel.errors import UsageError
from toolkernel.policy import UsageMeter

__all__ = ["Run", "ToolCall", "check_run_id"]

_RUN_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")


def check_run_id(run_id: str) -> None:
    """Refuse a run id that is not 1-128 letters, digits and ``._:@-`` (starting with a
    letter or digit): the empty one included, which is no run to continue.

    Raises:
        UsageError: it is not.
    """
    if not _RUN_ID.fullmatch(run_id):
        raise UsageError(
            "a run id is 1-128 characters: letters, digits and . _ : @ - "
            "(starting with a letter or digit)"
        )


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A model's proposal, before the runtime has looked at it.

    ``arguments`` may be the provider's raw JSON text (bounded before parsing) or an
    already-decoded mapping.
    """

    tool_name: str
    arguments: str | bytes | Mapping[str, Any] | None = None
    tool_call_id: str | None = None
    version: str | None = None
    idempotency_key: str | None = None
    step_id: str | None = None
    trace_context: str | None = None
    requested_by: str = "model"


class Run:
    """Mutable per-run state; create it with ``Kernel.start_run``."""

    def __init__(
        self,
        context: RunContext,
        *,
        max_parallel_reads: int,
        check_profile: Callable[[str], None],
    ) -> None:
        self._context = context
        self._check_profile = check_profile
        self.token = CancellationToken()
        self.meter = UsageMeter()
        self.notes: dict[str, str] = {}
        self.exposed: dict[str, str] | None = None
        self.shown_hashes: set[str] = set()
        self.reads = anyio.Semaphore(max_parallel_reads)
        self.gate = _ReadWriteGate()
        self.calls: dict[str, CancellationToken] = {}  # running, by tool call id
        # Proposed and not started yet (being admitted, waiting for approval or for its
        # turn): the reason it was cancelled meanwhile, or None.
        self._waiting: dict[str, ErrorCode | None] = {}
        self._open: set[str] = set()  # proposed and not finished: its RESULT is not written
        self._asking: dict[str, anyio.CancelScope] = {}  # waiting for a human's answer
        self.projection_cache: tuple[Any, frozenset[str]] | None = None

    @property
    def id(self) -> str:
        return self._context.run_id

    @property
    def context(self) -> RunContext:
        return self._context

    def update(self, **changes: Any) -> RunContext:
        """Move the run along (``run_state=RunState.EDITING``, ``verification=…``).

        Raises:
            UsageError: a state, or the profile, is not one the kernel knows; the run
                keeps its context.
        """
        context = self._context.evolve(**changes)
        if "profile" in changes:
            self._check_profile(context.profile)
        self._context = context
        return context

    def remember(self, key: str, value: str) -> None:
        """Keep a note that ``memory.read`` returns to the model."""
        self.notes[key] = value

    def take_read_slot(self) -> bool:
        """Take one of the run's parallel-read slots if one is free (no event-loop trip);
        False when none is: ``wait_read_slot``."""
        try:
            self.reads.acquire_nowait()
        except anyio.WouldBlock:
            return False
        return True

    async def wait_read_slot(self, tool_call_id: str) -> bool:
        """Wait for a parallel-read slot for a call; False when the call, or the run,
        was cancelled meanwhile: it gets none and never starts."""
        with self.asking(tool_call_id) as waiting:
            await self.reads.acquire()
        return not waiting.cancelled_caught

    def cancel(self, reason: ErrorCode = ErrorCode.USER_CANCELLED) -> None:
        """Cancel every call in flight in this run, and every later one."""
        self.token.cancel(reason)

    def cancel_call(self, tool_call_id: str, reason: ErrorCode = ErrorCode.USER_CANCELLED) -> bool:
        """Cancel one call the kernel has: a running one now; one that has not started
        (being admitted, waiting for approval or its turn) never starts. False when the
        kernel has no such call (unknown, or already finished)."""
        token = self.calls.get(tool_call_id)
        if token is not None:
            token.cancel(reason)
            return True
        if tool_call_id in self._waiting:
            if self._waiting[tool_call_id] is None:
                self._waiting[tool_call_id] = reason
            if tool_call_id in self._asking:  # nobody needs the human's answer now
                self._asking[tool_call_id].cancel()
            return True
        return False

    @contextmanager
    def asking(self, tool_call_id: str) -> Iterator[anyio.CancelScope]:
        """A scope for a wait before a call starts (a human's answer about it, a free
        read slot), cancelled when the call or the run is (the caller then tells a
        cancel from the end of the wait by the scope's ``cancelled_caught``)."""
        with anyio.CancelScope() as scope, self.token.watch(scope):
            self._asking[tool_call_id] = scope
            if self._waiting.get(tool_call_id) is not None:
                scope.cancel()
            try:
                yield scope
            finally:
                self._asking.pop(tool_call_id, None)

    def has_call(self, tool_call_id: str) -> bool:
        """Whether a call with this id was proposed and its batch has not finished it."""
        return tool_call_id in self._open

    def proposed(self, tool_call_id: str) -> None:
        """The kernel has the call (from now ``cancel_call`` reaches it)."""
        self._waiting.setdefault(tool_call_id, None)
        self._open.add(tool_call_id)

    def cancelled_before_start(self, tool_call_id: str) -> ErrorCode | None:
        """Why the call, or the whole run, was cancelled before it started, if it was."""
        return self._waiting.get(tool_call_id) or self.token.reason

    def started(self, tool_call_id: str, token: CancellationToken) -> None:
        """The kernel dispatches the call under ``token`` (cancellable through it)."""
        self.calls[tool_call_id] = token
        reason = self._waiting.pop(tool_call_id, None)
        if reason is not None:
            token.cancel(reason)

    def concluded(self, tool_call_id: str) -> None:
        """The call was refused: ``cancel_call`` no longer reaches it (its id stays
        the batch's until ``finished``)."""
        self._waiting.pop(tool_call_id, None)

    def finished(self, tool_call_id: str) -> None:
        """The call is over, run or refused: nothing about it is kept."""
        self.calls.pop(tool_call_id, None)
        self._waiting.pop(tool_call_id, None)
        self._open.discard(tool_call_id)


class _ReadWriteGate:
    """Many readers or one writer, for the calls of one run, granted in arrival order.

    Uncontended acquire and release never yield to the event loop: the common case of
    one call at a time pays only a few attribute updates.
    """

    def __init__(self) -> None:
        self._readers = 0
        self._writer = False
        self._queue: deque[tuple[bool, anyio.Event]] = deque()

    def _free(self, exclusive: bool) -> bool:
        return not self._writer and (not exclusive or not self._readers)

    def _take(self, exclusive: bool) -> None:
        if exclusive:
            self._writer = True
        else:
            self._readers += 1

    async def acquire(self, exclusive: bool) -> None:
        if not self._queue and self._free(exclusive):
            self._take(exclusive)
            return
        entry = (exclusive, anyio.Event())
        self._queue.append(entry)
        try:
            await entry[1].wait()
        except BaseException:
            if entry in self._queue:
                self._queue.remove(entry)
            elif entry[1].is_set():
                self.release(exclusive)  # granted while being cancelled: hand it on
            raise

    @asynccontextmanager
    async def stepped_aside(self, exclusive: bool) -> AsyncIterator[None]:
        """Let other calls through while this holder waits (for a human), then take it
        back, also when the wait is cancelled (the holder's own release comes later)."""
        self.release(exclusive)
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                await self.acquire(exclusive)
        # Cancelled while it waited for the gate: stop here, before the call runs (the
        # holder's release still comes).
        await anyio.lowlevel.checkpoint_if_cancelled()

    def release(self, exclusive: bool) -> None:
        if exclusive:
            self._writer = False
        else:
            self._readers -= 1
        # Wake waiters in order for as long as the gate can admit them.
        while self._queue and self._free(self._queue[0][0]):
            waiting_exclusive, event = self._queue.popleft()
            self._take(waiting_exclusive)
            event.set()

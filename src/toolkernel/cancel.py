"""Cancellation tokens the runtime can trigger and tools can observe.

A token belongs to a run or to one call (a child of its run's token). Cancelling it
cancels every anyio scope registered with it — from any thread — and sets a flag that
synchronous tool code running in a worker thread can poll. The reason is an error
code (USER_CANCELLED, BUDGET_EXHAUSTED, POLICY_VIOLATION, SUPERSEDED, LEASE_LOST) and
becomes the CANCELLED result's code at the outer edge of the pipeline.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import anyio

from toolkernel.codes import CATALOG, ErrorCode, Status

__all__ = ["CancellationToken", "CancelledByRuntime"]


class CancelledByRuntime(Exception):
    """Raised by ``raise_if_cancelled`` inside tool code that polls its token."""

    def __init__(self, reason: ErrorCode) -> None:
        super().__init__(str(reason))
        self.reason = reason


class Cancellable(Protocol):
    """What a token can cancel: an anyio ``CancelScope``, or the kernel's own watch
    of an asyncio task."""

    def cancel(self) -> object: ...


# One lock for every token: each holds it only for a few dict operations, and a token
# is created per call, where allocating a lock of its own was a measurable cost.
_LOCK = threading.Lock()


class CancellationToken:
    """A one-way switch: once cancelled, it stays cancelled with its first reason."""

    __slots__ = ("_children", "_event", "_reason", "_scopes")

    def __init__(self, parent: CancellationToken | None = None) -> None:
        # The threading.Event is made only when a worker thread waits, and the scope
        # and child maps when first used: most call tokens never need them.
        self._event: threading.Event | None = None
        self._reason: ErrorCode | None = None
        self._scopes: dict[Cancellable, asyncio.AbstractEventLoop | None] | None = None
        self._children: dict[CancellationToken, None] | None = None
        if parent is not None:
            parent._adopt(self)

    @property
    def cancelled(self) -> bool:
        return self._reason is not None

    @property
    def reason(self) -> ErrorCode | None:
        return self._reason

    def child(self) -> CancellationToken:
        """A token that is cancelled whenever this one is."""
        return CancellationToken(self)

    def cancel(self, reason: ErrorCode = ErrorCode.USER_CANCELLED) -> None:
        """Cancel everything watching this token. Safe to call from any thread."""
        if CATALOG[reason].status is not Status.CANCELLED:
            raise ValueError(f"{reason} is not a cancellation reason")
        with _LOCK:
            if self._reason is not None:
                return
            self._reason = reason
            if self._event is not None:
                self._event.set()
            scopes = list(self._scopes.items()) if self._scopes else []
            children = list(self._children) if self._children else []
        for scope, loop in scopes:
            _cancel_scope(scope, loop)
        for child in children:
            child.cancel(reason)

    def raise_if_cancelled(self) -> None:
        """For tool code that polls: raise ``CancelledByRuntime`` once cancelled."""
        if self._reason is not None:
            raise CancelledByRuntime(self._reason)

    def wait(self, timeout: float | None = None) -> bool:
        """Block a worker thread until cancelled (or the timeout passes)."""
        with _LOCK:
            if self._reason is not None:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def attach(self, scope: Cancellable) -> None:
        """Cancel ``scope`` when this token is cancelled, until ``detach``."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with _LOCK:
            if self._scopes is None:
                self._scopes = {}
            self._scopes[scope] = loop
            already = self._reason is not None
        if already:
            scope.cancel()

    def detach(self, scope: Cancellable) -> None:
        with _LOCK:
            if self._scopes is not None:
                self._scopes.pop(scope, None)

    @contextmanager
    def watch(self, scope: anyio.CancelScope) -> Iterator[None]:
        """``attach`` for the duration of a ``with`` block."""
        self.attach(scope)
        try:
            yield
        finally:
            self.detach(scope)

    def _adopt(self, child: CancellationToken) -> None:
        with _LOCK:
            if self._children is None:
                self._children = {}
            self._children[child] = None
            reason = self._reason
        if reason is not None:
            child.cancel(reason)

    def release(self, child: CancellationToken) -> None:
        """Forget a finished child so long runs do not accumulate them."""
        with _LOCK:
            if self._children is not None:
                self._children.pop(child, None)


def _cancel_scope(scope: Cancellable, loop: asyncio.AbstractEventLoop | None) -> None:
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is None or loop is running:
        scope.cancel()
    elif not loop.is_closed():
        loop.call_soon_threadsafe(scope.cancel)

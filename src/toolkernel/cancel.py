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
from contextlib import contextmanager, suppress

import anyio

from toolkernel.codes import CATALOG, ErrorCode, Status

__all__ = ["CancellationToken", "CancelledByRuntime"]


class CancelledByRuntime(Exception):
    """Raised by ``raise_if_cancelled`` inside tool code that polls its token."""

    def __init__(self, reason: ErrorCode) -> None:
        super().__init__(str(reason))
        self.reason = reason


class CancellationToken:
    """A one-way switch: once cancelled, it stays cancelled with its first reason."""

    def __init__(self, parent: CancellationToken | None = None) -> None:
        # The threading.Event is made only when a worker thread waits: a token is
        # created per call, and most calls never block on one.
        self._event: threading.Event | None = None
        self._reason: ErrorCode | None = None
        self._lock = threading.Lock()
        self._scopes: dict[anyio.CancelScope, asyncio.AbstractEventLoop | None] = {}
        self._children: list[CancellationToken] = []
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
        with self._lock:
            if self._reason is not None:
                return
            self._reason = reason
            if self._event is not None:
                self._event.set()
            scopes = list(self._scopes.items())
            children = list(self._children)
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
        with self._lock:
            if self._reason is not None:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def attach(self, scope: anyio.CancelScope) -> None:
        """Cancel ``scope`` when this token is cancelled, until ``detach``."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            self._scopes[scope] = loop
            already = self._reason is not None
        if already:
            scope.cancel()

    def detach(self, scope: anyio.CancelScope) -> None:
        with self._lock:
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
        with self._lock:
            self._children.append(child)
            reason = self._reason
        if reason is not None:
            child.cancel(reason)

    def release(self, child: CancellationToken) -> None:
        """Forget a finished child so long runs do not accumulate them."""
        with self._lock, suppress(ValueError):
            self._children.remove(child)


def _cancel_scope(scope: anyio.CancelScope, loop: asyncio.AbstractEventLoop | None) -> None:
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is None or loop is running:
        scope.cancel()
    elif not loop.is_closed():
        loop.call_soon_threadsafe(scope.cancel)

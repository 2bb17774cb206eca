"""Group commit: appends return at once; a writer thread stores them in batches.

``GroupCommitLedger`` wraps a ledger whose ``append`` stores before returning. Calls to
``append`` queue the events and return; one writer thread stores everything queued
so far in one transaction, so many calls share one commit. ``sync`` returns once
everything appended before it is stored — the kernel calls it wherever the pipeline
needs events on disk before going on (a human is asked, a call that can change
things starts, such a call's result is returned). ``sync`` and ``append_durable``
store what is queued in the calling thread itself rather than waiting for the writer
to wake up: a durable step costs one commit, as without group commit. Reads sync
first.

Whoever stores (the writer or a syncing caller) takes the queue and stores it while
holding one lock, so batches reach the inner ledger in the order they were appended.

The trade: a READ_ONLY call can return to the model before its events are stored;
if the process dies in that window (typically well under a millisecond; at most
``MAX_QUEUED`` appends and the batch being stored, see below), those events are lost. A program that
ends without closing the ledger stores them at exit. The order of events is never
changed, and nothing is lost silently.

The writer can fall behind: a caller that calls tools in a tight loop, without ever
waiting for anything, holds the GIL the writer needs, which it gets back only every
few milliseconds. So the queue is bounded: the append that finds ``MAX_QUEUED``
appends waiting waits until the writer has stored a batch. At most that many appends
wait in the queue, besides the batch being stored.

A store can fail in two ways:

* Without having stored anything (a ``LedgerError`` whose ``maybe_stored`` is false:
  a full disk, a lock another process held past the busy timeout, an I/O error). The
  batch goes back to the front of the queue, in order, and the writer tries it again
  after a pause that grows from 50 ms to 1 s. Meanwhile no more appends are taken, so
  the queue cannot grow without bound: ``append``, ``sync``, reads and claims raise a
  ``LedgerError`` saying that the ledger cannot store events now and how many queued
  appends wait to be stored (nothing is lost; the kernel reports such calls as
  LEDGER_UNAVAILABLE, retryable). Once a retry stores them, all works again. A
  ``append_durable`` whose own store fails takes its events back out of the queue: it
  raises, and they are not stored later (its caller may append them again).
  ``close`` tries once more, and if that fails too, raises a ``LedgerError`` saying how
  many queued appends were lost.
* Any other way (``maybe_stored``: the connection dropped during the commit and the
  batch may be stored; or an exception that is not a ``LedgerError``). Storing the
  batch again could store its events twice, so it is never retried: it is lost, and
  every later ``append``, ``sync``, read and ``close`` raises a ``LedgerError`` saying
  how many queued appends were lost, until the process restarts.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import weakref
from collections.abc import Sequence
from functools import partial
from typing import Final

from toolkernel.errors import LedgerError
from toolkernel.ledger.base import Event, Ledger, NewEvent, RunSummary, VerifiedRead, VerifyReport

__all__ = ["MAX_QUEUED", "GroupCommitLedger"]

_log = logging.getLogger(__name__)


_Batch = tuple[str, Sequence[NewEvent]]

MAX_QUEUED: Final = 256
"""Appends that may wait for the writer; the one that finds this many stores them."""

# The writer's pause before retrying a store that stored nothing, doubled after each
# failure up to the last: a freed disk is noticed within a second, a full one costs
# one attempt a second.
_FIRST_RETRY_S: Final = 0.05
_LAST_RETRY_S: Final = 1.0


class GroupCommitLedger(Ledger):
    """A ledger whose appends are stored by a background writer, in batches.

    Args:
        inner: the ledger that stores (it must store before its ``append`` returns).
    """

    def __init__(self, inner: Ledger) -> None:
        self._inner = inner
        # An append is a lock, a list append and a put; the put only wakes the writer.
        # The queued batches live in ``_pending``, which only a holder of ``_storing``
        # takes, so a syncing caller and the writer never store out of order.
        self._lock = threading.Lock()
        self._pending: list[_Batch] = []
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._storing = threading.Lock()
        self._stored = threading.Condition(self._lock)  # notified after every store
        self._error: LedgerError | None = None
        # Why the queue could not be stored, while it waits for the writer's retry.
        # Changed only by a holder of ``_storing``; set only while ``_pending`` holds
        # something.
        self._unstored: LedgerError | None = None
        self._closing = False
        self._closed = threading.Event()  # cuts the writer's pause before a retry short
        self._writer = threading.Thread(target=self._write, name="toolkernel-ledger", daemon=True)
        self._writer.start()
        # A program that ends without closing its kernel still stores what it queued
        # (its writer is a daemon thread, stopped at exit wherever it was).
        self._exit_hook = partial(_store_at_exit, weakref.ref(self))
        atexit.register(self._exit_hook)  # unregistered by close: kernels come and go

    def append(self, run_id: str, events: Sequence[NewEvent]) -> list[Event]:
        """Queue ``events``; returns ``[]`` (the stored events are not known yet).

        Raises:
            LedgerError: the ledger cannot store events now, an earlier batch was
                lost, or the ledger is closed; ``events`` were not queued.
        """
        self.append_batch([(run_id, events)])
        return []

    def append_batch(self, batches: Sequence[tuple[str, Sequence[NewEvent]]]) -> None:
        """Queue several runs' events for the writer.

        Raises:
            LedgerError: the ledger cannot store events now, an earlier batch was
                lost, or the ledger is closed; nothing was queued.
        """
        queued = [(run_id, list(events)) for run_id, events in batches]
        with self._lock:
            self._check()
            self._pending.extend(queued)
            self._wake.put(None)
            # The writer has fallen behind: wait until it has stored a batch (waiting
            # lets go of the GIL it needs). Not stored here: an interrupt (Ctrl-C lands
            # in the main thread) must not cut a store short, which would lose it; in
            # the wait it loses nothing, the append is queued. A failing store, a
            # close or a lost batch ends the wait: the writer's retry or the error
            # takes over, as for any queued append.
            while len(self._pending) >= MAX_QUEUED and self._writer_on():
                self._stored.wait()

    def append_durable(self, batches: Sequence[tuple[str, Sequence[NewEvent]]]) -> None:
        """Store these events, and what was queued before them, in the calling thread
        before returning, without waking the writer.

        Raises:
            LedgerError: the events were not stored (``maybe_stored`` says whether
                they may have been): they could not be, or an earlier batch was not.
        """
        queued = [(run_id, list(events)) for run_id, events in batches]
        with self._storing:
            with self._lock:
                self._check()
                self._pending.extend(queued)
            self._store_pending()
            if self._unstored is not None:
                raise self._withdraw(queued)
        self._raise_error()

    def check_writable(self) -> None:
        """Raise what ``append`` would raise now: the queue waits for a retry, an
        earlier batch was lost, or the ledger is closed.

        Raises:
            LedgerError: the ledger takes no appends now.
        """
        with self._lock:
            self._check()

    def sync(self) -> None:
        """Store what is queued, here and now, unless the writer is already storing it.

        Raises:
            LedgerError: something appended earlier is not stored: the ledger cannot
                store it now (the writer keeps trying), or it was lost.
        """
        with self._storing:
            self._store_pending()
        self._raise_error()

    def claim_key(self, tool_name: str, key: str, owner: str, lease_s: float) -> bool:
        """The inner ledger's claim, at once (claims are not queued).

        Raises:
            LedgerError: the claim could not be recorded, or queued events are not
                stored.
        """
        self._raise_error()
        return self._inner.claim_key(tool_name, key, owner, lease_s)

    def renew_key(self, tool_name: str, key: str, owner: str, lease_s: float) -> bool:
        """The inner ledger's renewal, at once.

        Raises:
            LedgerError: the lease could not be extended.
        """
        return self._inner.renew_key(tool_name, key, owner, lease_s)

    def release_key(self, tool_name: str, key: str, owner: str) -> None:
        """Store what is queued (the key's result among it), then let go of the claim.

        Raises:
            LedgerError: the queued events or the release could not be stored.
        """
        self.sync()
        self._inner.release_key(tool_name, key, owner)

    def events(self, run_id: str, *, after_seq: int = 0) -> list[Event]:
        self.sync()
        return self._inner.events(run_id, after_seq=after_seq)

    def runs(self) -> list[RunSummary]:
        self.sync()
        return self._inner.runs()

    def find_indexed(self, tool_name: str, key: str) -> Event | None:
        self.sync()
        return self._inner.find_indexed(tool_name, key)

    def verify(self, run_id: str | None = None) -> VerifyReport:
        self.sync()
        return self._inner.verify(run_id)

    def read_verified(self, run_id: str | None = None) -> VerifiedRead:
        self.sync()
        return self._inner.read_verified(run_id)

    def close(self) -> None:
        """Store what is queued, stop the writer and close the inner ledger.

        Raises:
            LedgerError: queued events could not be stored; it says how many appends
                were lost.
        """
        with self._lock:
            already = self._closing
            self._closing = True
            self._stored.notify_all()  # appends waiting for the writer: it stops
        if not already:
            atexit.unregister(self._exit_hook)
            self._closed.set()
            self._wake.put(None)
            self._writer.join()
            with self._storing:
                self._store_pending(retry=True)  # appends that raced with close
                self._give_up()
            self._inner.close()
        self._raise_error()

    def _at_exit(self) -> None:
        with self._lock:
            if self._closing or self._error is not None:
                return
        try:
            self.sync()
        except LedgerError as exc:
            _log.warning("events queued for the ledger were not stored at exit: %s", exc)

    def _raise_error(self) -> None:
        with self._lock:
            if self._error is not None:
                raise self._error
            if self._unstored is not None:
                raise self._waiting()

    def _writer_on(self) -> bool:
        """Whether the writer goes on storing the queue (``_lock`` held)."""
        return (
            self._error is None
            and self._unstored is None
            and not self._closing
            and self._writer.is_alive()
        )

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        if self._unstored is not None:
            raise self._waiting()
        if self._closing:
            raise LedgerError("the ledger is closed")

    def _waiting(self) -> LedgerError:
        """The error for callers while the queue waits for a retry (``_lock`` held)."""
        error = LedgerError(
            f"the ledger cannot store events now ({self._unstored}); "
            f"{len(self._pending)} queued appends wait to be stored when it can, "
            "and no more are taken until then"
        )
        error.__cause__ = self._unstored
        return error

    def _write(self) -> None:
        while True:
            self._wake.get()
            with self._storing:
                self._store_pending()
            if not self._retry():
                return
            with self._lock:
                if self._error is not None or self._closing:
                    return  # close stores what is left

    def _retry(self) -> bool:
        """Store the queue again, pausing longer each time, while stores fail without
        storing anything; False if the ledger is closing meanwhile."""
        delay = _FIRST_RETRY_S
        while self._unstored is not None:
            if self._closed.wait(delay):
                return False
            with self._storing:
                self._store_pending(retry=True)
            delay = min(2 * delay, _LAST_RETRY_S)
        return True

    def _store_pending(self, *, retry: bool = False) -> None:
        """Store everything queued in one transaction (the caller holds ``_storing``).

        While a failed store waits for the writer's retry, only a ``retry`` stores.
        """
        with self._lock:
            if self._error is not None or (self._unstored is not None and not retry):
                return
            batch, self._pending = self._pending, []
            if not batch:
                return
        try:
            self._store(batch)
        finally:
            with self._lock:
                self._stored.notify_all()

    def _store(self, batch: list[_Batch]) -> None:
        """Store a batch taken from the queue (the caller holds ``_storing``)."""
        try:
            self._inner.append_batch(batch)
        except LedgerError as exc:
            if exc.maybe_stored:
                self._lose(batch, exc)
            else:
                self._keep(batch, exc)
        except BaseException as exc:
            # An interrupt (the storing caller's Ctrl-C) also propagates, but the batch
            # it took may be lost, so it is reported too.
            self._lose(batch, exc)
            if not isinstance(exc, Exception):
                raise
        else:
            if self._unstored is not None:
                with self._lock:
                    self._unstored = None

    def _keep(self, batch: list[_Batch], exc: LedgerError) -> None:
        """Put a batch that was not stored back at the front of the queue, for the
        writer to retry."""
        with self._lock:
            first = self._unstored is None
            self._pending[:0] = batch
            self._unstored = exc
        if first:
            self._wake.put(None)  # a caller failed: the writer takes over

    def _lose(self, batch: list[_Batch], exc: BaseException) -> None:
        """Report ``batch``, and what was queued behind it, as lost to every later
        caller (``batch`` may have been stored: storing it again could store it twice)."""
        error = exc if isinstance(exc, LedgerError) else LedgerError(repr(exc))
        with self._lock:
            lost = len(batch) + len(self._pending)
            self._error = LedgerError(f"{lost} queued appends were lost: {error}")
            self._error.__cause__ = exc
            self._pending, self._unstored = [], None

    def _withdraw(self, queued: Sequence[_Batch]) -> LedgerError:
        """Take a durable append's batches back out of the queue after its store failed
        (its caller is told they were not stored, and may append them again); the
        error to tell it."""
        mine = {id(batch) for batch in queued}
        with self._lock:
            self._pending = [batch for batch in self._pending if id(batch) not in mine]
            if self._pending:
                return self._waiting()
            unstored, self._unstored = self._unstored, None
        assert unstored is not None  # the caller saw it set, holding ``_storing``
        return unstored  # nothing else waits: the ledger is not failing any more

    def _give_up(self) -> None:
        """Report what still could not be stored as lost (closing: nobody retries)."""
        with self._lock:
            if self._unstored is None:
                return
            self._error = LedgerError(
                f"{len(self._pending)} queued appends were lost: the ledger was closed "
                f"while it could not store them ({self._unstored})"
            )
            self._error.__cause__ = self._unstored
            self._pending, self._unstored = [], None


def _store_at_exit(ledger: weakref.ref[GroupCommitLedger]) -> None:
    alive = ledger()
    if alive is not None:
        alive._at_exit()

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
if the process dies in that window (typically well under a millisecond), those
events are lost. The order of events is never changed, and a failed store is
reported by every later ``append``, ``sync`` and read, so nothing is lost silently.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

from toolkernel.errors import LedgerError
from toolkernel.ledger.base import Event, Ledger, NewEvent, RunSummary, VerifiedRead, VerifyReport

__all__ = ["GroupCommitLedger"]


_Batch = tuple[str, Sequence[NewEvent]]


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
        self._error: LedgerError | None = None
        self._closing = False
        self._writer = threading.Thread(target=self._write, name="toolkernel-ledger", daemon=True)
        self._writer.start()

    def append(self, run_id: str, events: Sequence[NewEvent]) -> list[Event]:
        """Queue ``events``; returns ``[]`` (the stored events are not known yet).

        Raises:
            LedgerError: an earlier batch could not be stored, or the ledger is closed.
        """
        self.append_batch([(run_id, events)])
        return []

    def append_batch(self, batches: Sequence[tuple[str, Sequence[NewEvent]]]) -> None:
        """Queue several runs' events for the writer.

        Raises:
            LedgerError: an earlier batch could not be stored, or the ledger is closed.
        """
        queued = [(run_id, list(events)) for run_id, events in batches]
        with self._lock:
            self._check()
            self._pending.extend(queued)
        self._wake.put(None)

    def append_durable(self, batches: Sequence[tuple[str, Sequence[NewEvent]]]) -> None:
        """Store these events, and what was queued before them, in the calling thread
        before returning, without waking the writer.

        Raises:
            LedgerError: the events could not be stored, or an earlier batch could not.
        """
        queued = [(run_id, list(events)) for run_id, events in batches]
        with self._storing:
            with self._lock:
                self._check()
                self._pending.extend(queued)
            self._store_pending()
        self._raise_error()

    def sync(self) -> None:
        """Store what is queued, here and now, unless the writer is already storing it.

        Raises:
            LedgerError: something appended earlier could not be stored.
        """
        with self._storing:
            self._store_pending()
        self._raise_error()

    def claim_key(self, tool_name: str, key: str, owner: str, lease_s: float) -> bool:
        """The inner ledger's claim, at once (claims are not queued).

        Raises:
            LedgerError: the claim could not be recorded, or an earlier batch could
                not be stored.
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
            LedgerError: queued events could not be stored.
        """
        with self._lock:
            already = self._closing
            self._closing = True
        if not already:
            self._wake.put(None)
            self._writer.join()
            with self._storing:
                self._store_pending()  # appends that raced with close
            self._inner.close()
        self._raise_error()

    def _raise_error(self) -> None:
        with self._lock:
            if self._error is not None:
                raise self._error

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closing:
            raise LedgerError("the ledger is closed")

    def _write(self) -> None:
        while True:
            self._wake.get()
            with self._storing:
                self._store_pending()
            with self._lock:
                if self._error is not None or (self._closing and not self._pending):
                    return

    def _store_pending(self) -> None:
        """Store everything queued in one transaction (the caller holds ``_storing``)."""
        with self._lock:
            batch, self._pending = self._pending, []
            if not batch or self._error is not None:
                return
        try:
            self._inner.append_batch(batch)
        except BaseException as exc:
            # Reported to every later caller; an interrupt (the storing caller's Ctrl-C)
            # also propagates, but the batch it took may be lost, so it is reported too.
            error = exc if isinstance(exc, LedgerError) else LedgerError(repr(exc))
            with self._lock:
                self._error = LedgerError(f"{len(batch)} queued appends were lost: {error}")
                self._error.__cause__ = exc
            if not isinstance(exc, Exception):
                raise
            return

"""Group commit: appends return at once; a writer thread stores them in batches.

``GroupCommitLedger`` wraps a ledger whose ``append`` stores before returning. Calls to
``append`` queue the events and return; one writer thread stores everything queued
so far in one transaction, so many calls share one commit. ``sync`` waits until
everything appended before it is stored — the kernel calls it wherever the pipeline
needs events on disk before going on (a human is asked, a call that can change
things starts, such a call's result is returned). Reads sync first.

The trade: a READ_ONLY call can return to the model before its events are stored;
if the process dies in that window (typically well under a millisecond), those
events are lost. The order of events is never changed, and a failed store is
reported by every later ``append``, ``sync`` and read, so nothing is lost silently.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Final

from toolkernel.errors import LedgerError
from toolkernel.ledger.base import Event, Ledger, NewEvent, RunSummary, VerifyReport

__all__ = ["GroupCommitLedger"]


_Batch = tuple[str, Sequence[NewEvent]]
_CLOSE: Final = ("", ())  # queued by close: the writer stores what came before, then stops


class GroupCommitLedger(Ledger):
    """A ledger whose appends are stored by a background writer, in batches.

    Args:
        inner: the ledger that stores (it must store before its ``append`` returns).
    """

    def __init__(self, inner: Ledger) -> None:
        self._inner = inner
        # An append is a lock, a check and a put; the writer blocks in ``get`` and is
        # woken by the put. Only ``sync`` and the writer's progress use the Condition.
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Batch] = queue.SimpleQueue()
        self._changed = threading.Condition()
        self._submitted = 0
        self._stored = 0
        self._error: LedgerError | None = None
        self._closing = False
        self._writer = threading.Thread(target=self._write, name="toolkernel-ledger", daemon=True)
        self._writer.start()

    def append(self, run_id: str, events: Sequence[NewEvent]) -> list[Event]:
        """Queue ``events``; returns ``[]`` (the stored events are not known yet).

        Raises:
            LedgerError: an earlier batch could not be stored, or the ledger is closed.
        """
        batch = (run_id, list(events))
        with self._lock:
            self._check()
            self._submitted += 1
            self._queue.put(batch)
        return []

    def sync(self) -> None:
        target = self._submitted  # every append that returned before this call
        with self._changed:
            while self._stored < target and self._error is None:
                self._changed.wait()
            if self._error is not None:
                raise self._error

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

    def close(self) -> None:
        """Store what is queued, stop the writer and close the inner ledger.

        Raises:
            LedgerError: queued events could not be stored.
        """
        with self._lock:
            already = self._closing
            self._closing = True
            if not already:
                self._queue.put(_CLOSE)
        if not already:
            self._writer.join()
            self._inner.close()
        with self._changed:
            if self._error is not None:
                raise self._error

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closing:
            raise LedgerError("the ledger is closed")

    def _write(self) -> None:
        closing = False
        while not closing:
            batch = [self._queue.get()]
            # Everything queued meanwhile goes into the same transaction.
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if batch[-1] is _CLOSE:
                batch.pop()  # close is queued last: nothing can follow it
                closing = True
            if not batch:
                continue
            try:
                self._inner.append_batch(batch)
            except Exception as exc:  # noqa: BLE001 - reported to every later caller
                error = exc if isinstance(exc, LedgerError) else LedgerError(str(exc))
                with self._changed:
                    self._error = LedgerError(f"{len(batch)} queued appends were lost: {error}")
                    self._error.__cause__ = exc
                    self._changed.notify_all()
                return
            with self._changed:
                self._stored += len(batch)
                self._changed.notify_all()

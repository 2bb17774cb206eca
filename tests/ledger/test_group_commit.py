"""Group commit: appends return at once, order and chain are kept, failures surface."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from toolkernel.codes import Status
from toolkernel.errors import LedgerError
from toolkernel.ledger import Event, EventType, GroupCommitLedger, NewEvent, SqliteLedger


def request(n: int) -> NewEvent:
    return NewEvent(EventType.TOOL_CALL_REQUEST, {"n": n}, f"c{n}")


def test_appends_from_many_threads_keep_per_thread_order_and_verify(tmp_path: Path):
    ledger = GroupCommitLedger(SqliteLedger(tmp_path / "l.db"))

    def work(run: str) -> None:
        for n in range(200):
            ledger.append(run, [request(n)])

    threads = [threading.Thread(target=work, args=(f"run-{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(4):
        events = ledger.events(f"run-{i}")
        assert [e.payload["n"] for e in events] == list(range(200))
        assert [e.seq for e in events] == list(range(1, 201))
    assert ledger.verify().ok
    ledger.close()


def test_sync_waits_until_everything_is_stored(tmp_path: Path):
    path = tmp_path / "l.db"
    ledger = GroupCommitLedger(SqliteLedger(path))
    for n in range(50):
        ledger.append("r", [request(n)])
    ledger.sync()
    with SqliteLedger(path) as reader:  # another connection sees it all
        assert len(reader.events("r")) == 50
    ledger.close()


def test_close_stores_what_is_queued(tmp_path: Path):
    path = tmp_path / "l.db"
    ledger = GroupCommitLedger(SqliteLedger(path))
    for n in range(20):
        ledger.append("r", [request(n)])
    ledger.close()
    with SqliteLedger(path) as reader:
        assert [e.payload["n"] for e in reader.events("r")] == list(range(20))


class Failing(SqliteLedger):
    def append_batch(self, batches: Sequence[tuple[str, Sequence[NewEvent]]]) -> None:
        raise LedgerError("disk full")

    def append(self, run_id: str, events: Sequence[NewEvent]) -> list[Event]:
        raise LedgerError("disk full")


def test_a_failed_store_is_reported_to_every_later_caller(tmp_path: Path):
    ledger = GroupCommitLedger(Failing(tmp_path / "l.db"))
    ledger.append("r", [request(1)])
    with pytest.raises(LedgerError, match="disk full"):
        ledger.sync()
    with pytest.raises(LedgerError, match="disk full"):
        ledger.append("r", [request(2)])
    with pytest.raises(LedgerError):
        ledger.close()


def test_kernel_with_group_commit_records_the_same_events(kernel_factory):
    kernel = kernel_factory(
        """
        [ledger]
        commit = "group"
        [[exposure]]
        tools = ["*"]
        """
    )
    run = kernel.start_run()
    results = [kernel.call_sync(run, "repo.lookup", {"query": str(i)}) for i in range(20)]
    assert all(r.status is Status.SUCCEEDED for r in results)
    events = kernel.ledger.events(run.id)
    finals = [e.tool_call_id for e in events if e.type is EventType.TOOL_CALL_RESULT]
    assert finals == [r.tool_call_id for r in results]
    assert kernel.ledger.verify().ok

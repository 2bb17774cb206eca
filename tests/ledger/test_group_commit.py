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


def test_appends_and_syncs_racing_from_many_threads_keep_order_and_are_stored(
    tmp_path: Path,
):
    # sync stores in the calling thread while the writer stores too: whoever takes the
    # queue stores it before anyone else may take more, so no batch overtakes another.
    path = tmp_path / "l.db"
    ledger = GroupCommitLedger(SqliteLedger(path))
    missing: list[tuple[str, int]] = []

    def work(run: str) -> None:
        with SqliteLedger(path) as reader:
            for n in range(150):
                ledger.append(run, [request(n)])
                if n % 7 == 0:
                    ledger.sync()
                    if len(reader.events(run)) != n + 1:
                        missing.append((run, n))

    threads = [threading.Thread(target=work, args=(f"run-{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert missing == []  # after sync, another connection sees every earlier append
    for i in range(4):
        assert [e.payload["n"] for e in ledger.events(f"run-{i}")] == list(range(150))
    assert ledger.verify().ok
    ledger.close()


class WriterGate(SqliteLedger):
    """Holds the writer thread inside its store until the test opens the gate, and
    remembers which thread stored each batch."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.writer_inside = threading.Event()
        self.open = threading.Event()
        self.threads: list[str] = []

    def append_batch(self, batches: Sequence[tuple[str, Sequence[NewEvent]]]) -> None:
        self.threads.append(threading.current_thread().name)
        if threading.current_thread().name == "toolkernel-ledger":
            self.writer_inside.set()
            assert self.open.wait(5)
        super().append_batch(batches)


def test_sync_waits_for_the_writers_batch_instead_of_overtaking_it(tmp_path: Path):
    inner = WriterGate(tmp_path / "l.db")
    ledger = GroupCommitLedger(inner)
    ledger.append("r", [request(1)])
    assert inner.writer_inside.wait(5)  # the writer holds request 1, not yet stored
    ledger.append("r", [request(2)])
    syncing = threading.Thread(target=ledger.sync)
    syncing.start()
    syncing.join(0.2)
    assert syncing.is_alive()  # it may not store request 2 before request 1
    inner.open.set()
    syncing.join(5)
    assert not syncing.is_alive()
    assert [e.payload["n"] for e in inner.events("r")] == [1, 2]
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


def test_a_durable_append_is_stored_by_the_caller_before_it_returns(tmp_path: Path):
    path = tmp_path / "l.db"
    inner = WriterGate(path)
    inner.open.set()
    ledger = GroupCommitLedger(inner)
    ledger.append_durable([("r", [request(1), request(2)])])
    assert inner.threads == [threading.current_thread().name]  # the writer was not woken
    with SqliteLedger(path) as reader:  # another connection sees it at once
        assert [e.payload["n"] for e in reader.events("r")] == [1, 2]
    ledger.close()

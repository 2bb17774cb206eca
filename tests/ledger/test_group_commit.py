"""Group commit: appends return at once, order and chain are kept, failures surface."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from toolkernel.codes import ErrorCode, Status
from toolkernel.errors import LedgerError
from toolkernel.ledger import Event, EventType, GroupCommitLedger, NewEvent, SqliteLedger
from toolkernel.ledger.group import MAX_QUEUED


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
    remembers which thread stored each batch. While ``full`` is set, a store stores
    nothing and raises what ``failure`` makes (a full disk, by default); ``stored`` is
    set by each store that succeeds."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.writer_inside = threading.Event()
        self.open = threading.Event()
        self.threads: list[str] = []
        self.full = threading.Event()
        self.failure: Callable[[], BaseException] = disk_full
        self.stored = threading.Event()

    def append_batch(self, batches: Sequence[tuple[str, Sequence[NewEvent]]]) -> None:
        self.threads.append(threading.current_thread().name)
        if threading.current_thread().name == "toolkernel-ledger":
            self.writer_inside.set()
            assert self.open.wait(5)
        if self.full.is_set():
            raise self.failure()
        super().append_batch(batches)
        self.stored.set()


def disk_full() -> LedgerError:
    return LedgerError("database or disk is full")


def full_ledger(path: Path) -> tuple[WriterGate, GroupCommitLedger]:
    """A group commit ledger whose stores fail, storing nothing, until ``full`` is
    cleared; the writer is not held."""
    inner = WriterGate(path)
    inner.open.set()
    inner.full.set()
    return inner, GroupCommitLedger(inner)


def on_disk(path: Path, run_id: str = "r") -> list[int]:
    """What another connection sees stored in ``run_id``, by payload number."""
    with SqliteLedger(path) as reader:
        return [e.payload["n"] for e in reader.events(run_id)]


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


def test_appends_that_outrun_the_writer_wait_for_it_at_the_bound_and_then_store_the_queue(
    tmp_path: Path,
):
    # A caller in a tight loop can starve the writer of the GIL; modelled here by a
    # writer held inside its store. The appends queue up to the bound, and the one that
    # reaches it waits until the writer has stored a batch; only the writer stores.
    inner = WriterGate(tmp_path / "l.db")
    ledger = GroupCommitLedger(inner)
    ledger.append("r", [request(0)])
    assert inner.writer_inside.wait(5)
    appended: list[int] = []

    def append_many() -> None:
        for n in range(1, MAX_QUEUED + 50):
            ledger.append("r", [request(n)])
            appended.append(n)

    appender = threading.Thread(target=append_many)
    appender.start()
    appender.join(0.3)
    assert appender.is_alive()  # held at the bound, not queueing without end
    assert len(appended) == MAX_QUEUED - 1  # the append that found the queue full waits
    inner.open.set()
    appender.join(5)
    assert not appender.is_alive()
    assert len(appended) == MAX_QUEUED + 49
    assert set(inner.threads) == {"toolkernel-ledger"}
    ledger.sync()
    assert on_disk(tmp_path / "l.db") == list(range(MAX_QUEUED + 50))
    assert ledger.verify().ok
    ledger.close()


INTERRUPTED_LOOP = """
import os, signal, sys, threading
from pathlib import Path
from toolkernel.ledger import EventType, GroupCommitLedger, NewEvent, SqliteLedger

# A shell's background job (`cmd &` without job control) starts with SIGINT ignored,
# and so would this process: Ctrl-C must be Ctrl-C here.
signal.signal(signal.SIGINT, signal.default_int_handler)
ledger = GroupCommitLedger(SqliteLedger(Path(sys.argv[1])))
threading.Timer(float(sys.argv[2]), lambda: os.kill(os.getpid(), signal.SIGINT)).start()
appended = 0
try:
    while True:
        event = NewEvent(EventType.TOOL_CALL_REQUEST, {"n": appended, "pad": "x" * 4000}, "c")
        ledger.append("r", [event])
        appended += 1
except KeyboardInterrupt:
    pass
ledger.close()  # raises if appends it took were lost
print(appended)
"""


@pytest.mark.parametrize("after_s", [0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
def test_ctrl_c_in_a_tight_loop_of_appends_loses_none_of_them(tmp_path: Path, after_s: float):
    # The loop keeps the writer behind, so appends wait at the bound when Ctrl-C comes;
    # an interrupt there, or anywhere in append, must leave what was taken to be stored.
    path = tmp_path / "l.db"
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_LOOP, str(path), str(after_s)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    appended = int(done.stdout)
    stored = on_disk(path)
    assert appended > MAX_QUEUED  # the loop ran long enough to reach the bound
    # An append the interrupt cut short after it queued its event is stored too.
    assert stored[:appended] == list(range(appended))
    assert len(stored) - appended in (0, 1)


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


def test_a_batch_that_stored_nothing_is_kept_and_stored_by_the_writers_retry(
    tmp_path: Path,
):
    # A full disk, or a lock another process held past the busy timeout: once space
    # is freed, a long-running process works again, without a restart.
    path = tmp_path / "l.db"
    inner, ledger = full_ledger(path)
    ledger.append("r", [request(1)])
    with pytest.raises(LedgerError) as failed:
        ledger.sync()
    inner.full.clear()
    assert inner.stored.wait(5)  # the writer tried again, and stored it
    ledger.sync()
    assert on_disk(path) == [1]
    ledger.append("r", [request(2)])
    assert [e.payload["n"] for e in ledger.events("r")] == [1, 2]
    assert ledger.verify().ok
    ledger.close()
    assert not failed.value.maybe_stored
    assert "cannot store events now" in str(failed.value)
    assert "lost" not in str(failed.value)


def test_while_a_batch_waits_for_its_retry_appends_are_refused_and_nothing_overtakes_it(
    tmp_path: Path,
):
    path = tmp_path / "l.db"
    inner = WriterGate(path)
    ledger = GroupCommitLedger(inner)
    ledger.append("r", [request(1)])
    assert inner.writer_inside.wait(5)  # the writer holds request 1
    ledger.append("r", [request(2)])
    ledger.append("r", [request(3)])
    inner.full.set()
    inner.open.set()  # request 1 fails; 2 and 3 were queued behind it
    with pytest.raises(LedgerError) as waiting:
        ledger.sync()
    with pytest.raises(LedgerError) as refused:
        ledger.append("r", [request(4)])
    with pytest.raises(LedgerError):
        ledger.events("r")
    inner.full.clear()
    assert inner.stored.wait(5)
    ledger.sync()
    assert on_disk(path) == [1, 2, 3]
    ledger.append("r", [request(4)])  # refused before, appended again
    assert [e.payload["n"] for e in ledger.events("r")] == [1, 2, 3, 4]
    assert ledger.verify().ok
    ledger.close()
    assert "3 queued appends wait" in str(waiting.value)
    assert "cannot store events now" in str(refused.value)
    assert not refused.value.maybe_stored


def test_close_says_how_many_appends_were_lost_when_they_still_cannot_be_stored(
    tmp_path: Path,
):
    path = tmp_path / "l.db"
    _, ledger = full_ledger(path)
    ledger.append_batch([("r", [request(1)]), ("r", [request(2)])])
    with pytest.raises(LedgerError, match="cannot store events now"):
        ledger.sync()
    with pytest.raises(LedgerError, match="2 queued appends were lost"):
        ledger.close()
    with pytest.raises(LedgerError, match="2 queued appends were lost"):
        ledger.append("r", [request(3)])
    assert on_disk(path) == []


def test_close_stores_what_waited_once_the_ledger_can_store_again(tmp_path: Path):
    path = tmp_path / "l.db"
    inner, ledger = full_ledger(path)
    ledger.append("r", [request(1)])
    with pytest.raises(LedgerError):
        ledger.sync()
    inner.full.clear()
    ledger.close()  # the writer's retry or close's last attempt stores it
    assert on_disk(path) == [1]


def connection_dropped() -> LedgerError:
    error = LedgerError("the connection dropped during the commit")
    error.maybe_stored = True
    return error


def a_bug() -> RuntimeError:
    return RuntimeError("not a ledger failure")


@pytest.mark.parametrize("failure", [connection_dropped, a_bug])
def test_a_store_that_may_have_stored_the_batch_is_never_retried(
    tmp_path: Path, failure: Callable[[], BaseException]
):
    # Storing it again could store its events twice.
    path = tmp_path / "l.db"
    inner, ledger = full_ledger(path)
    inner.failure = failure
    ledger.append("r", [request(1)])
    with pytest.raises(LedgerError, match="1 queued appends were lost"):
        ledger.sync()
    inner.full.clear()
    with pytest.raises(LedgerError, match="1 queued appends were lost"):
        ledger.append("r", [request(2)])
    with pytest.raises(LedgerError, match="1 queued appends were lost"):
        ledger.close()
    assert len(inner.threads) == 1  # one attempt, never repeated
    assert on_disk(path) == []


def test_a_durable_append_that_could_not_be_stored_is_not_stored_later(tmp_path: Path):
    # Its caller is told nothing was stored and appends the events again: were they
    # still queued, the retry would store them twice.
    path = tmp_path / "l.db"
    inner, ledger = full_ledger(path)
    with pytest.raises(LedgerError, match="disk is full") as failed:
        ledger.append_durable([("r", [request(1)])])
    assert not failed.value.maybe_stored
    inner.full.clear()
    ledger.append_durable([("r", [request(1)])])
    ledger.close()
    assert on_disk(path) == [1]


def test_a_kernel_with_group_commit_works_again_once_its_ledger_can_store(
    kernel_factory, calls, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    inner = WriterGate(tmp_path / "l.db")
    inner.open.set()
    ledger = GroupCommitLedger(inner)
    kernel = kernel_factory('[[exposure]]\ntools = ["*"]\n', ledger=ledger)
    run = kernel.start_run()
    first = kernel.call_sync(run, "repo.lookup", {"query": "a"})
    ledger.sync()
    inner.stored.clear()
    inner.full.set()
    second = kernel.call_sync(run, "repo.lookup", {"query": "b"})  # stored later
    with pytest.raises(LedgerError):
        ledger.sync()
    ran = calls.count["repo.lookup"]
    refused = kernel.call_sync(run, "repo.lookup", {"query": "c"})
    assert (refused.error_code, refused.retryable) == (ErrorCode.LEDGER_UNAVAILABLE, True)
    assert calls.count["repo.lookup"] == ran  # refused before it ran: its events had no place
    inner.full.clear()
    assert inner.stored.wait(5)
    ledger.sync()
    fourth = kernel.call_sync(run, "repo.lookup", {"query": "d"})
    assert [r.status for r in (first, second, fourth)] == [Status.SUCCEEDED] * 3
    events = ledger.events(run.id)
    finals = [e.tool_call_id for e in events if e.type is EventType.TOOL_CALL_RESULT]
    assert finals == [first.tool_call_id, second.tool_call_id, fourth.tool_call_id]
    assert ledger.verify().ok
    assert "cannot store events now" in caplog.text


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


PROGRAM_WITHOUT_CLOSE = """
import sys
from pathlib import Path
from toolkernel.ledger import GroupCommitLedger, NewEvent, EventType, SqliteLedger

ledger = GroupCommitLedger(SqliteLedger(Path(sys.argv[1])))
for n in range(int(sys.argv[2])):
    ledger.append("r", [NewEvent(EventType.TOOL_CALL_REQUEST, {"n": n}, f"c{n}")])
# ends here: no close(), no sync()
"""


def test_a_program_that_ends_without_closing_still_stores_what_it_queued(tmp_path: Path):
    import subprocess
    import sys

    path = tmp_path / "l.db"
    subprocess.run(
        [sys.executable, "-c", PROGRAM_WITHOUT_CLOSE, str(path), "200"], check=True, timeout=60
    )
    assert on_disk(path) == list(range(200))

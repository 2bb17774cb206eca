"""The ledger contract, against every backend: round trips, the hash chain, tamper
detection, concurrency.

Every test that takes ``backend`` (or ``ledger``) runs once per backend, each time on
storage of its own: a new SQLite file, or a new schema in the throwaway PostgreSQL
cluster of ``conftest.dsn``. What only one backend does is tested in
``test_sqlite_ledger`` and ``test_postgres_ledger``.
"""

from __future__ import annotations

import abc
import itertools
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkernel.canonical import canonical_json
from toolkernel.errors import LedgerCorrupted
from toolkernel.ledger import (
    GENESIS_HASH,
    Event,
    EventType,
    Ledger,
    LedgerError,
    NewEvent,
    SqliteLedger,
    event_hash,
)
from toolkernel.ledger.base import chained_hash
from toolkernel.ledger.postgres import PostgresLedger

SRC = Path(__file__).resolve().parents[2] / "src"


# --- backends -------------------------------------------------------------------------


class Backend(abc.ABC):
    """Storage of one backend, new for one test: ledgers open on it, SQL edits it."""

    name: ClassVar[str]
    tool_call_ids: ClassVar[st.SearchStrategy[str]]
    """The tool call ids the backend can store."""

    @abc.abstractmethod
    def open(self) -> Ledger:
        """A new ledger on this storage."""

    def reopen(self) -> Ledger:
        """A ledger on this storage, opened as a later process would."""
        return self.open()

    @abc.abstractmethod
    def tamper(self, sql: str, params: tuple[object, ...] = ()) -> None:
        """Edit the tables behind the ledgers' back, as an attacker would.

        ``sql`` takes ``?`` placeholders on every backend.
        """

    @property
    @abc.abstractmethod
    def location(self) -> list[str]:
        """What a worker process needs, after the backend's name, to open a ledger here."""

    def prepare_for_workers(self) -> None:  # noqa: B027 - most backends need nothing
        """Whatever must exist before several worker processes open this storage."""

    @abc.abstractmethod
    def remove(self) -> None:
        """Delete the storage."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


class SqliteBackend(Backend):
    name = "sqlite"
    tool_call_ids = st.text(max_size=6)

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / "ledger" / "events.db"

    def open(self) -> Ledger:
        return SqliteLedger(self.path)

    def reopen(self) -> Ledger:
        # The other durability mode: the chain does not depend on the one that wrote it.
        return SqliteLedger(self.path, synchronous="full")

    def tamper(self, sql: str, params: tuple[object, ...] = ()) -> None:
        conn = sqlite3.connect(self.path)
        try:
            with conn:
                conn.execute(sql, params)
        finally:
            conn.close()

    @property
    def location(self) -> list[str]:
        return [str(self.path)]

    def prepare_for_workers(self) -> None:
        SqliteLedger(self.path).close()  # create the schema once: workers race on appends only

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class PostgresBackend(Backend):
    name = "postgres"
    # PostgreSQL text cannot hold NUL; the ledger refuses it (see test_postgres_ledger).
    tool_call_ids = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=6)

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.schema = f"t_{uuid.uuid4().hex[:12]}"

    def open(self) -> Ledger:
        return PostgresLedger(self.dsn, schema=self.schema)

    def tamper(self, sql: str, params: tuple[object, ...] = ()) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("SELECT set_config('search_path', %s, false)", (self.schema,))
            conn.execute(sql.replace("?", "%s").encode(), params)

    @property
    def location(self) -> list[str]:
        # No prepare_for_workers: the workers create the schema together, as deployed ones do.
        return [self.dsn, self.schema]

    def remove(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE'.encode())


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def new_backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[], Backend]:
    """Makes new storage of one backend; the PostgreSQL cluster starts only if asked for."""
    if request.param == "sqlite":
        return lambda: SqliteBackend(tmp_path_factory.mktemp("sqlite"))
    dsn: str = request.getfixturevalue("dsn")
    return lambda: PostgresBackend(dsn)


@pytest.fixture
def backend(new_backend: Callable[[], Backend]) -> Backend:
    # Left behind like tmp_path: the temporary directories and the cluster go at the end.
    return new_backend()


@pytest.fixture
def ledger(backend: Backend) -> Iterator[Ledger]:
    with backend.open() as opened:
        yield opened


def request(n: int, *, call: str | None = None) -> NewEvent:
    return NewEvent(EventType.TOOL_CALL_REQUEST, {"n": n, "args": ["a", n]}, call or f"c{n}")


def kinds(ledger: Ledger, run_id: str | None = None) -> set[str]:
    return {p.kind for p in ledger.verify(run_id).problems}


# --- round trip and chain -------------------------------------------------------------


def test_appended_events_read_back_identically(ledger: Ledger) -> None:
    stored = ledger.append("run-1", [request(1), request(2)])
    result = NewEvent(EventType.TOOL_CALL_RESULT, {"ok": True, "text": "é\0✓"})
    stored += ledger.append("run-1", [result])

    assert ledger.events("run-1") == stored
    assert [e.payload for e in stored] == [
        {"n": 1, "args": ["a", 1]},
        {"n": 2, "args": ["a", 2]},
        {"ok": True, "text": "é\0✓"},
    ]
    assert [e.type for e in stored] == [
        EventType.TOOL_CALL_REQUEST,
        EventType.TOOL_CALL_REQUEST,
        EventType.TOOL_CALL_RESULT,
    ]
    assert stored[2].tool_call_id is None


def test_each_event_is_chained_to_the_one_before(ledger: Ledger) -> None:
    for n in range(5):
        ledger.append("run-1", [request(n)])
    events = ledger.events("run-1")

    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert events[0].prev_hash == GENESIS_HASH
    for before, after in itertools.pairwise(events):
        assert after.prev_hash == before.hash
    for e in events:
        assert e.hash == event_hash(
            e.run_id, e.seq, e.type, e.at, e.tool_call_id, e.payload, e.prev_hash
        )


def test_a_group_gets_contiguous_seqs_and_one_timestamp(ledger: Ledger) -> None:
    ledger.append("run-1", [request(0)])
    group = ledger.append("run-1", [request(1), request(2), request(3)])

    assert [e.seq for e in group] == [2, 3, 4]
    assert len({e.at for e in group}) == 1
    assert group[0].at.endswith("Z")
    assert len(group[0].at) == len("2026-11-29T19:20:01.123456Z")


def test_runs_have_independent_chains(ledger: Ledger) -> None:
    ledger.append("run-a", [request(1)])
    ledger.append("run-b", [request(1), request(2)])
    ledger.append("run-a", [request(2)])

    assert [e.seq for e in ledger.events("run-a")] == [1, 2]
    assert [e.seq for e in ledger.events("run-b")] == [1, 2]
    assert ledger.events("run-b")[0].prev_hash == GENESIS_HASH
    assert [(r.run_id, r.events) for r in ledger.runs()] == [("run-a", 2), ("run-b", 2)]


def test_events_after_a_seq_are_only_the_later_ones(ledger: Ledger) -> None:
    ledger.append("run-1", [request(n) for n in range(4)])

    assert [e.seq for e in ledger.events("run-1", after_seq=2)] == [3, 4]
    assert ledger.events("unknown-run") == []


def test_an_empty_append_stores_nothing(ledger: Ledger) -> None:
    assert ledger.append("run-1", []) == []
    ledger.append_batch([("run-1", []), ("run-2", [])])
    assert ledger.runs() == []


def test_reopening_continues_the_chain(backend: Backend) -> None:
    with backend.open() as first:
        last = first.append("run-1", [request(1), request(2)])[-1]
    with backend.reopen() as second:
        (event,) = second.append("run-1", [request(3)])

        assert (event.seq, event.prev_hash) == (3, last.hash)
        assert second.verify().ok


def test_two_ledgers_on_the_same_storage_interleave_into_one_chain(backend: Backend) -> None:
    # Each instance caches the run's head; every append by the other makes it stale.
    with backend.open() as a, backend.open() as b:
        for n in range(6):
            (a if n % 2 else b).append("shared", [request(n)])
        events = a.events("shared")

        assert [e.seq for e in events] == list(range(1, 7))
        assert [e.payload["n"] for e in events] == list(range(6))
        assert a.verify().ok


def test_threads_sharing_one_ledger_append_one_gap_free_chain(ledger: Ledger) -> None:
    def work(worker: int) -> None:
        for n in range(50):
            ledger.append("shared", [request(n, call=f"w{worker}"), request(n)])

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert [e.seq for e in ledger.events("shared")] == list(range(1, 401))
    assert ledger.verify().ok


_WORKER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from toolkernel.ledger import EventType, NewEvent, SqliteLedger
    from toolkernel.ledger.postgres import PostgresLedger

    backend, worker, count, where = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    if backend == "sqlite":
        opened = SqliteLedger(Path(where[0]))
    else:
        opened = PostgresLedger(where[0], schema=where[1])
    with opened as ledger:
        print("ready", flush=True)
        sys.stdin.readline()  # start line: every worker is open before any appends
        for n in range(count):
            events = [NewEvent(EventType.TOOL_CALL_REQUEST, {"w": worker, "n": n}, worker)]
            if n % 3 == 0:
                events.append(NewEvent(EventType.TOOL_CALL_RESULT, {"w": worker, "n": n}))
            if n % 50 == 0:
                ledger.append_batch([("shared", events), (f"own-{worker}", events)])
            else:
                ledger.append("shared", events)
    """
)


def test_processes_appending_to_one_run_make_one_gap_free_chain(backend: Backend) -> None:
    # Each append whose cached head went stale re-chains onto the stored head. Whether
    # the workers interleave is up to the OS scheduler (with SQLite they do, about 30
    # times on a 2-core machine); the stale-head path itself is pinned down
    # deterministically by test_two_ledgers_on_the_same_storage_interleave_into_one_chain.
    workers, count = 4, 300
    backend.prepare_for_workers()
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, backend.name, f"w{w}", str(count), *backend.location],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    try:
        # A worker that dies before the start line gives EOF here, not a hang.
        ready = [proc.stdout.readline() if proc.stdout else "" for proc in procs]
        for proc in procs:
            if proc.stdin:
                proc.stdin.write("go\n")
                proc.stdin.flush()
        for proc in procs:
            _, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err
    finally:
        for proc in procs:
            proc.kill()
    assert ready == ["ready\n"] * workers

    with backend.open() as ledger:
        events = ledger.events("shared")
        per_worker = count + len(range(0, count, 3))

        assert [e.seq for e in events] == list(range(1, workers * per_worker + 1))
        for w in range(workers):
            mine = [e.payload["n"] for e in events if e.payload["w"] == f"w{w}"]
            assert mine == sorted(mine)
            assert len(mine) == per_worker
        assert len(ledger.runs()) == workers + 1
        assert ledger.verify().ok


# --- idempotency index ----------------------------------------------------------------


def test_an_indexed_event_is_found_by_tool_and_key(ledger: Ledger) -> None:
    ledger.append("run-1", [request(1)])
    result = NewEvent(
        EventType.TOOL_CALL_RESULT, {"status": "SUCCEEDED"}, "c2", index_key=("file.patch", "k-1")
    )
    _, stored = ledger.append("run-1", [request(2), result])

    assert ledger.find_indexed("file.patch", "k-1") == stored
    assert ledger.find_indexed("file.patch", "k-2") is None
    assert ledger.find_indexed("file.write", "k-1") is None


def test_the_first_event_under_a_key_keeps_it(ledger: Ledger) -> None:
    def keyed(n: int) -> NewEvent:
        return NewEvent(EventType.TOOL_CALL_RESULT, {"try": n}, index_key=("file.patch", "k"))

    first, _ = ledger.append("run-1", [keyed(1), keyed(2)])
    ledger.append("run-2", [keyed(3)])
    ledger.append_batch([("run-3", [keyed(4)])])

    assert ledger.find_indexed("file.patch", "k") == first


# --- verify and tampering -------------------------------------------------------------


def test_verify_is_ok_on_a_clean_ledger(ledger: Ledger) -> None:
    ledger.append("run-a", [request(n) for n in range(3)])
    ledger.append("run-b", [request(1)])
    report = ledger.verify()

    assert report.ok
    assert (report.runs_checked, report.events_checked) == (2, 4)
    assert ledger.verify("run-b").events_checked == 1


# JSON that Python's reader gives up on (RecursionError).
_DEEP = "[" * 5000 + "]" * 5000

# Well-formed, and not the hash of anything stored.
_FORGED_HASH = "sha256:" + "5eed" * 16

_TAMPERING = {
    "edited payload": (
        'UPDATE events SET payload = \'{"args":["a",2],"n":99}\' WHERE seq = 2',
        {"hash_mismatch"},
    ),
    "edited type": (
        "UPDATE events SET type = 'TOOL_CALL_RESULT' WHERE seq = 2",
        {"hash_mismatch"},
    ),
    "edited time": (
        "UPDATE events SET at = '2020-01-01T00:00:00.000000Z' WHERE seq = 2",
        {"hash_mismatch"},
    ),
    "edited tool call id": (
        "UPDATE events SET tool_call_id = 'x' WHERE seq = 2",
        {"hash_mismatch"},
    ),
    "unknown type": (
        "UPDATE events SET type = 'NOPE' WHERE seq = 2",
        {"bad_payload", "hash_mismatch"},
    ),
    "non-canonical payload": (
        'UPDATE events SET payload = \'{"n": 2, "args": ["a", 2]}\' WHERE seq = 2',
        {"bad_payload"},
    ),
    "payload not JSON": ("UPDATE events SET payload = 'not json' WHERE seq = 2", {"bad_payload"}),
    "payload not an object": (
        "UPDATE events SET payload = '[1,2]' WHERE seq = 2",
        {"bad_payload", "hash_mismatch"},
    ),
    "payload nested past the JSON reader": (
        f"UPDATE events SET payload = '{_DEEP}' WHERE seq = 2",
        {"bad_payload"},
    ),
    "re-hashed edit": (
        f"UPDATE events SET hash = '{_FORGED_HASH}' WHERE seq = 2",
        {"hash_mismatch", "broken_link"},
    ),
    "deleted middle event": ("DELETE FROM events WHERE seq = 2", {"gap"}),
    "deleted tail": ("DELETE FROM events WHERE seq >= 3", {"head_mismatch"}),
    "deleted run": ("DELETE FROM events", {"head_mismatch"}),
    "deleted head": ("DELETE FROM heads", {"head_mismatch"}),
}


@pytest.mark.parametrize("change", sorted(_TAMPERING))
def test_verify_detects_tampering(ledger: Ledger, backend: Backend, change: str) -> None:
    ledger.append("run-1", [request(n) for n in range(1, 5)])
    sql, expected = _TAMPERING[change]
    backend.tamper(sql)

    assert not ledger.verify().ok
    assert kinds(ledger) == expected


def test_verify_detects_two_events_swapped(ledger: Ledger, backend: Backend) -> None:
    ledger.append("run-1", [request(n) for n in range(1, 5)])
    for old, new in ((2, 100), (3, 2), (100, 3)):
        backend.tamper("UPDATE events SET seq = ? WHERE seq = ?", (new, old))

    assert {"hash_mismatch", "broken_link"} <= kinds(ledger)


def test_verify_of_one_run_ignores_damage_elsewhere(ledger: Ledger, backend: Backend) -> None:
    ledger.append("run-a", [request(1), request(2)])
    ledger.append("run-b", [request(1), request(2)])
    backend.tamper("DELETE FROM events WHERE run_id = 'run-b' AND seq = 2")

    assert ledger.verify("run-a").ok
    assert [(p.run_id, p.kind) for p in ledger.verify().problems] == [("run-b", "head_mismatch")]


# --- the idempotency index -------------------------------------------------------------


def keyed_call(key: str, *, status: str = "SUCCEEDED", indexed: bool = True) -> list[NewEvent]:
    """A REQUEST and RESULT of ``file.write`` under ``key``, as the kernel records them."""
    call = f"call-{key}"
    result = {"toolName": "file.write", "idempotencyKey": key, "result": {"status": status}}
    index = ("file.write", key) if indexed else None
    return [
        NewEvent(
            EventType.TOOL_CALL_REQUEST, {"toolName": "file.write", "idempotencyKey": key}, call
        ),
        NewEvent(EventType.TOOL_CALL_RESULT, result, call, index_key=index),
    ]


def index_problems(ledger: Ledger, run_id: str | None = None) -> list[tuple[str, int | None]]:
    report = ledger.verify(run_id)
    assert {p.kind for p in report.problems} <= {"index_mismatch"}
    return [(p.run_id, p.seq) for p in report.problems]


# Run "run-1": k1's REQUEST and RESULT at seq 1 and 2, k2's at 3 and 4.
_INDEX_TAMPERING = {
    "entry moved to the call's REQUEST": (
        "UPDATE idempotency SET seq = 1 WHERE key = 'k1'",
        [("run-1", 1)],
    ),
    "entry moved to another key's RESULT": (
        "UPDATE idempotency SET seq = 4 WHERE key = 'k1'",
        [("run-1", 4)],
    ),
    "entry moved past the last event": (
        "UPDATE idempotency SET seq = 99 WHERE key = 'k1'",
        [("run-1", 99)],
    ),
    "entry moved to a run without events": (
        "UPDATE idempotency SET run_id = 'ghost' WHERE key = 'k1'",
        [("ghost", 2)],
    ),
    "entry renamed to another key": (
        "UPDATE idempotency SET key = 'k9' WHERE key = 'k1'",
        [("run-1", 2), ("run-1", 2)],  # k9's entry names k1's RESULT, and k1 has none
    ),
    "entry deleted": ("DELETE FROM idempotency WHERE key = 'k1'", [("run-1", 2)]),
}


@pytest.mark.parametrize("change", sorted(_INDEX_TAMPERING))
def test_verify_reports_an_index_entry_that_is_not_its_keys_result(
    ledger: Ledger, backend: Backend, change: str
) -> None:
    ledger.append("run-1", keyed_call("k1") + keyed_call("k2"))
    assert ledger.verify().ok
    sql, expected = _INDEX_TAMPERING[change]
    backend.tamper(sql)

    assert index_problems(ledger) == expected


@pytest.mark.parametrize(
    ("status", "stored_under_key"),
    [
        ("SUCCEEDED", True),
        ("PARTIAL", True),
        ("FAILED", True),
        ("DENIED", False),
        ("INVALID_ARGUMENTS", False),
        ("CANCELLED", False),
        ("TIMED_OUT", False),
    ],
)
def test_a_keyed_result_needs_an_index_entry_if_the_kernel_stores_it_under_the_key(
    ledger: Ledger, status: str, stored_under_key: bool
) -> None:
    ledger.append("run-1", keyed_call("k1", status=status, indexed=False))

    assert index_problems(ledger) == ([("run-1", 2)] if stored_under_key else [])


@pytest.mark.parametrize(
    "marker",
    [
        {"replayedFrom": {"runId": "run-0", "seq": 2}},
        {"sharedWith": "call-first"},
        {"internal": {"interrupted": "RuntimeError"}},
    ],
    ids=["replayed", "shared", "interrupted"],
)
def test_a_result_copied_from_another_call_needs_no_index_entry(
    ledger: Ledger, marker: dict[str, object]
) -> None:
    result = {"toolName": "file.write", "idempotencyKey": "k1", "result": {"status": "SUCCEEDED"}}
    ledger.append("run-1", [NewEvent(EventType.TOOL_CALL_RESULT, {**result, **marker}, "c")])

    assert ledger.verify().ok


def test_a_second_result_stored_under_a_key_is_reported(ledger: Ledger) -> None:
    # Its entry gone (deleted), a key's call ran again: the new entry verifies, so only
    # the two results under one key tell. Copies of a result (replayed, shared) are not
    # results of their own and are not counted.
    ledger.append("run-1", keyed_call("k1", indexed=False))
    ledger.append("run-2", keyed_call("k1"))

    assert index_problems(ledger) == [("run-2", 2)]
    assert "ran twice" in ledger.verify().problems[0].detail


def test_an_index_entry_whose_event_is_gone_is_refused_when_looked_up(
    ledger: Ledger, backend: Backend
) -> None:
    ledger.append("run-1", keyed_call("k1") + keyed_call("k2"))
    backend.tamper("DELETE FROM events WHERE seq = 2")

    with pytest.raises(LedgerCorrupted, match="points at seq 2 of run 'run-1'"):
        ledger.find_indexed("file.write", "k1")
    found = ledger.find_indexed("file.write", "k2")
    assert found is not None
    assert found.seq == 4
    assert ledger.find_indexed("file.write", "k3") is None


def test_verify_of_one_run_checks_the_index_entries_pointing_into_it(
    ledger: Ledger, backend: Backend
) -> None:
    ledger.append("run-a", keyed_call("ka"))
    ledger.append("run-b", keyed_call("kb"))
    backend.tamper("UPDATE idempotency SET seq = 1 WHERE key = 'kb'")

    assert index_problems(ledger, "run-a") == []
    assert index_problems(ledger, "run-b") == [("run-b", 1)]


_UNDECODABLE = {
    "unknown type": "UPDATE events SET type = 'NOPE'",
    "payload not JSON": "UPDATE events SET payload = 'not json'",
    "payload an array": "UPDATE events SET payload = '[1,2]'",
    "payload a string": "UPDATE events SET payload = '\"text\"'",
    "payload null": "UPDATE events SET payload = 'null'",
    "payload nested past the JSON reader": f"UPDATE events SET payload = '{_DEEP}'",
}


@pytest.mark.parametrize("change", sorted(_UNDECODABLE))
def test_reading_an_undecodable_event_raises_ledger_error(
    ledger: Ledger, backend: Backend, change: str
) -> None:
    """What ``verify`` reports as ``bad_payload`` is never handed to a reader as an
    event: every payload a reader gets is an object (``Event.payload`` is a dict)."""
    indexed = NewEvent(EventType.TOOL_CALL_REQUEST, {"n": 1}, "c1", index_key=("tool", "k"))
    ledger.append("run-1", [indexed])
    backend.tamper(_UNDECODABLE[change])

    with pytest.raises(LedgerError, match="cannot be decoded"):
        ledger.events("run-1")
    with pytest.raises(LedgerError, match="cannot be decoded"):
        ledger.find_indexed("tool", "k")


def test_appending_to_a_run_whose_head_is_gone_raises_and_stores_nothing(
    ledger: Ledger, backend: Backend
) -> None:
    ledger.append("run-1", [request(1)])
    backend.tamper("DELETE FROM heads")
    with backend.open() as fresh:  # no cached head: it must trust the table
        with pytest.raises(LedgerError, match="disagree"):
            fresh.append("run-1", [request(2), request(3)])

        assert [e.seq for e in fresh.events("run-1")] == [1]


# --- failures -------------------------------------------------------------------------


def test_a_payload_json_cannot_carry_stores_nothing(ledger: Ledger) -> None:
    with pytest.raises(TypeError):
        ledger.append("run-1", [request(1), NewEvent(EventType.TOOL_CALL_RESULT, {"x": {1, 2}})])
    with pytest.raises(ValueError, match=r"NaN|Out of range"):
        ledger.append("run-1", [NewEvent(EventType.TOOL_CALL_RESULT, {"x": float("nan")})])

    assert ledger.events("run-1") == []


def test_a_closed_ledger_raises_and_closing_twice_is_harmless(backend: Backend) -> None:
    ledger = backend.open()
    ledger.close()
    ledger.close()

    with pytest.raises(LedgerError, match="closed"):
        ledger.append("run-1", [request(1)])
    with pytest.raises(LedgerError, match="closed"):
        ledger.verify()


# --- properties -----------------------------------------------------------------------

_json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
)
_json = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
_payloads = st.dictionaries(st.text(max_size=6), _json, max_size=4)
_MUTATIONS = ["payload", "type", "seq", "delete"]


def _new_events(tool_call_ids: st.SearchStrategy[str]) -> st.SearchStrategy[NewEvent]:
    return st.builds(
        NewEvent,
        type=st.sampled_from(EventType),
        payload=_payloads,
        tool_call_id=st.none() | tool_call_ids,
    )


def _workloads(
    tool_call_ids: st.SearchStrategy[str],
) -> st.SearchStrategy[list[tuple[str, list[NewEvent]]]]:
    """Appends of 1-3 events, each to one of three runs."""
    return st.lists(
        st.tuples(
            st.sampled_from(["run-a", "run-b", "run-c"]),
            st.lists(_new_events(tool_call_ids), min_size=1, max_size=3),
        ),
        min_size=1,
        max_size=8,
    )


@given(
    run_id=st.text(max_size=8),
    seq=st.integers(min_value=1, max_value=2**40),
    event=_new_events(st.text(max_size=6)),
    prev=st.text(max_size=8),
)
def test_the_fast_hash_equals_the_reference_hash(
    run_id: str, seq: int, event: NewEvent, prev: str
) -> None:
    # Every backend chains with chained_hash; event_hash is the definition.
    at = "2026-11-29T19:20:01.123456Z"
    assert chained_hash(
        run_id, seq, event.type, at, event.tool_call_id, canonical_json(event.payload), prev
    ) == event_hash(run_id, seq, event.type, at, event.tool_call_id, event.payload, prev)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    batched=st.booleans(),
    mutation=st.sampled_from(_MUTATIONS),
    pick=st.integers(min_value=0),
)
def test_any_single_change_to_a_stored_row_fails_verify(
    new_backend: Callable[[], Backend],
    data: st.DataObject,
    batched: bool,
    mutation: str,
    pick: int,
) -> None:
    # Each example on storage of its own, deleted after it.
    with new_backend() as backend, backend.open() as ledger:
        workload = data.draw(_workloads(backend.tool_call_ids), label="workload")
        if batched:
            ledger.append_batch(workload)
            appended = [e for run in sorted({r for r, _ in workload}) for e in ledger.events(run)]
        else:
            appended = [e for run_id, events in workload for e in ledger.append(run_id, events)]

        assert ledger.verify().ok
        assert sorted(appended, key=lambda e: (e.run_id, e.seq)) == [
            e for run in sorted({e.run_id for e in appended}) for e in ledger.events(run)
        ]

        victim = appended[pick % len(appended)]
        _mutate(backend, victim, mutation)
        assert not ledger.verify().ok


def _mutate(backend: Backend, victim: Event, mutation: str) -> None:
    where, key = "WHERE run_id = ? AND seq = ?", (victim.run_id, victim.seq)
    if mutation == "payload":
        changed = canonical_json({"tampered": victim.payload}).decode()
        backend.tamper(f"UPDATE events SET payload = ? {where}", (changed, *key))
    elif mutation == "type":
        other = next(t for t in EventType if t != victim.type)
        backend.tamper(f"UPDATE events SET type = ? {where}", (other.value, *key))
    elif mutation == "seq":
        backend.tamper(f"UPDATE events SET seq = seq + 1000 {where}", key)
    else:
        backend.tamper(f"DELETE FROM events {where}", key)


def test_verify_lists_calls_that_have_a_request_and_no_result(ledger):
    """A process that died mid-call leaves such a call; the chain itself is intact."""
    ledger.append(
        "run_a",
        [
            NewEvent(EventType.TOOL_CALL_REQUEST, {"toolName": "x"}, "call_done"),
            NewEvent(EventType.TOOL_CALL_RESULT, {"result": {}}, "call_done"),
            NewEvent(EventType.TOOL_CALL_REQUEST, {"toolName": "x"}, "call_cut"),
            NewEvent(EventType.TOOL_CALL_STARTED, {"toolName": "x"}, "call_cut"),
        ],
    )
    report = ledger.verify()
    assert report.ok
    assert report.unfinished == [("run_a", "call_cut")]


def test_a_call_left_open_stays_unfinished_when_a_refused_repeat_of_its_id_ends(ledger):
    # The kernel refuses a repeat of an open id with a REQUEST and a RESULT of its own:
    # that RESULT ends the repeat (the latest open REQUEST of the id), not the first call.
    ledger.append(
        "run_a",
        [
            NewEvent(EventType.TOOL_CALL_REQUEST, {"toolName": "deploy"}, "c1"),
            NewEvent(EventType.APPROVAL_REQUESTED, {"toolName": "deploy"}, "c1"),
            NewEvent(EventType.TOOL_CALL_REQUEST, {"toolName": "explain"}, "c1"),
            NewEvent(EventType.TOOL_CALL_RESULT, {"result": {}}, "c1"),
        ],
    )
    assert ledger.verify().unfinished == [("run_a", "c1")]


def test_read_verified_gives_the_events_and_the_report_of_one_read(ledger: Ledger) -> None:
    ledger.append("run-b", [request(1)])
    ledger.append("run-a", [request(n) for n in range(1, 4)])

    whole, one = ledger.read_verified(), ledger.read_verified("run-a")

    assert whole.report == ledger.verify()
    assert whole.report.ok
    assert whole.events == ledger.events("run-b") + ledger.events("run-a")  # oldest run first
    assert one.events == ledger.events("run-a")
    assert one.report == ledger.verify("run-a")
    assert whole.left_out == {} == one.left_out


@pytest.mark.parametrize("change", sorted(_TAMPERING))
def test_read_verified_reports_what_verify_reports(
    ledger: Ledger, backend: Backend, change: str
) -> None:
    ledger.append("run-1", [request(n) for n in range(1, 5)])
    ledger.append("run-2", [request(1)])
    sql = _TAMPERING[change][0]
    only_run_1 = " WHERE run_id = 'run-1'"
    backend.tamper(
        sql.replace(" WHERE", f"{only_run_1} AND") if "WHERE" in sql else sql + only_run_1
    )

    read = ledger.read_verified()

    assert read.report == ledger.verify()
    assert [e.run_id for e in read.events if e.run_id == "run-2"] == ["run-2"]
    if "run-1" in read.left_out:  # an event of it cannot be decoded: the run is left out
        assert "cannot be decoded" in read.left_out["run-1"]
        assert {e.run_id for e in read.events} == {"run-2"}
    else:
        assert [e for e in read.events if e.run_id == "run-1"] == ledger.events("run-1")


# --- idempotency claims across processes ------------------------------------------------


def test_a_claimed_key_is_refused_to_other_owners_until_released(backend: Backend) -> None:
    # Two connections, as two processes sharing the ledger have.
    with backend.open() as first, backend.open() as second:
        assert first.claim_key("t", "k", "p1", 60) is True
        assert second.claim_key("t", "k", "p2", 60) is False
        assert second.claim_key("t", "other", "p2", 60) is True  # keys are independent
        assert second.claim_key("u", "k", "p2", 60) is True  # per tool
        second.release_key("t", "k", "p2")  # not p2's claim: nothing happens
        assert second.claim_key("t", "k", "p2", 60) is False
        first.release_key("t", "k", "p1")
        assert second.claim_key("t", "k", "p2", 60) is True


def test_a_claim_whose_lease_ran_out_goes_to_the_next_owner(backend: Backend) -> None:
    # The holder's process died: its claim lapses instead of blocking the key forever.
    with backend.open() as first, backend.open() as second:
        assert first.claim_key("t", "k", "p1", 0.05) is True
        time.sleep(0.3)
        assert second.claim_key("t", "k", "p2", 60) is True
        assert first.claim_key("t", "k", "p1", 60) is False
        assert second.claim_key("t", "k", "p2", 0.05) is True  # its owner renews it
        time.sleep(0.3)
        assert first.claim_key("t", "k", "p1", 60) is True

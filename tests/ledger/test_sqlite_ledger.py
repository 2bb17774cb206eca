"""The SQLite ledger: round trips, the hash chain, tamper detection, concurrency."""

from __future__ import annotations

import itertools
import os
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkernel.canonical import canonical_json
from toolkernel.ledger import (
    GENESIS_HASH,
    Event,
    EventType,
    LedgerError,
    NewEvent,
    SqliteLedger,
    event_hash,
)
from toolkernel.ledger.base import chained_hash

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger" / "events.db"


@pytest.fixture
def ledger(db_path: Path) -> Iterator[SqliteLedger]:
    with SqliteLedger(db_path) as opened:
        yield opened


def request(n: int, *, call: str | None = None) -> NewEvent:
    return NewEvent(EventType.TOOL_CALL_REQUEST, {"n": n, "args": ["a", n]}, call or f"c{n}")


def tamper(path: Path, sql: str, params: tuple[object, ...] = ()) -> None:
    """Edit the database file behind the ledger's back, as an attacker would."""
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute(sql, params)
    finally:
        conn.close()


def kinds(ledger: SqliteLedger, run_id: str | None = None) -> set[str]:
    return {p.kind for p in ledger.verify(run_id).problems}


# --- round trip and chain -------------------------------------------------------------


def test_appended_events_read_back_identically(ledger: SqliteLedger) -> None:
    stored = ledger.append("run-1", [request(1), request(2)])
    stored += ledger.append("run-1", [NewEvent(EventType.TOOL_CALL_RESULT, {"ok": True})])

    assert ledger.events("run-1") == stored
    assert [e.payload for e in stored] == [
        {"n": 1, "args": ["a", 1]},
        {"n": 2, "args": ["a", 2]},
        {"ok": True},
    ]
    assert [e.type for e in stored] == [
        EventType.TOOL_CALL_REQUEST,
        EventType.TOOL_CALL_REQUEST,
        EventType.TOOL_CALL_RESULT,
    ]
    assert stored[2].tool_call_id is None


def test_each_event_is_chained_to_the_one_before(ledger: SqliteLedger) -> None:
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


def test_a_group_gets_contiguous_seqs_and_one_timestamp(ledger: SqliteLedger) -> None:
    ledger.append("run-1", [request(0)])
    group = ledger.append("run-1", [request(1), request(2), request(3)])

    assert [e.seq for e in group] == [2, 3, 4]
    assert len({e.at for e in group}) == 1
    assert group[0].at.endswith("Z")
    assert len(group[0].at) == len("2026-11-29T19:20:01.123456Z")


def test_runs_have_independent_chains(ledger: SqliteLedger) -> None:
    ledger.append("run-a", [request(1)])
    ledger.append("run-b", [request(1), request(2)])
    ledger.append("run-a", [request(2)])

    assert [e.seq for e in ledger.events("run-a")] == [1, 2]
    assert [e.seq for e in ledger.events("run-b")] == [1, 2]
    assert ledger.events("run-b")[0].prev_hash == GENESIS_HASH
    assert [(r.run_id, r.events) for r in ledger.runs()] == [("run-a", 2), ("run-b", 2)]


def test_events_after_a_seq_are_only_the_later_ones(ledger: SqliteLedger) -> None:
    ledger.append("run-1", [request(n) for n in range(4)])

    assert [e.seq for e in ledger.events("run-1", after_seq=2)] == [3, 4]
    assert ledger.events("unknown-run") == []


def test_an_empty_append_stores_nothing(ledger: SqliteLedger) -> None:
    assert ledger.append("run-1", []) == []
    assert ledger.runs() == []


def test_reopening_the_file_continues_the_chain(db_path: Path) -> None:
    with SqliteLedger(db_path) as first:
        last = first.append("run-1", [request(1), request(2)])[-1]
    with SqliteLedger(db_path, synchronous="full") as second:
        (event,) = second.append("run-1", [request(3)])

        assert (event.seq, event.prev_hash) == (3, last.hash)
        assert second.verify().ok


def test_two_ledgers_on_one_file_interleave_into_one_chain(db_path: Path) -> None:
    # Each instance caches the run's head; every append by the other makes it stale.
    with SqliteLedger(db_path) as a, SqliteLedger(db_path) as b:
        for n in range(6):
            (a if n % 2 else b).append("shared", [request(n)])
        events = a.events("shared")

        assert [e.seq for e in events] == list(range(1, 7))
        assert [e.payload["n"] for e in events] == list(range(6))
        assert a.verify().ok


def test_threads_sharing_one_ledger_append_one_gap_free_chain(ledger: SqliteLedger) -> None:
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

    path, worker, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    with SqliteLedger(path) as ledger:
        print("ready", flush=True)
        sys.stdin.readline()  # start line: every worker is open before any appends
        for n in range(count):
            events = [NewEvent(EventType.TOOL_CALL_REQUEST, {"w": worker, "n": n}, worker)]
            if n % 3 == 0:
                events.append(NewEvent(EventType.TOOL_CALL_RESULT, {"w": worker, "n": n}))
            ledger.append("shared", events)
    """
)


def test_processes_appending_to_one_run_make_one_gap_free_chain(db_path: Path) -> None:
    # Whether the workers interleave is up to the OS scheduler (they do, about 30 times
    # on a 2-core machine); the stale-head path itself is pinned down deterministically
    # by test_two_ledgers_on_one_file_interleave_into_one_chain.
    workers, count = 4, 300
    with SqliteLedger(db_path):
        pass  # create the schema once, so the workers race on appends only
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(db_path), f"w{w}", str(count)],
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

    with SqliteLedger(db_path) as ledger:
        events = ledger.events("shared")
        per_worker = count + len(range(0, count, 3))

        assert [e.seq for e in events] == list(range(1, workers * per_worker + 1))
        for w in range(workers):
            mine = [e.payload["n"] for e in events if e.payload["w"] == f"w{w}"]
            assert mine == sorted(mine)
            assert len(mine) == per_worker
        assert ledger.verify().ok


# --- idempotency index ----------------------------------------------------------------


def test_an_indexed_event_is_found_by_tool_and_key(ledger: SqliteLedger) -> None:
    ledger.append("run-1", [request(1)])
    result = NewEvent(
        EventType.TOOL_CALL_RESULT, {"status": "SUCCEEDED"}, "c2", index_key=("file.patch", "k-1")
    )
    _, stored = ledger.append("run-1", [request(2), result])

    assert ledger.find_indexed("file.patch", "k-1") == stored
    assert ledger.find_indexed("file.patch", "k-2") is None
    assert ledger.find_indexed("file.write", "k-1") is None


def test_the_first_event_under_a_key_keeps_it(ledger: SqliteLedger) -> None:
    first = NewEvent(EventType.TOOL_CALL_RESULT, {"try": 1}, index_key=("file.patch", "k"))
    second = NewEvent(EventType.TOOL_CALL_RESULT, {"try": 2}, index_key=("file.patch", "k"))
    (stored,) = ledger.append("run-1", [first])
    ledger.append("run-2", [second])

    assert ledger.find_indexed("file.patch", "k") == stored


# --- verify and tampering -------------------------------------------------------------


def test_verify_is_ok_on_a_clean_ledger(ledger: SqliteLedger) -> None:
    ledger.append("run-a", [request(n) for n in range(3)])
    ledger.append("run-b", [request(1)])
    report = ledger.verify()

    assert report.ok
    assert (report.runs_checked, report.events_checked) == (2, 4)
    assert ledger.verify("run-b").events_checked == 1


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
    "re-hashed edit": (
        "UPDATE events SET hash = 'sha256:' || hex(randomblob(32)) WHERE seq = 2",
        {"hash_mismatch", "broken_link"},
    ),
    "deleted middle event": ("DELETE FROM events WHERE seq = 2", {"gap"}),
    "deleted tail": ("DELETE FROM events WHERE seq >= 3", {"head_mismatch"}),
    "deleted run": ("DELETE FROM events", {"head_mismatch"}),
    "deleted head": ("DELETE FROM heads", {"head_mismatch"}),
}


@pytest.mark.parametrize("change", sorted(_TAMPERING))
def test_verify_detects_tampering(ledger: SqliteLedger, db_path: Path, change: str) -> None:
    ledger.append("run-1", [request(n) for n in range(1, 5)])
    sql, expected = _TAMPERING[change]
    tamper(db_path, sql)

    assert not ledger.verify().ok
    assert kinds(ledger) == expected


def test_verify_detects_two_events_swapped(ledger: SqliteLedger, db_path: Path) -> None:
    ledger.append("run-1", [request(n) for n in range(1, 5)])
    for old, new in ((2, 100), (3, 2), (100, 3)):
        tamper(db_path, "UPDATE events SET seq = ? WHERE seq = ?", (new, old))

    assert {"hash_mismatch", "broken_link"} <= kinds(ledger)


def test_verify_of_one_run_ignores_damage_elsewhere(ledger: SqliteLedger, db_path: Path) -> None:
    ledger.append("run-a", [request(1), request(2)])
    ledger.append("run-b", [request(1), request(2)])
    tamper(db_path, "DELETE FROM events WHERE run_id = 'run-b' AND seq = 2")

    assert ledger.verify("run-a").ok
    assert [(p.run_id, p.kind) for p in ledger.verify().problems] == [("run-b", "head_mismatch")]


def test_reading_an_undecodable_event_raises_ledger_error(
    ledger: SqliteLedger, db_path: Path
) -> None:
    ledger.append("run-1", [request(1)])
    tamper(db_path, "UPDATE events SET type = 'NOPE'")

    with pytest.raises(LedgerError):
        ledger.events("run-1")


def test_appending_to_a_run_whose_head_is_gone_raises_and_stores_nothing(
    ledger: SqliteLedger, db_path: Path
) -> None:
    ledger.append("run-1", [request(1)])
    tamper(db_path, "DELETE FROM heads")
    with SqliteLedger(db_path) as fresh:  # no cached head: it must trust the table
        with pytest.raises(LedgerError, match="disagree"):
            fresh.append("run-1", [request(2), request(3)])

        assert [e.seq for e in fresh.events("run-1")] == [1]


# --- failures and files ---------------------------------------------------------------


def test_a_payload_json_cannot_carry_stores_nothing(ledger: SqliteLedger) -> None:
    with pytest.raises(TypeError):
        ledger.append("run-1", [request(1), NewEvent(EventType.TOOL_CALL_RESULT, {"x": {1, 2}})])
    with pytest.raises(ValueError, match=r"NaN|Out of range"):
        ledger.append("run-1", [NewEvent(EventType.TOOL_CALL_RESULT, {"x": float("nan")})])

    assert ledger.events("run-1") == []


def test_a_full_disk_raises_ledger_error_and_the_chain_continues_after(
    ledger: SqliteLedger,
) -> None:
    ledger.append("run-1", [request(1)])
    conn = ledger._conn  # fault injection: no public way to fill the disk
    assert conn is not None
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count={pages}")
    big = NewEvent(EventType.TOOL_CALL_RESULT, {"blob": "x" * 100_000})

    with pytest.raises(LedgerError, match="full") as caught:
        ledger.append("run-1", [request(2), big])
    assert isinstance(caught.value.__cause__, sqlite3.Error)
    assert [e.seq for e in ledger.events("run-1")] == [1]

    conn.execute("PRAGMA max_page_count=1073741823")
    (event,) = ledger.append("run-1", [request(2)])
    assert event.seq == 2
    assert ledger.verify().ok


def test_an_unwritable_location_raises_ledger_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")

    with pytest.raises(LedgerError) as caught:
        SqliteLedger(blocker / "ledger.db")
    assert isinstance(caught.value.__cause__, OSError | sqlite3.Error)


def test_a_file_that_is_not_a_database_raises_ledger_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not sqlite" * 100)

    with pytest.raises(LedgerError):
        SqliteLedger(path)


def test_a_closed_ledger_raises_and_closing_twice_is_harmless(db_path: Path) -> None:
    ledger = SqliteLedger(db_path)
    ledger.close()
    ledger.close()

    with pytest.raises(LedgerError, match="closed"):
        ledger.append("run-1", [request(1)])
    with pytest.raises(LedgerError, match="closed"):
        ledger.verify()


def test_new_directories_and_files_are_private(tmp_path: Path) -> None:
    path = tmp_path / "outer" / "inner" / "events.db"
    with SqliteLedger(path) as ledger:
        ledger.append("run-1", [request(1)])
        wal = Path(f"{path}-wal")

        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(wal.stat().st_mode) == 0o600


def test_the_file_uses_wal_and_records_its_schema_version(db_path: Path) -> None:
    SqliteLedger(db_path).close()
    conn = sqlite3.connect(db_path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(1,)]
    finally:
        conn.close()


def test_a_file_from_a_newer_schema_is_refused(db_path: Path) -> None:
    SqliteLedger(db_path).close()
    tamper(db_path, "INSERT INTO schema_version VALUES (99, 'later')")

    with pytest.raises(LedgerError, match="schema version 99"):
        SqliteLedger(db_path)


def test_an_unknown_synchronous_mode_is_refused(db_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        SqliteLedger(db_path, synchronous="off")  # type: ignore[arg-type]


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
_new_events = st.builds(
    NewEvent,
    type=st.sampled_from(EventType),
    payload=_payloads,
    tool_call_id=st.none() | st.text(max_size=6),
)
# A workload: appends of 1-3 events, each to one of three runs.
_workloads = st.lists(
    st.tuples(
        st.sampled_from(["run-a", "run-b", "run-c"]), st.lists(_new_events, min_size=1, max_size=3)
    ),
    min_size=1,
    max_size=8,
)
_MUTATIONS = ["payload", "type", "seq", "delete"]


@given(
    run_id=st.text(max_size=8),
    seq=st.integers(min_value=1, max_value=2**40),
    event=_new_events,
    prev=st.text(max_size=8),
)
def test_the_fast_hash_equals_the_reference_hash(
    run_id: str, seq: int, event: NewEvent, prev: str
) -> None:
    at = "2026-11-29T19:20:01.123456Z"
    assert chained_hash(
        run_id, seq, event.type, at, event.tool_call_id, canonical_json(event.payload), prev
    ) == event_hash(run_id, seq, event.type, at, event.tool_call_id, event.payload, prev)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=_workloads, mutation=st.sampled_from(_MUTATIONS), pick=st.integers(min_value=0))
def test_any_single_change_to_a_stored_row_fails_verify(
    workload: list[tuple[str, list[NewEvent]]], mutation: str, pick: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.db"
        with SqliteLedger(path) as ledger:
            appended: list[Event] = []
            for run_id, events in workload:
                appended += ledger.append(run_id, events)

            assert ledger.verify().ok
            assert sorted(appended, key=lambda e: (e.run_id, e.seq)) == [
                e for run in sorted({e.run_id for e in appended}) for e in ledger.events(run)
            ]

            victim = appended[pick % len(appended)]
            _mutate(path, victim, mutation)
            assert not ledger.verify().ok


def _mutate(path: Path, victim: Event, mutation: str) -> None:
    where, key = "WHERE run_id = ? AND seq = ?", (victim.run_id, victim.seq)
    if mutation == "payload":
        changed = canonical_json({"tampered": victim.payload}).decode()
        tamper(path, f"UPDATE events SET payload = ? {where}", (changed, *key))
    elif mutation == "type":
        other = next(t for t in EventType if t != victim.type)
        tamper(path, f"UPDATE events SET type = ? {where}", (other.value, *key))
    elif mutation == "seq":
        tamper(path, f"UPDATE events SET seq = seq + 1000 {where}", key)
    else:
        tamper(path, f"DELETE FROM events {where}", key)

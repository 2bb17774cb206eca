"""The PostgreSQL ledger: the SQLite ledger's contract, shared by many workers.

Every test runs against a private throwaway cluster (see ``pg_cluster``), each in a
schema of its own.
"""

from __future__ import annotations

import itertools
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pg_cluster import PgCluster, PgClusterError

from toolkernel.canonical import canonical_json
from toolkernel.ledger import (
    GENESIS_HASH,
    Event,
    EventType,
    GroupCommitLedger,
    LedgerError,
    NewEvent,
    SqliteLedger,
    event_hash,
)
from toolkernel.ledger.postgres import PostgresLedger

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="session")
def dsn() -> Iterator[str]:
    try:
        cluster = PgCluster()
        started = cluster.start()
    except PgClusterError as exc:
        pytest.fail(f"cannot run the PostgreSQL ledger tests: {exc}")
    try:
        yield started
    finally:
        cluster.stop()


@pytest.fixture
def schema() -> str:
    return new_schema()


@pytest.fixture
def ledger(dsn: str, schema: str) -> Iterator[PostgresLedger]:
    with PostgresLedger(dsn, schema=schema) as opened:
        yield opened


def new_schema() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def request(n: int, *, call: str | None = None) -> NewEvent:
    return NewEvent(EventType.TOOL_CALL_REQUEST, {"n": n, "args": ["a", n]}, call or f"c{n}")


def admin(dsn: str, schema: str) -> psycopg.Connection[tuple[Any, ...]]:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SELECT set_config('search_path', %s, false)", (schema,))
    return conn


def tamper(dsn: str, schema: str, sql: str, params: tuple[object, ...] = ()) -> None:
    """Edit the tables behind the ledger's back, as an attacker would."""
    with admin(dsn, schema) as conn:
        conn.execute(sql.encode(), params)


def kinds(ledger: PostgresLedger, run_id: str | None = None) -> set[str]:
    return {p.kind for p in ledger.verify(run_id).problems}


def wait_until(condition: Any, *, timeout: float = 10.0) -> None:
    """Poll a database condition; the bound turns a hang into a failure."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        time.sleep(0.01)


# --- round trip and chain -------------------------------------------------------------


def test_appended_events_read_back_identically(ledger: PostgresLedger) -> None:
    stored = ledger.append("run-1", [request(1), request(2)])
    stored += ledger.append("run-1", [NewEvent(EventType.TOOL_CALL_RESULT, {"ok": "é\0✓"})])

    assert ledger.events("run-1") == stored
    assert [e.payload for e in stored] == [
        {"n": 1, "args": ["a", 1]},
        {"n": 2, "args": ["a", 2]},
        {"ok": "é\0✓"},
    ]
    assert [e.type for e in stored] == [
        EventType.TOOL_CALL_REQUEST,
        EventType.TOOL_CALL_REQUEST,
        EventType.TOOL_CALL_RESULT,
    ]
    assert stored[2].tool_call_id is None


def test_each_event_is_chained_to_the_one_before(ledger: PostgresLedger) -> None:
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


def test_a_group_gets_contiguous_seqs_and_one_timestamp(ledger: PostgresLedger) -> None:
    ledger.append("run-1", [request(0)])
    group = ledger.append("run-1", [request(1), request(2), request(3)])

    assert [e.seq for e in group] == [2, 3, 4]
    assert len({e.at for e in group}) == 1
    assert group[0].at.endswith("Z")
    assert len(group[0].at) == len("2026-11-29T19:20:01.123456Z")


def test_runs_have_independent_chains(ledger: PostgresLedger) -> None:
    ledger.append("run-a", [request(1)])
    ledger.append("run-b", [request(1), request(2)])
    ledger.append("run-a", [request(2)])

    assert [e.seq for e in ledger.events("run-a")] == [1, 2]
    assert [e.seq for e in ledger.events("run-b")] == [1, 2]
    assert ledger.events("run-b")[0].prev_hash == GENESIS_HASH
    assert [(r.run_id, r.events) for r in ledger.runs()] == [("run-a", 2), ("run-b", 2)]


def test_events_after_a_seq_are_only_the_later_ones(ledger: PostgresLedger) -> None:
    ledger.append("run-1", [request(n) for n in range(4)])

    assert [e.seq for e in ledger.events("run-1", after_seq=2)] == [3, 4]
    assert ledger.events("unknown-run") == []


def test_an_empty_append_stores_nothing(ledger: PostgresLedger) -> None:
    assert ledger.append("run-1", []) == []
    ledger.append_batch([("run-1", []), ("run-2", [])])
    assert ledger.runs() == []


def test_reopening_continues_the_chain(dsn: str, schema: str) -> None:
    with PostgresLedger(dsn, schema=schema) as first:
        last = first.append("run-1", [request(1), request(2)])[-1]
    with PostgresLedger(dsn, schema=schema) as second:
        (event,) = second.append("run-1", [request(3)])

        assert (event.seq, event.prev_hash) == (3, last.hash)
        assert second.verify().ok


def test_two_ledgers_on_one_schema_interleave_into_one_chain(dsn: str, schema: str) -> None:
    # Each instance caches the run's head; every append by the other makes it stale.
    with PostgresLedger(dsn, schema=schema) as a, PostgresLedger(dsn, schema=schema) as b:
        for n in range(6):
            (a if n % 2 else b).append("shared", [request(n)])
        events = a.events("shared")

        assert [e.seq for e in events] == list(range(1, 7))
        assert [e.payload["n"] for e in events] == list(range(6))
        assert a.verify().ok


def test_threads_sharing_one_ledger_append_one_gap_free_chain(ledger: PostgresLedger) -> None:
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
    from toolkernel.ledger import EventType, NewEvent
    from toolkernel.ledger.postgres import PostgresLedger

    dsn, schema, worker, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with PostgresLedger(dsn, schema=schema) as ledger:
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


def test_processes_appending_to_one_run_make_one_gap_free_chain(dsn: str, schema: str) -> None:
    # Several workers on one run is what the PostgreSQL backend is for: each append
    # whose cached head went stale takes the head row's lock and re-chains.
    workers, count = 4, 300
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, dsn, schema, f"w{w}", str(count)],
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
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
    finally:
        for proc in procs:
            proc.kill()
    assert ready == ["ready\n"] * workers

    with PostgresLedger(dsn, schema=schema) as ledger:
        events = ledger.events("shared")
        per_worker = count + len(range(0, count, 3))

        assert [e.seq for e in events] == list(range(1, workers * per_worker + 1))
        for w in range(workers):
            mine = [e.payload["n"] for e in events if e.payload["w"] == f"w{w}"]
            assert mine == sorted(mine)
            assert len(mine) == per_worker
        assert len(ledger.runs()) == workers + 1
        assert ledger.verify().ok


def test_a_locked_run_does_not_hold_up_appends_to_other_runs(dsn: str, schema: str) -> None:
    with PostgresLedger(dsn, schema=schema) as first, PostgresLedger(dsn, schema=schema) as other:
        first.append("busy", [request(1)])
        blocker = admin(dsn, schema)
        blocker.execute("BEGIN")
        blocker.execute("SELECT * FROM heads WHERE run_id = 'busy' FOR UPDATE")
        outcome: list[list[Event]] = []
        waiting = threading.Thread(
            target=lambda: outcome.append(first.append("busy", [request(2)])), daemon=True
        )
        waiting.start()
        try:
            wait_until(
                lambda: (
                    blocker.execute(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE wait_event_type = 'Lock' AND application_name = 'toolkernel-ledger'"
                    ).fetchone()
                    == (1,)
                )
            )
            # Serialized per run, not globally: the other run goes through meanwhile.
            assert [e.seq for e in other.append("free", [request(1), request(2)])] == [1, 2]
        finally:
            blocker.execute("COMMIT")
            blocker.close()
        waiting.join(timeout=10)

        assert [[e.seq for e in stored] for stored in outcome] == [[2]]
        assert first.verify().ok


def test_group_commit_on_postgres_keeps_every_threads_order(dsn: str, schema: str) -> None:
    # The kernel's `commit = "group"` wraps the configured backend; batches go through
    # append_batch, one transaction per batch.
    ledger = GroupCommitLedger(PostgresLedger(dsn, schema=schema))
    try:

        def work(run: str) -> None:
            for n in range(100):
                ledger.append(run, [request(n)])

        threads = [threading.Thread(target=work, args=(f"run-{i}",)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        for i in range(4):
            assert [e.payload["n"] for e in ledger.events(f"run-{i}")] == list(range(100))
        assert ledger.verify().ok
    finally:
        ledger.close()


def test_a_batch_is_stored_in_one_transaction(
    dsn: str, ledger: PostgresLedger, schema: str
) -> None:
    ledger.append("run-a", [request(1)])
    ledger.append("broken", [request(1)])
    tamper(dsn, schema, "DELETE FROM heads WHERE run_id = 'broken'")
    with PostgresLedger(dsn, schema=schema) as fresh:
        with pytest.raises(LedgerError, match="disagree"):
            fresh.append_batch(
                [("run-a", [request(2)]), ("run-new", [request(1)]), ("broken", [request(2)])]
            )
        assert [e.seq for e in fresh.events("run-a")] == [1]
        assert fresh.events("run-new") == []

        fresh.append_batch([("run-a", [request(2)]), ("run-new", [request(1)]), ("run-a", [])])
        fresh.append_batch([("run-new", [request(2)]), ("run-a", [request(3)])])

        assert [e.payload["n"] for e in fresh.events("run-a")] == [1, 2, 3]
        assert [e.seq for e in fresh.events("run-new")] == [1, 2]
        assert fresh.verify("run-a").ok


def test_a_chain_copied_into_the_sqlite_ledger_verifies_there(
    dsn: str, ledger: PostgresLedger, schema: str, tmp_path: Path
) -> None:
    # Both backends hash the same bytes: a run moved from one to the other still verifies.
    ledger.append("run-1", [request(1), NewEvent(EventType.TOOL_CALL_RESULT, {"é": [1.5, None]})])
    ledger.append("run-1", [request(2, call="ü")])
    with admin(dsn, schema) as conn:
        events = conn.execute("SELECT * FROM events ORDER BY seq").fetchall()
        heads = conn.execute("SELECT * FROM heads").fetchall()
    path = tmp_path / "copy.db"
    SqliteLedger(path).close()
    copy = sqlite3.connect(path)
    with copy:
        copy.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", events)
        copy.executemany("INSERT INTO heads VALUES (?, ?, ?)", heads)
    copy.close()

    with SqliteLedger(path) as moved:
        assert moved.verify().ok
        assert moved.events("run-1") == ledger.events("run-1")


# --- idempotency index ----------------------------------------------------------------


def test_an_indexed_event_is_found_by_tool_and_key(ledger: PostgresLedger) -> None:
    ledger.append("run-1", [request(1)])
    result = NewEvent(
        EventType.TOOL_CALL_RESULT, {"status": "SUCCEEDED"}, "c2", index_key=("file.patch", "k-1")
    )
    _, stored = ledger.append("run-1", [request(2), result])

    assert ledger.find_indexed("file.patch", "k-1") == stored
    assert ledger.find_indexed("file.patch", "k-2") is None
    assert ledger.find_indexed("file.write", "k-1") is None


def test_the_first_event_under_a_key_keeps_it(ledger: PostgresLedger) -> None:
    def keyed(n: int) -> NewEvent:
        return NewEvent(EventType.TOOL_CALL_RESULT, {"try": n}, index_key=("file.patch", "k"))

    first, _ = ledger.append("run-1", [keyed(1), keyed(2)])
    ledger.append("run-2", [keyed(3)])
    ledger.append_batch([("run-3", [keyed(4)])])

    assert ledger.find_indexed("file.patch", "k") == first


# --- verify and tampering -------------------------------------------------------------


def test_verify_is_ok_on_a_clean_ledger(ledger: PostgresLedger) -> None:
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
        "UPDATE events SET hash = 'sha256:' || md5(random()::text) || md5(random()::text) "
        "WHERE seq = 2",
        {"hash_mismatch", "broken_link"},
    ),
    "deleted middle event": ("DELETE FROM events WHERE seq = 2", {"gap"}),
    "deleted tail": ("DELETE FROM events WHERE seq >= 3", {"head_mismatch"}),
    "deleted run": ("DELETE FROM events", {"head_mismatch"}),
    "deleted head": ("DELETE FROM heads", {"head_mismatch"}),
}


@pytest.mark.parametrize("change", sorted(_TAMPERING))
def test_verify_detects_tampering(
    ledger: PostgresLedger, dsn: str, schema: str, change: str
) -> None:
    ledger.append("run-1", [request(n) for n in range(1, 5)])
    sql, expected = _TAMPERING[change]
    tamper(dsn, schema, sql)

    assert not ledger.verify().ok
    assert kinds(ledger) == expected


def test_verify_detects_two_events_swapped(ledger: PostgresLedger, dsn: str, schema: str) -> None:
    ledger.append("run-1", [request(n) for n in range(1, 5)])
    for old, new in ((2, 100), (3, 2), (100, 3)):
        tamper(dsn, schema, "UPDATE events SET seq = %s WHERE seq = %s", (new, old))

    assert {"hash_mismatch", "broken_link"} <= kinds(ledger)


def test_verify_of_one_run_ignores_damage_elsewhere(
    ledger: PostgresLedger, dsn: str, schema: str
) -> None:
    ledger.append("run-a", [request(1), request(2)])
    ledger.append("run-b", [request(1), request(2)])
    tamper(dsn, schema, "DELETE FROM events WHERE run_id = 'run-b' AND seq = 2")

    assert ledger.verify("run-a").ok
    assert [(p.run_id, p.kind) for p in ledger.verify().problems] == [("run-b", "head_mismatch")]


def test_reading_an_undecodable_event_raises_ledger_error(
    ledger: PostgresLedger, dsn: str, schema: str
) -> None:
    ledger.append("run-1", [request(1)])
    tamper(dsn, schema, "UPDATE events SET type = 'NOPE'")

    with pytest.raises(LedgerError):
        ledger.events("run-1")


def test_appending_to_a_run_whose_head_is_gone_raises_and_stores_nothing(
    ledger: PostgresLedger, dsn: str, schema: str
) -> None:
    ledger.append("run-1", [request(1)])
    tamper(dsn, schema, "DELETE FROM heads")
    with PostgresLedger(dsn, schema=schema) as fresh:  # no cached head: it must trust the table
        with pytest.raises(LedgerError, match="disagree"):
            fresh.append("run-1", [request(2), request(3)])

        assert [e.seq for e in fresh.events("run-1")] == [1]


# --- failures and the server ----------------------------------------------------------


def test_a_payload_json_cannot_carry_stores_nothing(ledger: PostgresLedger) -> None:
    with pytest.raises(TypeError):
        ledger.append("run-1", [request(1), NewEvent(EventType.TOOL_CALL_RESULT, {"x": {1, 2}})])
    with pytest.raises(ValueError, match=r"NaN|Out of range"):
        ledger.append("run-1", [NewEvent(EventType.TOOL_CALL_RESULT, {"x": float("nan")})])

    assert ledger.events("run-1") == []


def test_a_nul_character_in_an_id_is_refused_before_anything_is_stored(
    ledger: PostgresLedger,
) -> None:
    with pytest.raises(ValueError, match="NUL"):
        ledger.append("run\0", [request(1)])
    with pytest.raises(ValueError, match="NUL"):
        ledger.append("run-1", [request(1), request(2, call="c\0")])
    keyed = NewEvent(EventType.TOOL_CALL_RESULT, {}, index_key=("file.patch", "k\0"))
    with pytest.raises(ValueError, match="NUL"):
        ledger.append_batch([("run-1", [request(1)]), ("run-2", [keyed])])

    assert ledger.runs() == []
    assert ledger.events("run\0") == []
    assert ledger.find_indexed("file.patch", "k\0") is None
    assert ledger.verify("run\0").ok


def test_a_dropped_connection_raises_and_the_next_append_reconnects(
    ledger: PostgresLedger, dsn: str, schema: str
) -> None:
    ledger.append("run-1", [request(1)])
    pid = ledger._conn.info.backend_pid  # fault injection: no public way to drop it
    with admin(dsn, schema) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))

    with pytest.raises(LedgerError) as caught:
        ledger.append("run-1", [request(2)])
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)

    (event,) = ledger.append("run-1", [request(2)])
    assert event.seq == 2
    assert ledger.verify().ok


def test_an_unreachable_server_raises_ledger_error(tmp_path: Path) -> None:
    with pytest.raises(LedgerError) as caught:
        PostgresLedger(f"host={tmp_path} dbname=x user=x password=hunter2")
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)
    assert "hunter2" not in str(caught.value)

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(LedgerError):
        PostgresLedger(f"postgresql://x:hunter2@127.0.0.1:{port}/x?connect_timeout=5")


def test_a_malformed_dsn_raises_ledger_error_without_echoing_it() -> None:
    with pytest.raises(LedgerError, match="DSN") as caught:
        PostgresLedger("host=/tmp password hunter2")
    assert "hunter2" not in str(caught.value)


def test_an_unknown_database_raises_ledger_error(dsn: str) -> None:
    with pytest.raises(LedgerError, match="no_such_db"):
        PostgresLedger(f"{dsn} dbname=no_such_db")


def test_a_database_not_in_utf8_is_refused(dsn: str) -> None:
    name = f"ascii_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'SQL_ASCII'".encode())
    with pytest.raises(LedgerError, match="UTF8"):
        PostgresLedger(f"{dsn} dbname={name}")


def test_a_closed_ledger_raises_and_closing_twice_is_harmless(dsn: str, schema: str) -> None:
    ledger = PostgresLedger(dsn, schema=schema)
    ledger.close()
    ledger.close()

    with pytest.raises(LedgerError, match="closed"):
        ledger.append("run-1", [request(1)])
    with pytest.raises(LedgerError, match="closed"):
        ledger.verify()


def test_the_tables_live_in_the_named_schema_with_its_version(dsn: str, schema: str) -> None:
    PostgresLedger(dsn, schema=schema).close()
    with admin(dsn, "public") as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,),
        ).fetchall()
        versions = conn.execute(f'SELECT version FROM "{schema}".schema_version'.encode())

        assert sorted(t for (t,) in tables) == ["events", "heads", "idempotency", "schema_version"]
        assert versions.fetchall() == [(1,)]


def test_workers_opening_a_new_schema_together_create_it_once(dsn: str, schema: str) -> None:
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def open_one() -> None:
        start.wait(timeout=10)
        try:
            PostgresLedger(dsn, schema=schema).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)

    assert errors == []
    with admin(dsn, schema) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(1,)]


def test_a_schema_from_a_newer_version_is_refused(dsn: str, schema: str) -> None:
    PostgresLedger(dsn, schema=schema).close()
    tamper(dsn, schema, "INSERT INTO schema_version VALUES (99, 'later')")

    with pytest.raises(LedgerError, match="schema version 99"):
        PostgresLedger(dsn, schema=schema)


def test_an_awkward_schema_name_is_quoted_and_an_empty_one_refused(dsn: str) -> None:
    awkward = f'Odd "name"; DROP {uuid.uuid4().hex[:6]}'
    with PostgresLedger(dsn, schema=awkward) as ledger:
        ledger.append("run-1", [request(1)])
        assert ledger.verify().ok
    with pytest.raises(ValueError, match="schema"):
        PostgresLedger(dsn, schema="")


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
    # PostgreSQL text cannot hold NUL; the ledger refuses it (tested above).
    tool_call_id=st.none() | st.text(st.characters(exclude_characters="\0"), max_size=6),
)
# A workload: appends of 1-3 events, each to one of three runs, some as one batch.
_workloads = st.lists(
    st.tuples(
        st.sampled_from(["run-a", "run-b", "run-c"]), st.lists(_new_events, min_size=1, max_size=3)
    ),
    min_size=1,
    max_size=8,
)
_MUTATIONS = ["payload", "type", "seq", "delete"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workload=_workloads,
    batched=st.booleans(),
    mutation=st.sampled_from(_MUTATIONS),
    pick=st.integers(min_value=0),
)
def test_any_single_change_to_a_stored_row_fails_verify(
    dsn: str,
    workload: list[tuple[str, list[NewEvent]]],
    batched: bool,
    mutation: str,
    pick: int,
) -> None:
    schema = new_schema()
    try:
        with PostgresLedger(dsn, schema=schema) as ledger:
            if batched:
                ledger.append_batch(workload)
                appended = [
                    e for run in sorted({r for r, _ in workload}) for e in ledger.events(run)
                ]
            else:
                appended = [e for run_id, events in workload for e in ledger.append(run_id, events)]

            assert ledger.verify().ok
            assert sorted(appended, key=lambda e: (e.run_id, e.seq)) == [
                e for run in sorted({e.run_id for e in appended}) for e in ledger.events(run)
            ]

            victim = appended[pick % len(appended)]
            _mutate(dsn, schema, victim, mutation)
            assert not ledger.verify().ok
    finally:
        tamper(dsn, "public", f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _mutate(dsn: str, schema: str, victim: Event, mutation: str) -> None:
    where, key = "WHERE run_id = %s AND seq = %s", (victim.run_id, victim.seq)
    if mutation == "payload":
        changed = canonical_json({"tampered": victim.payload}).decode()
        tamper(dsn, schema, f"UPDATE events SET payload = %s {where}", (changed, *key))
    elif mutation == "type":
        other = next(t for t in EventType if t != victim.type)
        tamper(dsn, schema, f"UPDATE events SET type = %s {where}", (other.value, *key))
    elif mutation == "seq":
        tamper(dsn, schema, f"UPDATE events SET seq = seq + 1000 {where}", key)
    else:
        tamper(dsn, schema, f"DELETE FROM events {where}", key)

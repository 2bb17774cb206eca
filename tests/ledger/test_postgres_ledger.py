"""The PostgreSQL ledger: what only a ledger shared by many workers through a server does
(the contract every backend keeps is tested in ``test_ledger_contract``).

Every test runs against a private throwaway cluster (the ``dsn`` fixture, see
``pg_cluster``), each in a schema of its own.
"""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from toolkernel.cli import main as cli_main
from toolkernel.errors import LedgerMissing
from toolkernel.ledger import (
    Event,
    EventType,
    GroupCommitLedger,
    LedgerError,
    NewEvent,
    SqliteLedger,
    postgres,
)
from toolkernel.ledger.postgres import PostgresLedger
from toolkernel.run import ToolCall
from toolkernel.testing import make_kernel


@pytest.fixture
def schema() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def ledger(dsn: str, schema: str) -> Iterator[PostgresLedger]:
    with PostgresLedger(dsn, schema=schema) as opened:
        yield opened


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


def wait_until(condition: Any, *, timeout: float = 10.0) -> None:
    """Poll a database condition; the bound turns a hang into a failure."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        time.sleep(0.01)


# --- several workers ------------------------------------------------------------------


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


def test_what_is_presented_is_what_was_verified_when_a_view_answers_each_read_otherwise(
    dsn: str, ledger: PostgresLedger, schema: str
) -> None:
    # A view in place of the table shows verify's snapshot the stored rows and every
    # other read a forged RESULT; the heads and hashes are untouched.
    ledger.append(
        "run-a", [request(1), NewEvent(EventType.TOOL_CALL_RESULT, {"s": "FAILED"}, "c1")]
    )
    tamper(dsn, schema, "ALTER TABLE events RENAME TO events_real")
    tamper(
        dsn,
        schema,
        "CREATE VIEW events AS SELECT run_id, seq, type, at, tool_call_id, "
        "CASE WHEN current_setting('transaction_isolation') <> 'repeatable read' "
        "THEN replace(payload, 'FAILED', 'SUCCEEDED') ELSE payload END AS payload, "
        "prev_hash, hash FROM events_real",
    )
    assert ledger.events("run-a")[1].payload == {"s": "SUCCEEDED"}  # a second read lies

    read = ledger.read_verified("run-a")

    assert read.report.ok
    assert [e.payload for e in read.events] == [request(1).payload, {"s": "FAILED"}]


# --- failures and the server ----------------------------------------------------------


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


def drop(ledger: PostgresLedger, dsn: str, schema: str) -> None:
    """End the ledger's server session, as a restart or a failover does."""
    pid = ledger._conn.info.backend_pid  # fault injection: no public way to drop it
    with admin(dsn, schema) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_after_a_dropped_connection_appends_and_reads_go_on_on_a_new_one(
    ledger: PostgresLedger, dsn: str, schema: str
) -> None:
    # The first call after a server restart used to fail, its events stored anyway.
    ledger.append("run-1", [request(1)])
    drop(ledger, dsn, schema)
    (event,) = ledger.append("run-1", [request(2)])
    assert event.seq == 2
    drop(ledger, dsn, schema)
    assert [e.seq for e in ledger.events("run-1")] == [1, 2]
    drop(ledger, dsn, schema)
    ledger.append_batch([("run-1", [request(3)]), ("run-2", [request(1)])])
    drop(ledger, dsn, schema)
    assert ledger.claim_key("t", "k", "me", 30)
    drop(ledger, dsn, schema)
    assert ledger.verify().ok
    assert [e.seq for e in ledger.events("run-1")] == [1, 2, 3]


_TRY_APPEND = postgres._try_append  # the real one, which tests replace


def commit_elsewhere(dsn: str, schema: str, *args: Any) -> None:
    """What ``_try_append`` would have committed, committed by another session: a commit
    that landed, though (in a batch's transaction too) its answer never arrives."""
    with admin(dsn, schema) as other:
        assert _TRY_APPEND(other, *args)


@pytest.mark.parametrize("stored", [True, False])
@pytest.mark.parametrize("batch", [False, True])
def test_an_append_cut_off_by_a_drop_is_stored_once_whether_or_not_it_was_committed(
    ledger: PostgresLedger,
    monkeypatch: pytest.MonkeyPatch,
    dsn: str,
    schema: str,
    stored: bool,
    batch: bool,
) -> None:
    # A commit whose answer was lost used to be appended again: the call twice.
    ledger.append("run-1", [request(1)])
    real = postgres._try_append
    cut: list[bool] = []

    def cut_off(conn: Any, *args: Any) -> bool:
        if not cut:
            cut.append(True)
            if stored:
                commit_elsewhere(dsn, schema, *args)
            conn.close()
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return real(conn, *args)

    monkeypatch.setattr(postgres, "_try_append", cut_off)
    if batch:
        ledger.append_batch([("run-1", [request(2), request(3)])])
    else:
        ledger.append("run-1", [request(2), request(3)])
    assert cut
    assert [e.seq for e in ledger.events("run-1")] == [1, 2, 3]
    assert ledger.verify().ok
    ledger.append("run-1", [request(4)])  # the head cache follows what was stored
    assert [e.seq for e in ledger.events("run-1")] == [1, 2, 3, 4]


def test_a_retry_cut_off_again_says_the_append_may_be_stored_and_is_not_repeated(
    ledger: PostgresLedger, monkeypatch: pytest.MonkeyPatch, dsn: str, schema: str
) -> None:
    # The retry's own commit may land before its answer is lost: reported as "not
    # stored", the kernel appended the events a third time.
    ledger.append("run-1", [request(1)])
    calls: list[bool] = []

    def cut_off(conn: Any, *args: Any) -> bool:
        calls.append(True)
        if len(calls) == 2:  # the retry: committed, then cut off
            commit_elsewhere(dsn, schema, *args)
        conn.close()
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(postgres, "_try_append", cut_off)
    with pytest.raises(LedgerError) as caught:
        ledger.append("run-1", [request(2)])
    assert caught.value.maybe_stored
    monkeypatch.undo()
    assert [e.seq for e in ledger.events("run-1")] == [1, 2]
    assert ledger.verify().ok


def test_a_read_only_ledger_stays_read_only_on_a_new_connection(dsn: str, schema: str) -> None:
    with PostgresLedger(dsn, schema=schema) as writer:
        writer.append("run-1", [request(1)])
    with PostgresLedger(dsn, schema=schema, read_only=True) as reader:
        drop(reader, dsn, schema)
        assert reader.verify().ok  # on a new connection
        with pytest.raises(LedgerError, match="read-only"):
            reader.append("run-1", [request(2)])
    with PostgresLedger(dsn, schema=schema) as writer:
        assert [e.seq for e in writer.events("run-1")] == [1]


def test_when_the_server_is_not_back_the_error_says_the_append_may_be_stored(
    ledger: PostgresLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cut_off(conn: Any, *args: Any) -> bool:
        conn.close()
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    def unreachable(self: PostgresLedger) -> Any:
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(postgres, "_try_append", cut_off)
    monkeypatch.setattr(PostgresLedger, "_connect", unreachable)
    with pytest.raises(LedgerError, match="may be stored") as caught:
        ledger.append("run-1", [request(1)])
    assert caught.value.maybe_stored


def test_every_wait_is_bounded(ledger: PostgresLedger) -> None:
    settings = dict(
        ledger._conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN "
            "('statement_timeout', 'lock_timeout', 'idle_in_transaction_session_timeout')"
        ).fetchall()
    )
    assert settings == {
        "statement_timeout": "60000",
        "lock_timeout": "10000",
        "idle_in_transaction_session_timeout": "60000",
    }
    params = ledger._conn.info.get_parameters()
    assert params["keepalives"] == "1"
    assert params["tcp_user_timeout"] == "30000"


def test_a_read_only_open_creates_nothing_and_says_there_is_no_ledger(
    dsn: str, schema: str
) -> None:
    with pytest.raises(LedgerMissing, match="the schema does not exist"):
        PostgresLedger(dsn, schema=schema, read_only=True)
    with admin(dsn, "public") as conn:
        found = conn.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone()
    assert found == (None,)
    with PostgresLedger(dsn, schema=schema) as writer:
        writer.append("run-1", [request(1)])
    with PostgresLedger(dsn, schema=schema, read_only=True) as reader:
        assert reader.verify().ok
        with pytest.raises(LedgerError):
            reader.append("run-1", [request(2)])


def test_a_role_without_usage_on_the_schema_is_told_so(dsn: str, schema: str) -> None:
    with PostgresLedger(dsn, schema=schema):
        pass
    role = f"r_{uuid.uuid4().hex[:8]}"
    with admin(dsn, "public") as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params.update(user=role, password="pw")
    worker = psycopg.conninfo.make_conninfo(**params)
    with pytest.raises(LedgerError, match="grant it USAGE"):
        PostgresLedger(worker, schema=schema)


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


def test_the_tables_live_in_the_named_schema_with_its_version(dsn: str, schema: str) -> None:
    PostgresLedger(dsn, schema=schema).close()
    with admin(dsn, "public") as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,),
        ).fetchall()
        versions = conn.execute(f'SELECT version FROM "{schema}".schema_version'.encode())

        assert sorted(t for (t,) in tables) == [
            "events",
            "heads",
            "idempotency",
            "idempotency_claims",
            "schema_version",
        ]
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


def _workspace_on(tmp_path: Path, dsn: str, schema: str) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "toolkernel.toml").write_text(
        f'[ledger]\nbackend = "postgres"\ndsn = "{dsn}"\nschema = "{schema}"\n'
    )
    return workspace


def test_verify_of_a_schema_that_holds_no_ledger_is_no_pass_and_creates_nothing(
    tmp_path: Path, dsn: str, schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = _workspace_on(tmp_path, dsn, schema)
    assert cli_main(["ledger", "verify", "--workspace", str(workspace)]) == 1
    assert f"no ledger in PostgreSQL schema {schema!r}" in capsys.readouterr().out
    with admin(dsn, "public") as conn:
        assert conn.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone() == (None,)


def test_a_nul_in_a_proposed_call_id_is_escaped_and_the_call_recorded(
    tmp_path: Path, dsn: str, schema: str
) -> None:
    # PostgreSQL text cannot hold NUL: the whole turn used to raise, unrecorded.

    workspace = _workspace_on(tmp_path, dsn, schema)
    kernel = make_kernel(workspace, None, workspace_tools=False)
    try:
        run = kernel.start_run()
        calls = [
            ToolCall("memory.read", {}, tool_call_id="call_ok"),
            ToolCall("memory.read", {}, tool_call_id="call_\0x", idempotency_key="k\0"),
        ]
        results = anyio.run(kernel.call_many, run, calls)
        assert [r.tool_call_id for r in results] == ["call_ok", "call_\\x00x"]
        assert all(r.status.value == "SUCCEEDED" for r in results)
        recorded = {e.tool_call_id for e in kernel.ledger.events(run.id)}
        assert {"call_ok", "call_\\x00x"} <= recorded
        assert kernel.ledger.verify().ok
    finally:
        kernel.close()

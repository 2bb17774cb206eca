"""A SQLite file of another application at the ledger's path is refused for writing, as
``verify`` refuses it for reading: the ledger's tables are never added next to its own."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from toolkernel.cli import main
from toolkernel.ledger import EventType, LedgerError, NewEvent, SqliteLedger

LEDGER_TABLES = {"schema_version", "events", "heads", "idempotency", "idempotency_claims"}


def tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}


def journal_mode(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        mode: str = conn.execute("PRAGMA journal_mode").fetchone()[0]
        return mode


def foreign_database(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (name TEXT, card TEXT)")
        conn.execute("INSERT INTO customers VALUES ('ada', '4111')")
    return path


def own_files(directory: Path) -> list[str]:
    """The files in ``directory`` but SQLite's -wal and -shm (connections the helpers
    above leave open keep those)."""
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith(("-wal", "-shm")))


def request(n: int) -> NewEvent:
    return NewEvent(EventType.TOOL_CALL_REQUEST, {"n": n}, f"c{n}")


def altered_ledger(tmp_path: Path, sql: str) -> Path:
    """A ledger with one event, then changed by another program with ``sql``."""
    path = tmp_path / "ledger.db"
    with SqliteLedger(path) as ledger:
        ledger.append("run-1", [request(1)])
    with sqlite3.connect(path) as conn:
        conn.execute(sql)
    return path


def test_a_foreign_database_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    path = foreign_database(tmp_path / "app.db")
    with pytest.raises(LedgerError, match="not a toolkernel ledger") as refused:
        SqliteLedger(path)
    assert "customers" in str(refused.value)
    assert tables(path) == {"customers"}
    assert journal_mode(path) == "delete"  # not even switched to WAL


def test_a_ledger_another_application_added_a_table_to_is_refused(tmp_path: Path) -> None:
    path = altered_ledger(tmp_path, "CREATE TABLE notes (text TEXT)")
    with pytest.raises(LedgerError, match=r"other tables \(notes\)"):
        SqliteLedger(path)


def test_a_missing_file_becomes_a_ledger_with_nothing_left_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "state" / "ledger.db"
    with SqliteLedger(path) as ledger:
        ledger.append("run-1", [request(1)])
        assert ledger.verify().ok
    assert tables(path) == LEDGER_TABLES
    assert journal_mode(path) == "wal"
    assert path.stat().st_mode & 0o777 == 0o600
    assert own_files(path.parent) == ["ledger.db"]


def test_an_empty_file_where_the_ledger_goes_is_refused_and_left_as_it_was(
    tmp_path: Path,
) -> None:
    """A ledger emptied (``: > ledger.db``) has lost its events: started anew in place,
    the next call would make ``verify`` call the new ledger intact."""
    path = tmp_path / "ledger.db"
    path.touch()
    with pytest.raises(LedgerError, match=r"is an empty file: .*delete it") as refused:
        SqliteLedger(path)
    assert str(path) in str(refused.value)
    assert path.read_bytes() == b""


def test_a_database_without_tables_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 7")  # a header, no table
    conn.close()
    with pytest.raises(LedgerError, match="it has no events table"):
        SqliteLedger(path)
    assert tables(path) == set()
    assert journal_mode(path) == "delete"


def test_ledgers_opened_at_once_where_none_was_share_one_file(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    barrier = threading.Barrier(6)
    failures: list[BaseException] = []

    def open_and_append(n: int) -> None:
        barrier.wait()
        try:
            with SqliteLedger(path) as ledger:
                ledger.append(f"run-{n}", [request(n)])
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=open_and_append, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    with SqliteLedger(path, read_only=True) as reader:
        assert sorted(run.run_id for run in reader.runs()) == [f"run-{n}" for n in range(6)]
        assert reader.verify().ok
    assert own_files(tmp_path) == ["ledger.db"]


def test_a_call_refuses_a_ledger_emptied_since_the_last_call(tmp_path: Path, capsys) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    assert main(["call", "memory.read", "--workspace", str(workspace)]) == 0
    path = workspace / ".toolkernel" / "ledger.db"
    path.write_bytes(b"")
    capsys.readouterr()
    assert main(["call", "memory.read", "--workspace", str(workspace)]) == 2
    assert "is an empty file" in capsys.readouterr().err
    assert main(["ledger", "verify", "--workspace", str(workspace)]) == 2
    assert path.read_bytes() == b""


def test_sqlites_own_tables_do_not_make_a_ledger_foreign(tmp_path: Path) -> None:
    path = altered_ledger(tmp_path, "ANALYZE")  # creates sqlite_stat1
    assert "sqlite_stat1" in tables(path)
    with SqliteLedger(path) as reopened:
        reopened.append("run-1", [request(2)])
        assert reopened.verify().ok


def test_an_older_ledger_without_the_claims_table_is_still_opened(tmp_path: Path) -> None:
    path = altered_ledger(tmp_path, "DROP TABLE idempotency_claims")
    with SqliteLedger(path) as reopened:
        reopened.append("run-1", [request(2)])
        assert [e.seq for e in reopened.events("run-1")] == [1, 2]
    assert tables(path) == LEDGER_TABLES


def test_a_call_refuses_a_foreign_database_as_verify_does(tmp_path: Path, capsys) -> None:
    workspace = tmp_path / "ws"
    path = foreign_database(workspace / ".toolkernel" / "ledger.db")
    assert main(["ledger", "verify", "--workspace", str(workspace)]) == 2
    assert "not a toolkernel ledger" in capsys.readouterr().err
    assert main(["call", "memory.read", "--workspace", str(workspace)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("LedgerError: ")
    assert "not a toolkernel ledger" in err
    assert tables(path) == {"customers"}


@pytest.mark.parametrize("read_only", [True, False])
def test_an_emptied_ledger_beside_its_wal_is_refused_and_the_wal_kept(
    tmp_path: Path, read_only: bool
) -> None:
    """A process that dies leaves its last events in ``-wal``; emptying ``ledger.db``
    then, SQLite would open the empty file and delete the -wal, destroying them: an
    auditor's ``verify`` must never do that."""
    path = tmp_path / "ledger.db"
    ledger = SqliteLedger(path)
    ledger.append("run-1", [request(1), request(2)])
    wal = tmp_path / "ledger.db-wal"
    kept = wal.read_bytes()  # the events, not yet written back into ledger.db
    assert kept
    path.write_bytes(b"")
    try:
        with pytest.raises(LedgerError, match=r"is an empty file.*-wal") as refused:
            SqliteLedger(path, read_only=read_only)
        assert "ledger.db-wal" in str(refused.value)
        assert wal.read_bytes() == kept
        assert path.read_bytes() == b""
    finally:
        ledger._release_file()  # the writer "died": its connection is not closed

"""The SQLite ledger: what only a ledger in one file does (the contract every backend
keeps is tested in ``test_ledger_contract``)."""

from __future__ import annotations

import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolkernel.ledger import EventType, LedgerError, NewEvent, SqliteLedger


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger" / "events.db"


@pytest.fixture
def ledger(db_path: Path) -> Iterator[SqliteLedger]:
    with SqliteLedger(db_path) as opened:
        yield opened


def request(n: int) -> NewEvent:
    return NewEvent(EventType.TOOL_CALL_REQUEST, {"n": n, "args": ["a", n]}, f"c{n}")


# --- failures and files ---------------------------------------------------------------


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
    conn = sqlite3.connect(db_path)  # written behind the ledger's back
    try:
        with conn:
            conn.execute("INSERT INTO schema_version VALUES (99, 'later')")
    finally:
        conn.close()

    with pytest.raises(LedgerError, match="schema version 99"):
        SqliteLedger(db_path)


def test_an_unknown_synchronous_mode_is_refused(db_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        SqliteLedger(db_path, synchronous="off")  # type: ignore[arg-type]

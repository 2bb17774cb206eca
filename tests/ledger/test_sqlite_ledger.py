"""The SQLite ledger: what only a ledger in one file does (the contract every backend
keeps is tested in ``test_ledger_contract``)."""

from __future__ import annotations

import re
import sqlite3
import stat
from collections.abc import Callable, Iterator
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


# --- fields stored as another type ----------------------------------------------------

# SQLite keeps whatever a column is given. Each edit hits run-1 (events 1-3); run-2 stays
# clean. Expected: text the bad_payload problems' details hold, and their (run_id, seq).
_MISSTORED = {
    "at as a blob": (
        "UPDATE events SET at = CAST(at AS BLOB) WHERE run_id = 'run-1' AND seq = 2",
        ("at is stored as a blob", [("run-1", 2)]),
    ),
    "tool_call_id as a blob": (
        "UPDATE events SET tool_call_id = X'00ff' WHERE run_id = 'run-1' AND seq = 2",
        ("tool_call_id is stored as a blob", [("run-1", 2)]),
    ),
    "prev_hash as a blob": (
        "UPDATE events SET prev_hash = CAST(prev_hash AS BLOB) WHERE run_id = 'run-1' AND seq = 2",
        ("prev_hash is stored as a blob", [("run-1", 2)]),
    ),
    "hash as a blob": (
        "UPDATE events SET hash = CAST(hash AS BLOB) WHERE run_id = 'run-1' AND seq = 2",
        ("hash is stored as a blob", [("run-1", 2)]),
    ),
    "type as a blob": (
        "UPDATE events SET type = CAST(type AS BLOB) WHERE run_id = 'run-1' AND seq = 2",
        ("type is stored as a blob", [("run-1", 2)]),
    ),
    "run_id as a blob": (
        "UPDATE events SET run_id = CAST(run_id AS BLOB) WHERE run_id = 'run-1';"
        "UPDATE heads SET run_id = CAST(run_id AS BLOB) WHERE run_id = 'run-1'",
        ("run_id is stored as a blob", [("b'run-1'", seq) for seq in (1, 2, 3)]),
    ),
    "seq as text": (
        "UPDATE events SET seq = '2x' WHERE run_id = 'run-1' AND seq = 2",
        ("seq '2x' is stored as text", [("run-1", None)]),
    ),
    "seq as a real": (
        "UPDATE events SET seq = 2.5 WHERE run_id = 'run-1' AND seq = 2",
        ("seq 2.5 is stored as a real", [("run-1", None)]),
    ),
    # SQLite keeps any bytes as text; Python's reader would give up on the whole read.
    "payload as text that is not UTF-8": (
        "UPDATE events SET payload = CAST(X'7b226e223a327dff' AS TEXT) "
        "WHERE run_id = 'run-1' AND seq = 2",
        ("payload is stored as text that is not UTF-8", [("run-1", 2)]),
    ),
    "at as text that is not UTF-8": (
        "UPDATE events SET at = CAST(X'32303236ff' AS TEXT) WHERE run_id = 'run-1' AND seq = 2",
        ("at is stored as text that is not UTF-8", [("run-1", 2)]),
    ),
}


def tamper(path: Path, script: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.executescript(script)
    finally:
        conn.close()


@pytest.mark.parametrize("change", sorted(_MISSTORED))
def test_a_field_stored_as_another_type_is_a_bad_payload_and_other_runs_are_still_verified(
    ledger: SqliteLedger, db_path: Path, change: str
) -> None:
    ledger.append("run-1", [request(1), request(2), request(3)])
    ledger.append("run-2", [request(1)])
    script, (detail, expected) = _MISSTORED[change]
    tamper(db_path, script)

    report = ledger.verify()
    assert report.runs_checked == 2
    assert report.events_checked == 4
    assert all(p.run_id != "run-2" for p in report.problems)
    bad = [p for p in report.problems if p.kind == "bad_payload"]
    assert [(p.run_id, p.seq) for p in bad if detail in p.detail] == expected
    assert ledger.verify("run-2").ok


@pytest.mark.parametrize("change", sorted(set(_MISSTORED) - {"run_id as a blob"}))
def test_reading_a_field_stored_as_another_type_raises_ledger_error(
    ledger: SqliteLedger, db_path: Path, change: str
) -> None:
    indexed = NewEvent(EventType.TOOL_CALL_RESULT, {"n": 2}, "c2", index_key=("tool", "k"))
    ledger.append("run-1", [request(1), indexed, request(3)])
    tamper(db_path, _MISSTORED[change][0])

    with pytest.raises(LedgerError, match="cannot be decoded"):
        ledger.events("run-1")
    if not change.startswith("seq"):  # the index still finds the event
        with pytest.raises(LedgerError, match="cannot be decoded"):
            ledger.find_indexed("tool", "k")


# --- read-only ------------------------------------------------------------------------


def rollback_journal_copy(db_path: Path, copy: Path) -> None:
    """A copy of the ledger as an archive holds it: one file, in rollback-journal mode."""
    source, target = sqlite3.connect(db_path), sqlite3.connect(copy)
    try:
        source.backup(target)
        target.execute("PRAGMA journal_mode=DELETE")
    finally:
        source.close()
        target.close()


def test_a_read_only_ledger_reads_and_verifies_an_archived_copy_without_changing_it(
    ledger: SqliteLedger, tmp_path: Path, db_path: Path
) -> None:
    stored = ledger.append("run-1", [request(1), request(2)])
    copy = tmp_path / "archive" / "ledger.db"
    copy.parent.mkdir()
    rollback_journal_copy(db_path, copy)
    before = copy.read_bytes()

    with SqliteLedger(copy, read_only=True) as archived:
        assert archived.verify().ok
        assert archived.events("run-1") == stored
        assert [r.run_id for r in archived.runs()] == ["run-1"]
        with pytest.raises(LedgerError):
            archived.append("run-1", [request(3)])

    assert copy.read_bytes() == before
    assert [p.name for p in copy.parent.iterdir()] == ["ledger.db"]  # no -wal, no -shm


def test_a_read_only_ledger_refuses_a_missing_table_instead_of_creating_it(
    ledger: SqliteLedger, db_path: Path
) -> None:
    ledger.append("run-1", [request(1)])
    ledger.close()
    tamper(db_path, "DROP TABLE events")

    with pytest.raises(LedgerError, match="events"):
        SqliteLedger(db_path, read_only=True)
    conn = sqlite3.connect(db_path)
    try:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    finally:
        conn.close()
    assert "events" not in tables


def test_a_read_only_ledger_refuses_a_newer_schema_version(db_path: Path) -> None:
    SqliteLedger(db_path).close()
    tamper(db_path, "INSERT INTO schema_version VALUES (99, 'later')")

    with pytest.raises(LedgerError, match="schema version"):
        SqliteLedger(db_path, read_only=True)


def test_a_read_only_ledger_of_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "none" / "ledger.db"
    with pytest.raises(LedgerError, match="there is no ledger at"):
        SqliteLedger(path, read_only=True)
    assert not path.parent.exists()


def test_a_read_only_ledger_of_text_that_is_not_utf8_verifies_it_as_a_bad_payload(
    ledger: SqliteLedger, db_path: Path
) -> None:
    ledger.append("run-1", [request(1), request(2)])
    ledger.append("run-2", [request(1)])
    tamper(db_path, _MISSTORED["payload as text that is not UTF-8"][0])

    with SqliteLedger(db_path, read_only=True) as reader:
        report = reader.verify()
        with pytest.raises(LedgerError, match=r"event 2 of run 'run-1' cannot be decoded"):
            reader.events("run-1")
        assert [e.seq for e in reader.events("run-2")] == [1]
    assert [(p.run_id, p.seq, p.kind) for p in report.problems] == [("run-1", 2, "bad_payload")]
    assert report.events_checked == 3


@pytest.mark.parametrize(
    ("make", "refusal"),
    [
        (lambda path: path.symlink_to(path.parent / "gone.db"), "is a symbolic link to "),
        (lambda path: path.touch(), "is an empty file"),
        (lambda path: path.mkdir(), "is not a regular file"),
    ],
    ids=["dangling link", "empty file", "directory"],
)
def test_a_read_only_ledger_refuses_what_is_not_a_ledger_file(
    tmp_path: Path, make: Callable[[Path], None], refusal: str
) -> None:
    path = tmp_path / "ledger.db"
    make(path)
    with pytest.raises(LedgerError, match=re.escape(f"the ledger at {path} {refusal}")):
        SqliteLedger(path, read_only=True)


def test_a_dangling_link_where_the_ledger_goes_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.symlink_to(tmp_path / "gone" / "ledger.db")
    with pytest.raises(LedgerError, match=r"is a symbolic link to .*gone/ledger\.db, which does"):
        SqliteLedger(path)


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_ledger_file_deleted_or_replaced_while_open_refuses_appends(tmp_path, how):
    """SQLite would keep writing to the unlinked file: every later event lost unseen."""
    path = tmp_path / "ledger.db"
    ledger = SqliteLedger(path)
    try:
        ledger.append("run_1", [NewEvent(EventType.TOOL_CALL_REQUEST, {"n": 1}, "call_1")])
        for file in tmp_path.glob("ledger.db*"):
            file.unlink()
        if how == "replaced":
            other = SqliteLedger(tmp_path / "other.db")
            other.close()
            (tmp_path / "other.db").rename(path)
        with pytest.raises(LedgerError, match="deleted or replaced"):
            ledger.append("run_1", [NewEvent(EventType.TOOL_CALL_RESULT, {"n": 2}, "call_1")])
        with pytest.raises(LedgerError, match="deleted or replaced"):
            ledger.claim_key("t", "k", "owner", 10.0)
    finally:
        ledger.close()


def test_a_ledger_nobody_closed_leaves_no_file_descriptor_behind(tmp_path):
    """The descriptor that watches for a deleted file goes with the ledger, as its
    connection does, also when a program relies on garbage collection."""
    import gc

    def open_descriptors() -> int:
        return len(list(Path("/proc/self/fd").iterdir()))

    gc.collect()
    before = open_descriptors()
    for n in range(50):
        SqliteLedger(tmp_path / f"ledger{n}.db").append(
            "run_1", [NewEvent(EventType.TOOL_CALL_REQUEST, {"n": n}, "call_1")]
        )
    gc.collect()
    assert open_descriptors() == before


def test_a_duplicated_event_is_named_as_a_repeat_not_as_a_missing_seq(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with SqliteLedger(path) as ledger:
        ledger.append("run-1", [NewEvent(EventType.TOOL_CALL_REQUEST, {"n": n}) for n in range(5)])
    conn = sqlite3.connect(path)
    with conn:  # the table rebuilt without its key, seq 4 copied
        conn.execute("CREATE TABLE copy AS SELECT * FROM events")
        conn.execute("DROP TABLE events")
        conn.execute("ALTER TABLE copy RENAME TO events")
        conn.execute("INSERT INTO events SELECT * FROM events WHERE seq = 4")
    conn.close()

    with SqliteLedger(path, read_only=True) as ledger:
        problems = ledger.verify().problems

    assert [(p.seq, p.kind, p.detail) for p in problems if p.kind == "gap"] == [
        (4, "gap", "seq 4 again after seq 4")
    ]


@pytest.mark.parametrize("bad", [0, -1])
def test_a_seq_below_one_is_named_out_of_range_and_the_rest_measured_without_it(
    tmp_path: Path, bad: int
) -> None:
    path = tmp_path / "ledger.db"
    with SqliteLedger(path) as ledger:
        ledger.append("run-1", [NewEvent(EventType.TOOL_CALL_REQUEST, {"n": n}) for n in range(3)])
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE events SET seq = ? WHERE seq = 1", (bad,))
    conn.close()

    with SqliteLedger(path, read_only=True) as ledger:
        report = ledger.verify()

    assert not report.ok
    assert [(p.seq, p.kind, p.detail) for p in report.problems if p.kind == "gap"] == [
        (bad, "gap", f"seq {bad} is out of range (seqs start at 1)"),
        (2, "gap", "expected seq 1, found seq 2"),
    ]


def test_an_error_on_a_full_file_system_says_it_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite says "disk I/O error" when it cannot grow its -shm file on a full disk.
    path = tmp_path / "ledger.db"
    path.write_bytes(b"not a database, " * 64)
    with pytest.raises(LedgerError) as roomy:
        SqliteLedger(path, read_only=True)
    assert "is full" not in str(roomy.value)

    class Full:
        f_bavail = 0

    monkeypatch.setattr("toolkernel.ledger.sqlite.os.statvfs", lambda _path: Full())
    with pytest.raises(LedgerError, match=f"the file system holding {tmp_path} is full"):
        SqliteLedger(path, read_only=True)


@pytest.mark.parametrize("count", [1, 3, 63, 64, 65, 129, 300])
def test_a_batch_of_any_size_is_stored_in_order_and_chained(ledger, db_path, count):
    # Rows go in up to 64 to a statement: the chunks' edges must not show.
    first = [request(n) for n in range(count)]
    ledger.append("r1", first[:1])
    ledger.append_batch([("r1", first[1:]), ("r2", first), ("r1", [request(count)])])
    with SqliteLedger(db_path) as reader:
        r1 = reader.events("r1")
        assert [e.payload["n"] for e in r1] == [*range(count), count]
        assert [e.seq for e in r1] == list(range(1, count + 2))
        assert [e.payload["n"] for e in reader.events("r2")] == list(range(count))
        assert reader.verify().ok


def test_a_batch_that_collides_with_a_stored_row_stores_none_of_its_rows(ledger, db_path):
    ledger.append("r", [request(0)])
    with sqlite3.connect(db_path) as raw:  # another writer's row where the batch will go
        raw.execute(
            "INSERT INTO events VALUES ('r', 80, 'TOOL_CALL_REQUEST', 'x', NULL, '{}', 'a', 'b')"
        )
    with pytest.raises(LedgerError, match="stored events and head disagree"):
        ledger.append("r", [request(n) for n in range(1, 100)])
    with sqlite3.connect(db_path) as raw:
        seqs = [row[0] for row in raw.execute("SELECT seq FROM events WHERE run_id='r'")]
    assert seqs == [1, 80]

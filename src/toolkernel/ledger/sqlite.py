"""The embedded ledger: one SQLite file in WAL mode.

Durability is chosen per file with ``synchronous``: ``"normal"`` (in WAL mode a
committed append survives an application crash, but the last commits may be lost on a
power failure or OS crash) or ``"full"`` (commits also survive power loss, at the cost
of an fsync per append).

Several processes may append to the same file, even to the same run. Each append
takes SQLite's write lock up front (``BEGIN IMMEDIATE``), so the run's head it chains
onto cannot move while it writes. The head is cached per run to spare a read on every
append; the cached head is only trusted if the conditional head update matches it,
otherwise it is reloaded within the same transaction.

Opened ``read_only``, the file is only read: no table is created or migrated and the
file is not switched to WAL, so an auditor may verify a ledger they cannot write, or an
archived copy (SQLite may create the empty -wal and -shm files it reads a WAL-mode file
with, where the directory allows).

Stored text that is not UTF-8 (written by hand) is read as its bytes, so that ``verify``
reports it at its run and seq instead of failing the whole read.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Final, Literal

from toolkernel.calls import timestamp
from toolkernel.canonical import canonical_json, plain_json
from toolkernel.ledger.base import (
    GENESIS_HASH,
    Event,
    EventType,
    Ledger,
    LedgerError,
    NewEvent,
    RunSummary,
    VerifiedRead,
    VerifyReport,
)
from toolkernel.ledger.rows import (
    Head,
    Prepared,
    Undecoded,
    Verifier,
    chain_rows,
    indexed_event,
    readable_runs,
    row_event,
    stored_events,
)
from toolkernel.terminal import printable

__all__ = ["SqliteLedger"]

SCHEMA_VERSION: Final = 1
# Waiting this long for another process's write lock is abnormal; past it, fail loudly.
_BUSY_TIMEOUT_S: Final = 10.0

_TABLES: Final = ("schema_version", "events", "heads", "idempotency")
_OWN_TABLES: Final = frozenset({*_TABLES, "idempotency_claims"})
_SHOWN_TABLES: Final = 5  # of another application's tables, named in the refusal
# Opening a WAL-mode file read-only fails with these when SQLite cannot create its -shm.
_NO_WAL_INDEX: Final = frozenset({"SQLITE_CANTOPEN", "SQLITE_READONLY_DIRECTORY"})

_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS schema_version (
        version INTEGER PRIMARY KEY,
        applied_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS events (
        run_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        type TEXT NOT NULL,
        at TEXT NOT NULL,
        tool_call_id TEXT,
        payload TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        hash TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID""",
    # One row per run, written with its events: a deleted tail shows as a head that
    # points past the last stored event.
    """CREATE TABLE IF NOT EXISTS heads (
        run_id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL,
        hash TEXT NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS idempotency (
        tool_name TEXT NOT NULL,
        key TEXT NOT NULL,
        run_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        PRIMARY KEY (tool_name, key)
    ) WITHOUT ROWID""",
    # Keys whose call is running now, in some process (claim_key). Not part of the
    # record: readers need not find it, and an older file gets it on its next write.
    """CREATE TABLE IF NOT EXISTS idempotency_claims (
        tool_name TEXT NOT NULL,
        key TEXT NOT NULL,
        owner TEXT NOT NULL,
        expires REAL NOT NULL,
        PRIMARY KEY (tool_name, key)
    ) WITHOUT ROWID""",
)

# Every statement is a constant, so sqlite3's statement cache prepares each only once.
_SELECT_EVENTS: Final = (
    "SELECT run_id, seq, type, at, tool_call_id, payload, prev_hash, hash FROM events "
    "WHERE run_id = ? AND seq > ? ORDER BY seq"
)
_SELECT_ALL_EVENTS: Final = (
    "SELECT run_id, seq, type, at, tool_call_id, payload, prev_hash, hash FROM events "
    "ORDER BY run_id, seq"
)
_SELECT_RUN_EVENTS: Final = (
    "SELECT run_id, seq, type, at, tool_call_id, payload, prev_hash, hash FROM events "
    "WHERE run_id = ? ORDER BY run_id, seq"
)
_SELECT_HEADS: Final = "SELECT run_id, seq, hash FROM heads"
_SELECT_RUN_HEAD: Final = "SELECT run_id, seq, hash FROM heads WHERE run_id = ?"
_SELECT_RUNS: Final = (
    "SELECT run_id, count(*), min(at), max(at) FROM events GROUP BY run_id ORDER BY min(at), run_id"
)
_INSERT_HEAD: Final = (
    "INSERT INTO heads (run_id, seq, hash) VALUES (?, ?, ?) ON CONFLICT DO NOTHING"
)
_ADVANCE_HEAD: Final = (
    "UPDATE heads SET seq = ?, hash = ? WHERE run_id = ? AND seq = ? AND hash = ?"
)
_SELECT_HEAD: Final = "SELECT seq, hash FROM heads WHERE run_id = ?"
_SELECT_INDEX: Final = "SELECT tool_name, key, run_id, seq FROM idempotency"
# LEFT JOIN: an entry whose event is gone is found, and refused (indexed_event).
_SELECT_INDEXED: Final = (
    "SELECT i.run_id, i.seq, "
    "e.run_id, e.seq, e.type, e.at, e.tool_call_id, e.payload, e.prev_hash, e.hash "
    "FROM idempotency AS i LEFT JOIN events AS e ON e.run_id = i.run_id AND e.seq = i.seq "
    "WHERE i.tool_name = ? AND i.key = ?"
)
_INSERT_INDEX: Final = (
    "INSERT INTO idempotency (tool_name, key, run_id, seq) VALUES (?, ?, ?, ?) "
    "ON CONFLICT DO NOTHING"
)


# Taken when nobody holds the key or the holder's lease ran out, renewed by its owner;
# otherwise nothing.
_CLAIM: Final = (
    "INSERT INTO idempotency_claims (tool_name, key, owner, expires) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (tool_name, key) DO UPDATE SET owner = excluded.owner, "
    "expires = excluded.expires "
    "WHERE idempotency_claims.expires < ? OR idempotency_claims.owner = excluded.owner"
)
_RENEW: Final = (
    "UPDATE idempotency_claims SET expires = ? WHERE tool_name = ? AND key = ? AND owner = ?"
)
_RELEASE: Final = "DELETE FROM idempotency_claims WHERE tool_name = ? AND key = ? AND owner = ?"


class SqliteLedger(Ledger):
    """A ledger stored in one SQLite file, created with its directories on first use.

    New directories get mode 0o700 and a new database file 0o600 (SQLite gives its WAL
    and shared-memory files the database file's mode).

    Args:
        path: The database file.
        synchronous: ``"normal"`` survives an application crash; ``"full"`` also
            survives power loss, at the cost of an fsync per append.
        read_only: only read the file, which must hold a ledger: it is not changed (no
            table created, beside it at most SQLite's -wal and -shm files), and appends
            raise :class:`LedgerError`. What is not a ledger file
            (nothing, a dangling link, a FIFO, an empty file) is refused, never waited on.

    Raises:
        LedgerError: the file could not be created or opened, was written by a newer
            schema version, or (``read_only``) is not a ledger file or lacks the
            ledger's tables.
    """

    def __init__(
        self,
        path: Path,
        *,
        synchronous: Literal["normal", "full"] = "normal",
        read_only: bool = False,
    ) -> None:
        if synchronous not in ("normal", "full"):
            raise ValueError(f"synchronous must be 'normal' or 'full', not {synchronous!r}")
        self._path = Path(path)
        self._lock = threading.Lock()
        self._heads: dict[str, Head] = {}
        with self._translate("open"):
            self._conn: sqlite3.Connection | None = (
                _open_read_only(self._path) if read_only else _open(self._path, synchronous)
            )
            # One cursor for every append (under the lock), not a new one per statement.
            self._cursor = self._conn.cursor()
            # The file as opened, to notice it deleted or replaced while we write to it:
            # SQLite would go on writing to the unlinked file, and every later event
            # would be lost without a word.
            self._file: int | None = None
            if not read_only:
                try:
                    self._file = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    self._conn.close()
                    raise
                # Closed with the ledger, or when a ledger nobody closed is collected (as
                # its connection is): one per SqliteLedger would otherwise pile up.
                self._release_file = weakref.finalize(self, os.close, self._file)

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    def append(self, run_id: str, events: Sequence[NewEvent]) -> list[Event]:
        """Append ``events`` to ``run_id``, atomically: all are stored, or none.

        Returns:
            The stored events, in order.

        Raises:
            LedgerError: nothing was stored (I/O error, lock timeout, or a run whose
                stored events and head disagree; :meth:`verify` shows why).
            TypeError: a payload is not JSON-able; nothing was stored.
            ValueError: a payload holds NaN or Infinity, or a type is not an
                :class:`EventType`; nothing was stored.
        """
        if not events:
            return []
        # Encode before taking any lock, so a bad payload fails without touching the file.
        prepared = _prepare(events)
        at, rows = self._store(run_id, prepared)
        return stored_events(run_id, at, rows, prepared, events)

    def append_batch(self, batches: Sequence[tuple[str, Sequence[NewEvent]]]) -> None:
        """Append several runs' events in one transaction: all are stored, or none.

        Raises:
            LedgerError: nothing was stored.
            TypeError: a payload is not JSON-able; nothing was stored.
            ValueError: a payload holds NaN or Infinity; nothing was stored.
        """
        if len(batches) == 1:
            # One run (the kernel's flush of a call's events): ``append`` without
            # building the stored events, which nobody reads here.
            run_id, events = batches[0]
            if events:
                self._store(run_id, _prepare(events))
            return
        merged: dict[str, list[Prepared]] = {}
        for run_id, events in batches:
            merged.setdefault(run_id, []).extend(_prepare(events))
        if not any(merged.values()):
            return
        at = timestamp()
        with self._lock:
            conn = self._writable()
            cursor = self._cursor
            heads: dict[str, Head] = {}
            try:
                cursor.execute("BEGIN IMMEDIATE")
                for run_id, prepared in merged.items():
                    if prepared:
                        rows = self._insert(cursor, run_id, at, prepared)
                        heads[run_id] = (rows[-1][1], rows[-1][7])
                cursor.execute("COMMIT")
            except BaseException as exc:
                _rollback(conn)
                for run_id in merged:
                    self._heads.pop(run_id, None)  # reload: the cache may be half-advanced
                if isinstance(exc, sqlite3.Error | OSError):
                    raise LedgerError(f"could not append to {self._path}: {exc}") from exc
                raise
            self._heads.update(heads)

    def _store(self, run_id: str, prepared: list[Prepared]) -> tuple[str, list[tuple[Any, ...]]]:
        """Chain ``prepared`` onto the run's head and commit it; the time and rows stored."""
        at = timestamp()
        with self._lock:
            conn = self._writable()
            cursor = self._cursor
            try:
                cursor.execute("BEGIN IMMEDIATE")
                rows = self._insert(cursor, run_id, at, prepared)
                cursor.execute("COMMIT")
            except BaseException as exc:
                # Whatever interrupted us, leave no half-written transaction behind;
                # the cache was not touched yet, so it stays right.
                _rollback(conn)
                if isinstance(exc, sqlite3.Error | OSError):
                    raise LedgerError(
                        f"could not append to run {run_id!r} in {self._path}: {exc}"
                    ) from exc
                raise
            self._heads[run_id] = (rows[-1][1], rows[-1][7])
        return at, rows

    def _insert(
        self, cursor: sqlite3.Cursor, run_id: str, at: str, prepared: list[Prepared]
    ) -> list[tuple[Any, ...]]:
        head = self._heads.get(run_id)
        if head is None:
            head = _load_head(cursor, run_id)
        rows = chain_rows(run_id, at, prepared, head)
        if not _advance_head(cursor, run_id, head, rows[-1]):
            # Another connection appended since we cached the head. We hold the write
            # lock now, so the reloaded head cannot move again.
            head = _load_head(cursor, run_id)
            rows = chain_rows(run_id, at, prepared, head)
            if not _advance_head(cursor, run_id, head, rows[-1]):
                raise LedgerError(f"the head of run {run_id!r} moved under the write lock")
        try:
            _insert_rows(cursor, rows)
        except sqlite3.IntegrityError as exc:
            self._heads.pop(run_id, None)
            raise LedgerError(
                f"run {run_id!r} in {self._path}: stored events and head disagree "
                f"(seq {head[0] + 1} already exists); verify the ledger"
            ) from exc
        index = [(*p[3], run_id, row[1]) for p, row in zip(prepared, rows, strict=True) if p[3]]
        if index:
            cursor.executemany(_INSERT_INDEX, index)
        return rows

    def events(self, run_id: str, *, after_seq: int = 0) -> list[Event]:
        """The events of ``run_id`` with ``seq > after_seq``, in ``seq`` order.

        Raises:
            LedgerError: the events could not be read or decoded.
        """
        with self._lock, self._translate("read"):
            rows = self._live().execute(_SELECT_EVENTS, (run_id, after_seq))
            return [row_event(row) for row in rows]

    def runs(self) -> list[RunSummary]:
        """Every run that has events, by first event time.

        Raises:
            LedgerError: the runs could not be read.
        """
        with self._lock, self._translate("read"):
            rows = self._live().execute(_SELECT_RUNS)
            return [RunSummary(*row) for row in rows]

    def find_indexed(self, tool_name: str, key: str) -> Event | None:
        """The event stored under ``(tool_name, key)``, or ``None``.

        Raises:
            LedgerCorrupted: the entry points at no event, or the event cannot be
                decoded (``ledger verify`` says more).
            LedgerError: the event could not be read.
        """
        with self._lock, self._translate("read"):
            row = self._live().execute(_SELECT_INDEXED, (tool_name, key)).fetchone()
            return None if row is None else indexed_event(row, tool_name, key)

    def claim_key(self, tool_name: str, key: str, owner: str, lease_s: float) -> bool:
        """See :meth:`Ledger.claim_key`; the lease runs on this machine's clock.

        Raises:
            LedgerError: the claim could not be recorded.
        """
        now = time.time()
        with self._lock, self._translate("claim a key in"):
            taken = self._writable().execute(_CLAIM, (tool_name, key, owner, now + lease_s, now))
            return taken.rowcount == 1

    def renew_key(self, tool_name: str, key: str, owner: str, lease_s: float) -> bool:
        """See :meth:`Ledger.renew_key`.

        Raises:
            LedgerError: the lease could not be extended.
        """
        with self._lock, self._translate("renew a key in"):
            renewed = self._writable().execute(
                _RENEW, (time.time() + lease_s, tool_name, key, owner)
            )
            return renewed.rowcount == 1

    def release_key(self, tool_name: str, key: str, owner: str) -> None:
        """See :meth:`Ledger.release_key`.

        Raises:
            LedgerError: the claim could not be removed.
        """
        with self._lock, self._translate("release a key in"):
            self._writable().execute(_RELEASE, (tool_name, key, owner))

    def verify(self, run_id: str | None = None) -> VerifyReport:
        """Check the chain and head of one run, or of every run.

        Raises:
            LedgerError: the file could not be read.
        """
        return self._verified(run_id, keep=False).report

    def read_verified(self, run_id: str | None = None) -> VerifiedRead:
        """See :meth:`Ledger.read_verified`.

        Raises:
            LedgerError: the file could not be read.
        """
        return self._verified(run_id, keep=True)

    def _verified(self, run_id: str | None, *, keep: bool) -> VerifiedRead:
        params: tuple[str, ...]
        if run_id is None:
            heads_sql, events_sql, params = _SELECT_HEADS, _SELECT_ALL_EVENTS, ()
        else:
            heads_sql, events_sql, params = _SELECT_RUN_HEAD, _SELECT_RUN_EVENTS, (run_id,)
        with self._lock, self._translate("verify"):
            conn = self._live()
            # One read transaction, so events and heads are seen at the same instant
            # even while other processes append.
            conn.execute("BEGIN")
            try:
                heads = {r: (s, h) for r, s, h in conn.execute(heads_sql, params)}
                verifier = Verifier(heads, conn.execute(_SELECT_INDEX), run_id=run_id, keep=keep)
                report = verifier.run(conn.execute(events_sql, params))
            finally:
                _rollback(conn)
        return VerifiedRead(report, *readable_runs(verifier.rows))

    def close(self) -> None:
        """Close the database connection. Closing twice is harmless."""
        with self._lock:
            conn, self._conn = self._conn, None
            file, self._file = self._file, None
            self._heads.clear()
            if file is not None:
                self._release_file()
            if conn is not None:
                with self._translate("close"):
                    conn.close()

    def _live(self) -> sqlite3.Connection:
        if self._conn is None:
            raise LedgerError(f"the ledger at {self._path} is closed")
        return self._conn

    def _writable(self) -> sqlite3.Connection:
        """The connection, for a write: refused when the file was deleted or replaced
        (renamed over) since it was opened, as nothing written would be kept."""
        conn = self._live()
        if self._file is not None and os.fstat(self._file).st_nlink == 0:
            raise LedgerError(
                f"the ledger file {self._path} was deleted or replaced while in use: "
                "nothing more can be recorded in it; restart to open a ledger there again"
            )
        return conn

    @contextmanager
    def _translate(self, action: str) -> Iterator[None]:
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            why = f"could not {action} the ledger at {self._path}: {exc}{_full(self._path)}"
            raise LedgerError(why) from exc


def _full(path: Path) -> str:
    """A note when the file system holding ``path`` has no space left, which SQLite
    reports as a bare "disk I/O error" (a -shm it cannot grow, say)."""
    try:
        space = os.statvfs(path.parent)
    except OSError:
        return ""
    if space.f_bavail > 0:
        return ""
    return f" (the file system holding {path.parent} is full: free space, then try again)"


def _open(path: Path, synchronous: str) -> sqlite3.Connection:
    _make_parents(path.parent)
    if path.is_symlink() and not path.exists():
        raise _dangling(path)
    if not path.exists():
        _create(path)
    # What is there must be a ledger file: SQLite reports a FIFO as a bare "disk I/O
    # error", and would take an emptied ledger for a new one (and the next call would
    # make ``verify`` call it intact). A ledger is never empty, as _create makes it.
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    try:
        status = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(status.st_mode):
        raise _not_regular(path)
    if status.st_size == 0:
        raise _emptied(path)
    # Autocommit mode: transactions are begun and ended explicitly below, so that
    # appends can take the write lock up front with BEGIN IMMEDIATE.
    conn = sqlite3.connect(
        path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    conn.text_factory = _text
    try:
        _check_own(conn, path)
        _configure(conn, path, synchronous)
        _migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _create(path: Path) -> None:
    """Make a new ledger at ``path`` whole, or leave the one another process made first.

    It is built in a file of its own beside ``path`` (0o600; SQLite would use 0o644) and
    linked into place only when its tables are there: a creation cut short never leaves
    an empty file at ``path``, which would then be taken for an emptied ledger.
    """
    fd, building = tempfile.mkstemp(prefix=f"{path.name}.", suffix=".new", dir=path.parent)
    os.close(fd)
    try:
        conn = sqlite3.connect(building, isolation_level=None)
        try:
            _configure(conn, path, "normal")
            _migrate(conn)
        finally:
            conn.close()  # the last connection: its -wal is written back and removed
        with suppress(FileExistsError):  # another process created it meanwhile
            os.link(building, path)
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)  # the new name survives a power failure too
        finally:
            os.close(directory)
    finally:
        for leftover in (building, f"{building}-wal", f"{building}-shm"):
            Path(leftover).unlink(missing_ok=True)


def _emptied(path: Path) -> LedgerError:
    """An empty file where a ledger is (``_create`` never leaves one): refused before
    SQLite opens it, which would take it for a new database and delete a -wal beside
    it, with the last events that -wal may hold."""
    wal = path.with_name(f"{path.name}-wal")
    try:
        wal_bytes = wal.stat().st_size
    except OSError:
        wal_bytes = 0
    if wal_bytes:
        return LedgerError(
            f"the ledger at {path} is an empty file, beside {wal} of {wal_bytes} bytes "
            "that may hold its last events: copy both aside before anything opens the "
            "ledger (SQLite deletes a -wal beside an empty database)"
        )
    return LedgerError(
        f"the ledger at {path} is an empty file: it was emptied, and its events are "
        "gone, or it is not a ledger; it is not started anew in place, so that its loss "
        "is not hidden: delete it (or move it aside) to start a new ledger there"
    )


def _open_read_only(path: Path) -> sqlite3.Connection:
    """A connection that only reads ``path``: no table created, migrated or switched."""
    _check_file(path)
    uri = path.absolute().as_uri()
    try:
        return _connect_read_only(f"{uri}?mode=ro", path)
    except sqlite3.OperationalError as exc:
        if not _unreadable_without_shm(exc, path):
            raise
    # A WAL-mode file needs a -shm file beside it even to be read, and there is none and
    # we may not create one. That falls back to immutable=1 only when we cannot write
    # the file at all and no -wal holds commits, so the file alone is the whole ledger.
    # immutable=1 reads without the -shm and without locks: a writer that starts
    # meanwhile (one who may write the directory) could change pages under the read.
    return _connect_read_only(f"{uri}?immutable=1", path)


def _dangling(path: Path) -> LedgerError:
    return LedgerError(
        f"the ledger at {path} is a symbolic link to {path.readlink()}, which does not exist"
    )


def _not_regular(path: Path) -> LedgerError:
    return LedgerError(f"the ledger at {path} is not a regular file")


def _check_file(path: Path) -> None:
    """Refuse what SQLite would misread before it opens it: opening a FIFO waits for a
    writer, and an empty file (or none) reads as an empty database."""
    try:
        status = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise _dangling(path) from None
        raise LedgerError(f"there is no ledger at {path}") from None
    except OSError as exc:
        raise LedgerError(f"cannot read the ledger at {path}: {exc.strerror}") from exc
    if not stat.S_ISREG(status.st_mode):
        raise _not_regular(path)
    if status.st_size == 0:
        raise _emptied(path)


def _unreadable_without_shm(exc: sqlite3.OperationalError, path: Path) -> bool:
    """Whether ``exc`` is SQLite unable to create the -shm file of ``path``, a file we
    cannot write, whose -wal holds no commits.

    Raises:
        LedgerError: the -wal holds commits, which cannot be read without a -shm file.
    """
    if exc.sqlite_errorname not in _NO_WAL_INDEX or not path.is_file():
        return False
    wal = path.with_name(f"{path.name}-wal")
    if wal.is_file() and wal.stat().st_size > 0:
        raise LedgerError(
            f"cannot read the ledger at {path} without writing: {wal.name} holds commits, "
            f"and reading them needs a {path.name}-shm file, which cannot be created in "
            f"{path.parent}"
        ) from exc
    return not os.access(path, os.W_OK)


def _connect_read_only(uri: str, path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(
        uri, uri=True, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    conn.text_factory = _text
    try:
        _check_tables(conn, path)
        _check_version(conn.execute("SELECT max(version) FROM schema_version").fetchone()[0])
    except BaseException:
        conn.close()
        raise
    return conn


def _text(raw: bytes) -> str | Undecoded:
    """A text field as ``str``; one that is not UTF-8 as :class:`Undecoded`, which
    ``verify`` reports as ``bad_payload`` and readers refuse, naming the event."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return Undecoded(raw)


def _check_tables(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a file without the ledger's tables (reading must not create them)."""
    tables = {
        name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    missing = [table for table in _TABLES if table not in tables]
    if missing:
        raise LedgerError(
            f"the ledger at {path} has no {', '.join(missing)} table: it is damaged, "
            "or not a toolkernel ledger"
        )


def _check_own(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a file that holds tables of another application, before anything is
    changed in it (WAL mode included): the ledger's tables would be added next to them,
    in a file ``verify`` then calls no ledger. An older ledger only lacks some of ours,
    which ``_migrate`` adds; a file with no events table is none (``_create`` makes
    every ledger with its tables)."""
    rows = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' "
        "ESCAPE '\\'"
    )
    names = [str(name) for (name,) in rows]
    foreign = sorted(name for name in names if name not in _OWN_TABLES)
    if foreign:
        shown = ", ".join(printable(name) for name in foreign[:_SHOWN_TABLES])
        more = ", …" if len(foreign) > _SHOWN_TABLES else ""
        raise LedgerError(
            f"the file at {path} is not a toolkernel ledger: it holds other tables "
            f"({shown}{more}); give the ledger a file of its own"
        )
    if "events" not in names:
        raise LedgerError(
            f"the file at {path} is not a toolkernel ledger: it has no events table; "
            "delete it (or move it aside) to start a new ledger there"
        )


def _configure(conn: sqlite3.Connection, path: Path, synchronous: str) -> None:
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if mode != "wal":
        raise LedgerError(f"the ledger at {path} cannot use WAL mode (got {mode!r})")
    conn.execute(
        "PRAGMA synchronous=FULL" if synchronous == "full" else "PRAGMA synchronous=NORMAL"
    )


def _make_parents(directory: Path) -> None:
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for new in reversed(missing):
        new.mkdir(mode=0o700, exist_ok=True)


def _migrate(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in _SCHEMA:
            conn.execute(statement)
        _stamp_version(conn)
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _stamp_version(conn: sqlite3.Connection) -> None:
    # Migrations to later versions go here, each recorded with its own row.
    version = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]
    if version is None:
        conn.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
            (SCHEMA_VERSION, timestamp()),
        )
    else:
        _check_version(version)


def _check_version(version: object) -> None:
    """Refuse a ledger written by a newer schema version (or an unreadable one)."""
    if version is not None and not (type(version) is int and version <= SCHEMA_VERSION):
        raise LedgerError(
            f"the ledger has schema version {version!r}; this toolkernel knows up to "
            f"{SCHEMA_VERSION}"
        )


def _rollback(conn: sqlite3.Connection) -> None:
    # Called while another exception propagates: a failing rollback must not replace
    # it, and SQLite has already rolled back after the errors that make ROLLBACK fail.
    if conn.in_transaction:
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _insert_rows(cursor: sqlite3.Cursor, rows: list[tuple[Any, ...]]) -> None:
    """Insert event rows, up to ``_ROWS_PER_INSERT`` in one statement.

    ``executemany`` takes a step of SQLite per row, and lets go of the GIL for each:
    in a group-commit writer, whose caller keeps the GIL busy, every row then waited
    for it again (measured: a batch stored 25 times slower than with nothing else
    running). One statement of many rows takes it back once, and costs less alone too.
    """
    for start in range(0, len(rows), _ROWS_PER_INSERT):
        chunk = rows[start : start + _ROWS_PER_INSERT]
        cursor.execute(_INSERT_EVENTS[len(chunk)], [v for row in chunk for v in row])


_ROWS_PER_INSERT: Final = 64  # 512 parameters, far below SQLite's limit
# The INSERT of n event rows at index n: one text per count, so each is prepared once.
_INSERT_EVENTS: Final = tuple(
    "INSERT INTO events (run_id, seq, type, at, tool_call_id, payload, prev_hash, hash) "
    "VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * count)
    for count in range(_ROWS_PER_INSERT + 1)
)


def _load_head(cursor: sqlite3.Cursor, run_id: str) -> Head:
    row = cursor.execute(_SELECT_HEAD, (run_id,)).fetchone()
    return (0, GENESIS_HASH) if row is None else (row[0], row[1])


def _advance_head(cursor: sqlite3.Cursor, run_id: str, head: Head, last: tuple[Any, ...]) -> bool:
    """Move the run's head from ``head`` to ``last``; False if ``head`` is stale."""
    if head[0] == 0:
        cursor.execute(_INSERT_HEAD, (run_id, last[1], last[7]))
    else:
        cursor.execute(_ADVANCE_HEAD, (last[1], last[7], run_id, head[0], head[1]))
    return cursor.rowcount == 1


def _prepare(events: Iterable[NewEvent]) -> list[Prepared]:
    """Check each type and encode each payload, before the file is touched."""
    return [
        (
            e.type if e.type.__class__ is EventType else EventType(e.type),
            e.tool_call_id,
            plain_json(e.payload) if e.plain else canonical_json(e.payload),
            e.index_key,
        )
        for e in events
    ]

"""The shared ledger: PostgreSQL, for many workers appending to the same runs.

Same records, hashes and checks as the SQLite ledger (a run moved from one backend to
the other verifies), stored in one PostgreSQL schema (``toolkernel`` by default)
created on first use.

Appends serialize per run, not globally: each run's *head* row is the lock. An append
whose cached head is current is one statement, in one round trip: it advances the
head only if it still holds the cached ``seq`` and hash, and inserts the events only if
it did. When the head moved (another worker appended), the append takes the head row
with ``SELECT … FOR UPDATE``, re-chains onto it and writes in the same transaction.
Durability is the server's (``synchronous_commit``).

One connection per ledger, shared by the threads that use it. A connection the server
dropped (a restart, a failover, an idle kill) is replaced, and the call that found it
dropped runs once more on the new one: a read as it was; an append only after checking
whether its commit reached the server before the drop (its last event, which the hash
identifies, is there or not), so it is never stored twice. When that cannot be found
out (the server is still away), :class:`LedgerError` says so (``maybe_stored``).

Every wait is bounded: connecting (10 s), a lock (10 s), a statement (60 s), a silent
peer (TCP keepalives and a 30 s user timeout), unless the DSN says otherwise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.errors import UniqueViolation

from toolkernel.calls import timestamp
from toolkernel.canonical import canonical_json, plain_json
from toolkernel.errors import LedgerMissing
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

# The record layout, chaining, decoding and verification are the SQLite backend's, so
# that both backends store and check exactly the same thing.
from toolkernel.ledger.rows import (
    Head,
    Prepared,
    Verifier,
    chain_rows,
    indexed_event,
    readable_runs,
    row_event,
    stored_events,
)

__all__ = ["PostgresLedger"]

SCHEMA_VERSION: Final = 1
# Defaults for what the DSN does not set; a DSN's own values win. The keepalives and
# the user timeout turn a peer that went silent (a hung host, a cut network) into an
# error instead of a wait without end.
_CONNECT_DEFAULTS: Final[dict[str, Any]] = {
    "connect_timeout": 10,
    "application_name": "toolkernel-ledger",
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,  # ms
}
# No statement of the ledger's takes long; one that does is stuck: fail loudly.
_STATEMENT_TIMEOUT: Final = "60s"
# Waiting this long for another worker's lock on a run's head is abnormal: fail loudly.
_LOCK_TIMEOUT: Final = "10s"
_VERIFY_BATCH: Final = 2000

# Unqualified names: every connection's search_path is the ledger's schema alone.
_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS schema_version (
        version integer PRIMARY KEY,
        applied_at text NOT NULL
    )""",
    # Text, not timestamptz or jsonb: the stored strings are the hashed bytes.
    """CREATE TABLE IF NOT EXISTS events (
        run_id text COLLATE "C" NOT NULL,
        seq bigint NOT NULL,
        type text NOT NULL,
        at text NOT NULL,
        tool_call_id text,
        payload text NOT NULL,
        prev_hash text NOT NULL,
        hash text NOT NULL,
        PRIMARY KEY (run_id, seq)
    )""",
    # One row per run, written with its events: a deleted tail shows as a head that
    # points past the last stored event. Its row lock serializes appends to the run.
    """CREATE TABLE IF NOT EXISTS heads (
        run_id text COLLATE "C" PRIMARY KEY,
        seq bigint NOT NULL,
        hash text NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS idempotency (
        tool_name text COLLATE "C" NOT NULL,
        key text COLLATE "C" NOT NULL,
        run_id text COLLATE "C" NOT NULL,
        seq bigint NOT NULL,
        PRIMARY KEY (tool_name, key)
    )""",
    # Keys whose call is running now, in some worker (claim_key); leases run on the
    # server's clock, so workers on several machines agree.
    """CREATE TABLE IF NOT EXISTS idempotency_claims (
        tool_name text COLLATE "C" NOT NULL,
        key text COLLATE "C" NOT NULL,
        owner text NOT NULL,
        expires timestamptz NOT NULL,
        PRIMARY KEY (tool_name, key)
    )""",
)

# The events and index entries are stored only if the head CTE ``h`` moved the head.
# One statement is one transaction in autocommit mode: atomic without BEGIN and COMMIT.
_APPEND: Final = sql.SQL("""WITH h AS ({head}),
    e AS (
        INSERT INTO events (run_id, seq, type, at, tool_call_id, payload, prev_hash, hash)
        SELECT %(run)b, %(old_seq)b::bigint + u.ord, u.type, %(at)b, u.call, u.payload,
               u.prev, u.hash
        FROM unnest(%(types)b::text[], %(calls)b::text[], %(payloads)b::text[],
                    %(prevs)b::text[], %(hashes)b::text[])
             WITH ORDINALITY AS u(type, call, payload, prev, hash, ord)
        WHERE EXISTS (SELECT FROM h)
    ),
    i AS (
        INSERT INTO idempotency (tool_name, key, run_id, seq)
        SELECT u.tool, u.key, %(run)b, %(old_seq)b::bigint + u.pos
        FROM unnest(%(index_tools)b::text[], %(index_keys)b::text[], %(index_pos)b::bigint[])
             AS u(tool, key, pos)
        WHERE EXISTS (SELECT FROM h)
        ORDER BY u.pos
        ON CONFLICT DO NOTHING
    )
SELECT count(*) FROM h""")
_APPEND_ADVANCE: Final = _APPEND.format(
    head=sql.SQL(
        "UPDATE heads SET seq = %(new_seq)b, hash = %(new_hash)b "
        "WHERE run_id = %(run)b AND seq = %(old_seq)b AND hash = %(old_hash)b RETURNING 1"
    )
).as_bytes()
_APPEND_CREATE: Final = _APPEND.format(
    head=sql.SQL(
        "INSERT INTO heads (run_id, seq, hash) VALUES (%(run)b, %(new_seq)b, %(new_hash)b) "
        "ON CONFLICT DO NOTHING RETURNING 1"
    )
).as_bytes()
_LOCK_HEAD: Final = "SELECT seq, hash FROM heads WHERE run_id = %s FOR UPDATE"
_SELECT_EVENTS: Final = (
    "SELECT run_id, seq, type, at, tool_call_id, payload, prev_hash, hash FROM events "
    "WHERE run_id = %s AND seq > %s ORDER BY seq"
)
_SELECT_ALL_EVENTS: Final = (
    "SELECT run_id, seq, type, at, tool_call_id, payload, prev_hash, hash FROM events "
    "ORDER BY run_id, seq"
)
_SELECT_RUN_EVENTS: Final = (
    "SELECT run_id, seq, type, at, tool_call_id, payload, prev_hash, hash FROM events "
    "WHERE run_id = %s ORDER BY seq"
)
_SELECT_HEADS: Final = "SELECT run_id, seq, hash FROM heads"
_SELECT_RUN_HEAD: Final = "SELECT run_id, seq, hash FROM heads WHERE run_id = %s"
_SELECT_INDEX: Final = "SELECT tool_name, key, run_id, seq FROM idempotency"
_SELECT_RUNS: Final = (
    "SELECT run_id, count(*), min(at), max(at) FROM events GROUP BY run_id ORDER BY min(at), run_id"
)
# LEFT JOIN: an entry whose event is gone is found, and refused (indexed_event).
_SELECT_INDEXED: Final = (
    "SELECT i.run_id, i.seq, "
    "e.run_id, e.seq, e.type, e.at, e.tool_call_id, e.payload, e.prev_hash, e.hash "
    "FROM idempotency AS i LEFT JOIN events AS e ON e.run_id = i.run_id AND e.seq = i.seq "
    "WHERE i.tool_name = %s AND i.key = %s"
)

_CLAIM: Final = (
    "INSERT INTO idempotency_claims AS c (tool_name, key, owner, expires) "
    "VALUES (%s, %s, %s, clock_timestamp() + make_interval(secs => %s)) "
    "ON CONFLICT (tool_name, key) DO UPDATE SET owner = excluded.owner, "
    "expires = excluded.expires WHERE c.expires < clock_timestamp() OR c.owner = excluded.owner"
)
_RENEW: Final = (
    "UPDATE idempotency_claims SET expires = clock_timestamp() + make_interval(secs => %s) "
    "WHERE tool_name = %s AND key = %s AND owner = %s"
)
_RELEASE: Final = "DELETE FROM idempotency_claims WHERE tool_name = %s AND key = %s AND owner = %s"

_Conn = psycopg.Connection[tuple[Any, ...]]
_T = TypeVar("_T")
_STORED: Final = "SELECT 1 FROM events WHERE run_id = %s AND seq = %s AND hash = %s"
# (type, tool_call_id, canonical payload, index_key) of an event about to be stored.


class PostgresLedger(Ledger):
    """A ledger stored in a PostgreSQL schema, created with its tables on first use.

    Args:
        dsn: A libpq connection string or URI (``host=/run/postgresql dbname=agents``,
            ``postgresql://worker@db/agents``); libpq's ``PG*`` environment variables
            fill in what it leaves out. ``connect_timeout`` defaults to 10 s.
        schema: The PostgreSQL schema holding the ledger's tables.
        read_only: only read (an auditor's ``verify``): nothing is created, and
            the session is read-only.

    Raises:
        LedgerMissing: (``read_only``) the schema holds no ledger.
        LedgerError: the DSN is invalid, the server cannot be reached or refuses the
            login, its encoding is not UTF-8, the schema cannot be created, or it was
            written by a newer schema version.
        ValueError: ``schema`` is empty or holds a NUL character.
    """

    def __init__(self, dsn: str, *, schema: str = "toolkernel", read_only: bool = False) -> None:
        if not schema or "\0" in schema:
            raise ValueError(f"schema must be a non-empty name without NUL, not {schema!r}")
        self._schema = schema
        try:
            self._params: dict[str, Any] = conninfo_to_dict(dsn)
        except psycopg.Error as exc:
            # psycopg's message quotes the DSN, which may hold a password.
            raise LedgerError("the ledger DSN is not a valid PostgreSQL connection string") from exc
        for name, value in _CONNECT_DEFAULTS.items():
            self._params.setdefault(name, value)
        self._where = _describe(self._params, schema)
        self._lock = threading.Lock()
        self._heads: dict[str, Head] = {}
        # The rows each run's latest append attempt sent, to tell after a dropped
        # connection whether its commit was stored.
        self._attempted: dict[str, list[tuple[Any, ...]]] = {}
        self._closed = False
        self._read_only = read_only
        with self._translate("open"):
            self._conn: _Conn = self._connect()
            try:
                self._check_present() if read_only else self._migrate()
            except BaseException:
                self._conn.close()
                raise

    @property
    def schema(self) -> str:
        """The PostgreSQL schema holding the ledger's tables."""
        return self._schema

    def append(self, run_id: str, events: Sequence[NewEvent]) -> list[Event]:
        """Append ``events`` to ``run_id``, atomically: all are stored, or none.

        Returns:
            The stored events, in order.

        Raises:
            LedgerError: nothing was stored (server unreachable, lock timeout, or a run
                whose stored events and head disagree; :meth:`verify` shows why). If
                the connection dropped during the commit, the events may be stored.
            TypeError: a payload is not JSON-able; nothing was stored.
            ValueError: a payload holds NaN or Infinity, a type is not an
                :class:`EventType`, or the run id, a tool call id or an index key holds
                a NUL character (PostgreSQL text cannot); nothing was stored.
        """
        if not events:
            return []
        _check_storable(run_id)
        prepared = [_prepare(e) for e in events]
        at = timestamp()
        with self._lock:
            self._appending(
                f"run {run_id!r}",
                [run_id],
                lambda conn: self._append_one(conn, run_id, at, prepared),
            )
            rows = self._attempted[run_id]
        return stored_events(run_id, at, rows, prepared, events)

    def append_batch(self, batches: Sequence[tuple[str, Sequence[NewEvent]]]) -> None:
        """Append several runs' events in one transaction: all are stored, or none.

        Raises:
            LedgerError: nothing was stored.
            TypeError: a payload is not JSON-able; nothing was stored.
            ValueError: as for :meth:`append`; nothing was stored.
        """
        merged: dict[str, list[Prepared]] = {}
        for run_id, events in batches:
            _check_storable(run_id)
            merged.setdefault(run_id, []).extend(_prepare(e) for e in events)
        todo = {run_id: prepared for run_id, prepared in merged.items() if prepared}
        if not todo:
            return
        at = timestamp()

        def store(conn: _Conn) -> None:
            with conn.transaction():
                # Runs in one order for every worker, so two batches cannot deadlock.
                for run_id in sorted(todo):
                    self._store(conn, run_id, at, todo[run_id])

        with self._lock:
            self._appending("a batch", sorted(todo), store)

    def events(self, run_id: str, *, after_seq: int = 0) -> list[Event]:
        """The events of ``run_id`` with ``seq > after_seq``, in ``seq`` order.

        Raises:
            LedgerError: the events could not be read or decoded.
        """
        if "\0" in run_id:
            return []  # such a run cannot have been stored
        rows = self._retrying(
            "read", lambda conn: conn.execute(_SELECT_EVENTS, (run_id, after_seq)).fetchall()
        )
        return [row_event(row) for row in rows]

    def runs(self) -> list[RunSummary]:
        """Every run that has events, by first event time.

        Raises:
            LedgerError: the runs could not be read.
        """
        rows = self._retrying("read", lambda conn: conn.execute(_SELECT_RUNS).fetchall())
        return [RunSummary(*row) for row in rows]

    def find_indexed(self, tool_name: str, key: str) -> Event | None:
        """The event stored under ``(tool_name, key)``, or ``None``.

        Raises:
            LedgerCorrupted: the entry points at no event, or the event cannot be
                decoded (``ledger verify`` says more).
            LedgerError: the event could not be read.
        """
        if "\0" in tool_name or "\0" in key:
            return None
        row = self._retrying(
            "read", lambda conn: conn.execute(_SELECT_INDEXED, (tool_name, key)).fetchone()
        )
        return None if row is None else indexed_event(row, tool_name, key)

    def claim_key(self, tool_name: str, key: str, owner: str, lease_s: float) -> bool:
        """See :meth:`Ledger.claim_key`; the lease runs on the server's clock.

        Raises:
            LedgerError: the claim could not be recorded.
        """
        if "\0" in tool_name or "\0" in key:
            return True  # never indexed either (PostgreSQL text cannot hold NUL)
        # Again after a drop is safe: the same owner takes its own claim over.
        return self._retrying(
            "claim a key in",
            lambda conn: conn.execute(_CLAIM, (tool_name, key, owner, lease_s)).rowcount == 1,
        )

    def renew_key(self, tool_name: str, key: str, owner: str, lease_s: float) -> bool:
        """See :meth:`Ledger.renew_key`.

        Raises:
            LedgerError: the lease could not be extended.
        """
        if "\0" in tool_name or "\0" in key:
            return True
        return self._retrying(
            "renew a key in",
            lambda conn: conn.execute(_RENEW, (lease_s, tool_name, key, owner)).rowcount == 1,
        )

    def release_key(self, tool_name: str, key: str, owner: str) -> None:
        """See :meth:`Ledger.release_key`.

        Raises:
            LedgerError: the claim could not be removed.
        """
        if "\0" in tool_name or "\0" in key:
            return
        self._retrying(
            "release a key in", lambda conn: conn.execute(_RELEASE, (tool_name, key, owner))
        )

    def verify(self, run_id: str | None = None) -> VerifyReport:
        """Check the chain and head of one run, or of every run.

        Events are streamed from a server-side cursor, so memory stays flat however
        large the ledger is (the heads and the idempotency index are read whole).

        Raises:
            LedgerError: the ledger could not be read.
        """
        return self._verified(run_id, keep=False).report

    def read_verified(self, run_id: str | None = None) -> VerifiedRead:
        """See :meth:`Ledger.read_verified` (the events are held in memory).

        Raises:
            LedgerError: the ledger could not be read.
        """
        return self._verified(run_id, keep=True)

    def _verified(self, run_id: str | None, *, keep: bool) -> VerifiedRead:
        if run_id is not None and "\0" in run_id:
            return VerifiedRead(VerifyReport(0, 0), [])
        params: tuple[str, ...]
        if run_id is None:
            heads_sql, events_sql, params = _SELECT_HEADS, _SELECT_ALL_EVENTS, ()
        else:
            heads_sql, events_sql, params = _SELECT_RUN_HEAD, _SELECT_RUN_EVENTS, (run_id,)

        def check(conn: _Conn) -> VerifiedRead:
            with conn.transaction():
                # One snapshot, so events and heads are seen at the same instant even
                # while other workers append.
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                heads = {r: (s, h) for r, s, h in conn.execute(heads_sql, params)}
                verifier = Verifier(heads, conn.execute(_SELECT_INDEX), run_id=run_id, keep=keep)
                with conn.cursor(name="toolkernel_verify") as cursor:
                    cursor.itersize = _VERIFY_BATCH
                    cursor.execute(events_sql, params)
                    report = verifier.run(cursor)
            return VerifiedRead(report, *readable_runs(verifier.rows))

        return self._retrying("verify", check)

    def close(self) -> None:
        """Close the connection. Closing twice is harmless."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._heads.clear()
                self._conn.close()

    # --- appending --------------------------------------------------------------------

    def _append_one(
        self, conn: _Conn, run_id: str, at: str, prepared: list[Prepared]
    ) -> list[tuple[Any, ...]]:
        rows = self._store_cached(conn, run_id, at, prepared)
        if rows is None:
            with conn.transaction():
                rows = self._store_locked(conn, run_id, at, prepared)
        return rows

    def _store(
        self, conn: _Conn, run_id: str, at: str, prepared: list[Prepared]
    ) -> list[tuple[Any, ...]]:
        """Chain and store one run's events inside the caller's transaction."""
        rows = self._store_cached(conn, run_id, at, prepared)
        return self._store_locked(conn, run_id, at, prepared) if rows is None else rows

    def _store_cached(
        self, conn: _Conn, run_id: str, at: str, prepared: list[Prepared]
    ) -> list[tuple[Any, ...]] | None:
        """Store onto the cached head, in one statement; None if there is none or it moved."""
        head = self._heads.get(run_id)
        if head is None:
            return None
        rows = self._attempted[run_id] = chain_rows(run_id, at, prepared, head)
        return rows if _try_append(conn, head, rows, prepared) else None

    def _store_locked(
        self, conn: _Conn, run_id: str, at: str, prepared: list[Prepared]
    ) -> list[tuple[Any, ...]]:
        # Holding the head row, the append cannot miss. A run without a head has no row
        # to lock: two workers may both try to create it, and the loser goes round
        # once more, then finds the row.
        for _ in range(3):
            row = conn.execute(_LOCK_HEAD, (run_id,)).fetchone()
            head: Head = (0, GENESIS_HASH) if row is None else (row[0], row[1])
            rows = self._attempted[run_id] = chain_rows(run_id, at, prepared, head)
            if _try_append(conn, head, rows, prepared):
                return rows
        raise LedgerError(f"the head of run {run_id!r} in {self._where} moved under its lock")

    def _appending(self, what: str, runs: list[str], attempt: Callable[[_Conn], object]) -> None:
        """Run ``attempt`` (which records what it sends in ``_attempted``); after a drop,
        find out whether it was stored, and if it was not, run it once more. On return,
        ``_attempted`` holds each run's stored rows and the heads cache follows them.
        The caller holds ``_lock``."""
        self._attempted.clear()
        conn: _Conn | None = None
        try:
            conn = self._live()
            attempt(conn)
        except psycopg.Error as exc:
            for run_id in runs:
                self._heads.pop(run_id, None)
            if conn is None or not _dropped(conn):
                raise self._append_error(exc, what) from exc
            self._after_drop(what, runs, attempt, exc)
        for run_id in runs:
            rows = self._attempted[run_id]
            self._heads[run_id] = (rows[-1][1], rows[-1][7])

    def _after_drop(
        self, what: str, runs: list[str], attempt: Callable[[_Conn], object], cause: Exception
    ) -> None:
        sent = {run_id: self._attempted.get(run_id) for run_id in runs}
        try:
            conn = self._live()
            found = [
                rows is not None
                and conn.execute(_STORED, (run_id, rows[-1][1], rows[-1][7])).fetchone() is not None
                for run_id, rows in sent.items()
            ]
        except psycopg.Error as exc:
            error = LedgerError(
                f"could not append {what} to {self._where}: the connection dropped during "
                f"the commit and the server is not back ({_one_line(exc)}); the events may "
                "be stored: verify the ledger"
            )
            error.maybe_stored = True
            raise error from cause
        if all(found):
            return  # the commit was stored; only its answer was lost
        if any(found):  # one transaction: all or nothing
            partly = LedgerError(f"{what} in {self._where} was stored in part; verify the ledger")
            partly.maybe_stored = True  # stored again, what is stored would be there twice
            raise partly
        try:
            attempt(conn)
        except psycopg.Error as exc:
            for run_id in runs:
                self._heads.pop(run_id, None)
            error = self._append_error(exc, what)
            # Cut off again: this commit too may have landed. Not known: never repeated.
            error.maybe_stored = _dropped(conn)
            raise error from exc

    def _retrying(self, action: str, work: Callable[[_Conn], _T]) -> _T:
        """``work`` on the live connection, and once more on a new one if the server had
        dropped the old one (a restart, a failover): only for work that may be repeated."""
        with self._lock, self._translate(action):
            conn = self._live()
            try:
                return work(conn)
            except psycopg.OperationalError:
                if not _dropped(conn):
                    raise
            return work(self._live())

    def _append_error(self, exc: psycopg.Error, what: str) -> LedgerError:
        if isinstance(exc, UniqueViolation):
            return LedgerError(
                f"{what} in {self._where}: stored events and head disagree "
                f"(a seq after the head already exists); verify the ledger"
            )
        return LedgerError(f"could not append {what} to {self._where}: {_one_line(exc)}")

    # --- connection -------------------------------------------------------------------

    def _connect(self) -> _Conn:
        conn = psycopg.connect(autocommit=True, **self._params)
        try:
            _check_encoding(conn, self._where)
            conn.execute(
                "SELECT set_config('search_path', %s, false), "
                "set_config('lock_timeout', %s, false), "
                "set_config('statement_timeout', %s, false), "
                "set_config('idle_in_transaction_session_timeout', %s, false), "
                # Every session of a read-only ledger, a replaced one included.
                "set_config('default_transaction_read_only', %s, false)",
                (
                    sql.Identifier(self._schema).as_string(),
                    _LOCK_TIMEOUT,
                    _STATEMENT_TIMEOUT,
                    _STATEMENT_TIMEOUT,
                    "on" if self._read_only else "off",
                ),
            )
        except BaseException:
            conn.close()
            raise
        return conn

    def _live(self) -> _Conn:
        if self._closed:
            raise LedgerError(f"the ledger in {self._where} is closed")
        if self._conn.closed:
            # The server dropped us (restart, failover, idle kill). The cached heads are
            # still checked by every append, but start clean anyway.
            self._heads.clear()
            self._conn = self._connect()
        return self._conn

    def _check_present(self) -> None:
        """For a read-only open: the schema holds a ledger this toolkernel can read."""
        conn = self._conn
        if not self._usable_schema(conn):
            raise LedgerMissing(f"there is no ledger in {self._where}: the schema does not exist")
        found = conn.execute("SELECT to_regclass('schema_version')").fetchone()
        if found is None or found[0] is None:
            raise LedgerMissing(f"there is no ledger in {self._where}: its tables do not exist")
        self._stamp_version(conn)

    def _usable_schema(self, conn: _Conn) -> bool:
        """Whether the schema exists; a role that may not use it is told so, rather than
        being sent to create what is there."""
        row = conn.execute(
            "SELECT n.oid IS NOT NULL, has_schema_privilege(n.oid, 'USAGE') "
            "FROM (SELECT to_regnamespace(quote_ident(%s)) AS oid) AS n",
            (self._schema,),
        ).fetchone()
        exists, usable = row if row is not None else (False, None)
        if exists and not usable:
            raise LedgerError(
                f"the database role may not use the schema of {self._where}: grant it USAGE "
                "(and SELECT, INSERT, UPDATE, DELETE on its tables)"
            )
        return bool(exists)

    def _migrate(self) -> None:
        conn = self._conn
        self._usable_schema(conn)
        with conn.transaction():
            # Workers starting together would otherwise race on CREATE … IF NOT EXISTS,
            # which is not atomic in PostgreSQL.
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"toolkernel.ledger:{self._schema}",),
            )
            found = conn.execute("SELECT to_regclass('schema_version')").fetchone()
            if found is None or found[0] is None:
                # Workers with no CREATE right can still use a schema made for them.
                conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self._schema))
                )
                for statement in _SCHEMA:
                    conn.execute(statement)
            self._stamp_version(conn)

    def _stamp_version(self, conn: _Conn) -> None:
        # Migrations to later versions go here, each recorded with its own row.
        row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        version = None if row is None else row[0]
        if version is None and self._read_only:
            raise LedgerMissing(f"there is no ledger in {self._where}: it was never stamped")
        if version is None:
            conn.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (%s, %s)",
                (SCHEMA_VERSION, timestamp()),
            )
        elif version > SCHEMA_VERSION:
            raise LedgerError(
                f"the ledger in {self._where} has schema version {version}; "
                f"this toolkernel knows up to {SCHEMA_VERSION}"
            )

    @contextmanager
    def _translate(self, action: str) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as exc:
            raise LedgerError(
                f"could not {action} the ledger in {self._where}: {_one_line(exc)}"
            ) from exc


def _try_append(
    conn: _Conn, head: Head, rows: list[tuple[Any, ...]], prepared: list[Prepared]
) -> bool:
    """Store ``rows`` if the run's head is still ``head``; False if it moved."""
    index = [(p[3], pos) for pos, p in enumerate(prepared, start=1) if p[3] is not None]
    params = {
        "run": rows[0][0],
        "at": rows[0][3],
        "old_seq": head[0],
        "old_hash": head[1],
        "new_seq": rows[-1][1],
        "new_hash": rows[-1][7],
        "types": [r[2] for r in rows],
        "calls": [r[4] for r in rows],
        "payloads": [r[5] for r in rows],
        "prevs": [r[6] for r in rows],
        "hashes": [r[7] for r in rows],
        "index_tools": [key[0] for key, _ in index],
        "index_keys": [key[1] for key, _ in index],
        "index_pos": [pos for _, pos in index],
    }
    statement = _APPEND_CREATE if head[0] == 0 else _APPEND_ADVANCE
    row = conn.execute(statement, params).fetchone()
    return row is not None and row[0] == 1


def _prepare(event: NewEvent) -> Prepared:
    if event.tool_call_id is not None:
        _check_storable(event.tool_call_id)
    if event.index_key is not None:
        _check_storable(*event.index_key)
    return (
        EventType(event.type),
        event.tool_call_id,
        plain_json(event.payload) if event.plain else canonical_json(event.payload),
        event.index_key,
    )


def _dropped(conn: _Conn) -> bool:
    """Whether ``conn`` failed because the connection itself is gone (not a statement)."""
    return conn.closed or conn.broken


def _check_encoding(conn: _Conn, where: str) -> None:
    row = conn.execute("SHOW server_encoding").fetchone()
    if row is None or row[0] != "UTF8":
        raise LedgerError(f"{where} has encoding {row and row[0]!r}; the ledger needs UTF8")


def _check_storable(*texts: str) -> None:
    for text in texts:
        if "\0" in text:
            raise ValueError(f"PostgreSQL text cannot hold NUL characters: {text!r}")


def _describe(params: dict[str, Any], schema: str) -> str:
    """Where the ledger is, for messages: never the password."""
    host = params.get("host") or params.get("hostaddr") or "the default host"
    port = f":{params['port']}" if params.get("port") else ""
    dbname = params.get("dbname") or "the default database"
    return f"PostgreSQL schema {schema!r} of database {dbname!r} on {host}{port}"


def _one_line(exc: BaseException) -> str:
    """psycopg's message on one line: libpq adds a line per address it tried."""
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())

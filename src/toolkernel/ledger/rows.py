"""What both ledger backends share: stored rows, chaining and verification.

A row is ``(run_id, seq, type, at, tool_call_id, payload_json, prev_hash, hash)`` —
the same columns in SQLite and PostgreSQL, so both chain and verify identically. An
index entry is ``(tool_name, key, run_id, seq)``: the idempotency index, which lives
outside the chain and is checked against it.

SQLite stores whatever a column is given (a blob, a real, text that is not UTF-8), so
every field is checked for its type before it is hashed or decoded: an edited row is a
problem, never a crash.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Final

from toolkernel.canonical import canonical_json
from toolkernel.errors import LedgerCorrupted, LedgerError
from toolkernel.ledger.base import (
    GENESIS_HASH,
    Event,
    EventType,
    NewEvent,
    Problem,
    ProblemKind,
    VerifyReport,
    chained_hash,
)

__all__ = [
    "Head",
    "IndexEntry",
    "Prepared",
    "Undecoded",
    "Verifier",
    "chain_rows",
    "indexed_event",
    "readable_runs",
    "row_event",
    "stored_events",
]

Head = tuple[int, str]
"""A run's last (seq, hash)."""

Prepared = tuple[EventType, str | None, bytes, tuple[str, str] | None]
"""(type, tool_call_id, canonical payload, index_key) of an event about to be stored."""

IndexEntry = tuple[Any, Any, Any, Any]
"""(tool_name, key, run_id, seq) of an idempotency index entry, as stored."""


class Undecoded(bytes):
    """A stored text field that is not UTF-8, as its bytes: a backend reads it so, rather
    than failing the whole read, and the field is reported like one of another type."""


_TYPES: Final = frozenset(t.value for t in EventType)
_TEXT_COLUMNS: Final = (
    ("run_id", 0),
    ("type", 2),
    ("at", 3),
    ("payload", 5),
    ("prev_hash", 6),
    ("hash", 7),
)
# The statuses the kernel stores under an idempotency key (kernel._RECORDABLE).
_RECORDABLE: Final = frozenset({"SUCCEEDED", "PARTIAL", "FAILED"})
_COPIED: Final = frozenset({"replayedFrom", "sharedWith"})


def chain_rows(run_id: str, at: str, prepared: list[Prepared], head: Head) -> list[tuple[Any, ...]]:
    """The rows to insert, in the events table's column order, chained onto ``head``."""
    seq, prev = head
    rows = []
    for type_, tool_call_id, payload, _ in prepared:
        seq += 1
        digest = chained_hash(run_id, seq, type_, at, tool_call_id, payload, prev)
        rows.append((run_id, seq, type_, at, tool_call_id, payload.decode(), prev, digest))
        prev = digest
    return rows


def stored_events(
    run_id: str,
    at: str,
    rows: list[tuple[Any, ...]],
    prepared: list[Prepared],
    events: Sequence[NewEvent],
) -> list[Event]:
    """What ``append`` returns: the stored rows, with the caller's payloads rather than a
    decode of what was stored (decoding every payload again cost more than the insert)."""
    return [
        Event(run_id, row[1], p[0], at, p[1], dict(e.payload), row[6], row[7])
        for row, p, e in zip(rows, prepared, events, strict=True)
    ]


def row_event(row: tuple[Any, ...]) -> Event:
    """The stored row as an event.

    Raises:
        LedgerError: a field cannot be decoded: an unknown type, or a payload that is
            not a JSON object (what ``verify`` reports as ``bad_payload``).
    """
    run_id, seq, type_, at, tool_call_id, text, prev_hash, digest = row
    misstored = _misstored(row)
    if misstored is not None:
        raise _undecodable(run_id, seq, misstored)
    try:
        payload = json.loads(text)
        kind = EventType(type_)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _undecodable(run_id, seq, str(exc)) from exc
    if not isinstance(payload, dict):
        raise _undecodable(run_id, seq, "the payload is not a JSON object")
    return Event(run_id, seq, kind, at, tool_call_id, payload, prev_hash, digest)


def readable_runs(rows: Iterable[tuple[Any, ...]]) -> tuple[list[Event], dict[str, str]]:
    """Rows in (run_id, seq) order as events, run by run, runs by their first event's
    time; a run with a row that cannot be decoded is left out whole: ``{run id: why}``."""
    runs: dict[object, list[Event]] = {}
    left_out: dict[str, str] = {}
    for row in rows:
        run_id = row[0]
        if _name(run_id) in left_out:
            continue
        try:
            event = row_event(row)
        except LedgerError as exc:
            runs.pop(run_id, None)
            left_out[_name(run_id)] = str(exc)
            continue
        runs.setdefault(run_id, []).append(event)
    ordered = sorted(runs.values(), key=_first_time)
    return [event for events in ordered for event in events], left_out


def _first_time(events: list[Event]) -> tuple[str, str]:
    """Runs in the order ``Ledger.runs`` lists them: by first event time, then id."""
    return min(event.at for event in events), events[0].run_id


def _name(run_id: object) -> str:
    """A run id as problems name it: one stored as another type, as it is stored."""
    return run_id if isinstance(run_id, str) else repr(run_id)


def _undecodable(run_id: object, seq: object, why: str) -> LedgerError:
    message = f"event {seq} of run {run_id!r} cannot be decoded ({why}); verify the ledger"
    return LedgerCorrupted(message)


def indexed_event(row: tuple[Any, ...], tool_name: str, key: str) -> Event:
    """The event an idempotency index entry points at, from a row of the index's run id
    and seq followed by the event's columns (all None when no event is there).

    Raises:
        LedgerCorrupted: the entry points at no event, or the event cannot be decoded.
    """
    entry_run, entry_seq, *event = row
    if event[0] is None:
        raise LedgerCorrupted(
            f"the idempotency index entry of {tool_name!r} key {key!r} points at seq "
            f"{entry_seq!r} of run {entry_run!r}, which holds no event; verify the ledger"
        )
    return row_event(tuple(event))


def _misstored(row: tuple[Any, ...]) -> str | None:
    """Why a field of the row is not of the type the ledger stores, or ``None``."""
    if type(row[1]) is not int:
        return f"an event's seq {row[1]!r} is stored as {_storage(row[1])}, not an integer"
    for name, position in _TEXT_COLUMNS:
        if not isinstance(row[position], str):
            return _not_text(name, row[position])
    if row[4] is not None and not isinstance(row[4], str):
        return _not_text("tool_call_id", row[4])
    return None


def _not_text(name: str, value: object) -> str:
    if isinstance(value, Undecoded):
        return f"{name} is stored as text that is not UTF-8"
    return f"{name} is stored as {_storage(value)}, not text"


def _storage(value: object) -> str:
    kinds = {
        bytes: "a blob",
        Undecoded: "text that is not UTF-8",
        float: "a real",
        int: "an integer",
        str: "text",
    }
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _claimed_key(payload: dict[str, Any]) -> tuple[Any, Any] | None:
    """``(tool name, key)`` a RESULT payload is stored under in the index, as the kernel
    stores it: a call with an idempotency key that ended SUCCEEDED, PARTIAL or FAILED.

    Copies of another call's result (``replayedFrom``, ``sharedWith``) and the results
    the kernel writes for calls it abandoned (``internal.interrupted``) are not stored
    under the key: the key belongs to the call that ran.
    """
    tool, key, result = (
        payload.get("toolName"),
        payload.get("idempotencyKey"),
        payload.get("result"),
    )
    if not (isinstance(tool, str) and key and isinstance(key, str) and isinstance(result, dict)):
        return None
    if result.get("status") not in _RECORDABLE or _COPIED & payload.keys():
        return None
    internal = payload.get("internal")
    if isinstance(internal, dict) and "interrupted" in internal:
        return None
    return (tool, key)


class Verifier:
    """Walks events in (run_id, seq) order and collects problems.

    Args:
        heads: the recorded head of every run verified, by run id.
        index: every entry of the idempotency index.
        run_id: the one run verified (``None``: every run); only entries pointing into
            it are checked, but a RESULT may find its entry anywhere.
    """

    def __init__(
        self,
        heads: dict[Any, Head],
        index: Iterable[IndexEntry] = (),
        *,
        run_id: str | None = None,
        keep: bool = False,
    ) -> None:
        self.heads = heads
        self.problems: list[Problem] = []
        self.runs = 0
        self.events = 0
        self.rows: list[tuple[Any, ...]] = []  # with ``keep``: every row walked, in order
        self._keep = keep
        # REQUESTs without a RESULT yet, by id: a RESULT ends the latest open REQUEST of
        # its id (as replay pairs them), so a refused repeat of an open id leaves it open.
        self._open_calls: dict[tuple[str, str], int] = {}
        self._keys: set[tuple[Any, Any]] = set()
        # The first RESULT stored under each key, as (run_id, seq): a second one means the
        # key's call ran twice (its entry deleted meanwhile, say), whatever the index says.
        self._claimed: dict[tuple[Any, Any], tuple[Any, Any]] = {}
        # The entries to check, by the (run_id, seq) of the event they point at.
        self._entries: dict[tuple[Any, Any], list[tuple[Any, Any]]] = {}
        for tool, key, entry_run, seq in index:
            self._keys.add((tool, key))
            if run_id is None or entry_run == run_id:
                self._entries.setdefault((entry_run, seq), []).append((tool, key))

    def run(self, rows: Iterable[tuple[Any, ...]]) -> VerifyReport:
        current: object = _NO_RUN
        expected, prev, last = 1, GENESIS_HASH, (0, GENESIS_HASH)
        for row in rows:
            if self._keep:
                self.rows.append(row)
            run_id, seq, type_, _, _, _, prev_hash, stored = row
            if run_id != current:
                if current is not _NO_RUN:
                    self._check_head(current, last)
                current, expected, prev, last = run_id, 1, GENESIS_HASH, (0, GENESIS_HASH)
                self.runs += 1
            self.events += 1
            misstored = _misstored(row)
            if misstored is not None:
                self._add(run_id, seq, "bad_payload", misstored)
                if type(seq) is not int:
                    continue  # no place in the chain: the seq it had shows as a gap
            if seq < 1:  # no place in the chain: later events are measured without it
                self._add(run_id, seq, "gap", f"seq {seq} is out of range (seqs start at 1)")
            elif seq < expected:
                self._add(run_id, seq, "gap", f"seq {seq} again after seq {expected - 1}")
            elif seq != expected:
                self._add(run_id, seq, "gap", f"expected seq {expected}, found seq {seq}")
            elif prev_hash != prev:
                self._add(run_id, seq, "broken_link", "prev_hash is not the previous hash")
            payload = None if misstored else self._check_event(row)
            self._check_index(run_id, seq, type_, payload)
            if misstored is None:
                self._track_call(row)
            if seq >= 1:
                expected, prev, last = seq + 1, stored, (seq, stored)
        if current is not _NO_RUN:
            self._check_head(current, last)
        for run_id, (seq, _) in sorted(self.heads.items(), key=_by_name):
            self.runs += 1
            self._add(run_id, None, "head_mismatch", f"head records seq {seq}, no events")
        for (run_id, seq), keys in sorted(self._entries.items(), key=_by_name):
            for tool, key in keys:
                self._add(run_id, seq, "index_mismatch", f"{_entry(tool, key)} points at no event")
        return VerifyReport(self.runs, self.events, self.problems, list(self._open_calls))

    def _track_call(self, row: tuple[Any, ...]) -> None:
        run_id, _, type_, _, tool_call_id, *_ = row
        if tool_call_id is None:
            return
        call = (run_id, tool_call_id)
        if type_ == EventType.TOOL_CALL_REQUEST:
            self._open_calls[call] = self._open_calls.get(call, 0) + 1
        elif type_ == EventType.TOOL_CALL_RESULT and call in self._open_calls:
            if self._open_calls[call] > 1:
                self._open_calls[call] -= 1
            else:
                del self._open_calls[call]

    def _check_event(self, row: tuple[Any, ...]) -> dict[str, Any] | None:
        """Check one well-typed row; its payload, if it is a JSON object."""
        run_id, seq, type_, at, tool_call_id, text, prev_hash, stored = row
        if type_ not in _TYPES:
            self._add(run_id, seq, "bad_payload", f"unknown event type {type_!r}")
        try:
            payload = json.loads(text)
            canonical = canonical_json(payload)
        except (TypeError, ValueError, RecursionError) as exc:
            self._add(run_id, seq, "bad_payload", f"payload is not JSON: {exc}")
            return None
        if not isinstance(payload, dict) or canonical.decode() != text:
            self._add(run_id, seq, "bad_payload", "payload is not a canonical JSON object")
        computed = chained_hash(run_id, seq, type_, at, tool_call_id, canonical, prev_hash)
        if computed != stored:
            self._add(run_id, seq, "hash_mismatch", "stored fields do not match the hash")
        return payload if isinstance(payload, dict) else None

    def _check_index(
        self, run_id: Any, seq: int, type_: Any, payload: dict[str, Any] | None
    ) -> None:
        """The entries pointing at this event must name it, a RESULT of that tool and key;
        a RESULT stored under a key must have its entry, or the key's call runs again."""
        result = payload if type_ == EventType.TOOL_CALL_RESULT else None
        named = None if result is None else (result.get("toolName"), result.get("idempotencyKey"))
        for tool, key in self._entries.pop((run_id, seq), ()):
            if named != (tool, key):
                what = f"a {type_} event" if named is None else "a RESULT of another call"
                self._add(run_id, seq, "index_mismatch", f"{_entry(tool, key)} points at {what}")
        claimed = None if result is None else _claimed_key(result)
        if claimed is None:
            return
        if claimed not in self._keys:
            detail = f"{_entry(*claimed)} is missing: a new call with that key would run again"
            self._add(run_id, seq, "index_mismatch", detail)
        first = self._claimed.setdefault(claimed, (run_id, seq))
        if first != (run_id, seq):
            tool, key = claimed
            detail = (
                f"a second result of tool {tool!r} key {key!r} is recorded (the first is "
                f"seq {first[1]} of run {first[0]!r}): the key's call ran twice"
            )
            self._add(run_id, seq, "index_mismatch", detail)

    def _check_head(self, run_id: Any, last: Head) -> None:
        head = self.heads.pop(run_id, None)
        if head is None:
            self._add(run_id, None, "head_mismatch", "no head recorded for the run")
        elif head != last:
            self._add(
                run_id,
                None,
                "head_mismatch",
                f"head records seq {head[0]}, last stored event is seq {last[0]}"
                + ("" if head[0] != last[0] else " with another hash"),
            )

    def _add(self, run_id: object, seq: object, kind: ProblemKind, detail: str) -> None:
        # A run id or seq stored as another type is named as it is stored.
        place = seq if type(seq) is int else None
        self.problems.append(Problem(_name(run_id), place, kind, detail))


_NO_RUN: Final = object()


def _by_name(item: tuple[Any, Any]) -> str:
    """Sort key for run ids or (run_id, seq) of any stored type (they do not compare)."""
    return str(item[0])


def _entry(tool: object, key: object) -> str:
    return f"the index entry for tool {tool!r} key {key!r}"

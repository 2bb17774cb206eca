"""What both ledger backends share: stored rows, chaining and verification.

A row is ``(run_id, seq, type, at, tool_call_id, payload_json, prev_hash, hash)`` —
the same columns in SQLite and PostgreSQL, so both chain and verify identically.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Final

from toolkernel.canonical import canonical_json
from toolkernel.errors import LedgerError
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

__all__ = ["Head", "Prepared", "Verifier", "chain_rows", "row_event", "stored_events"]

Head = tuple[int, str]
"""A run's last (seq, hash)."""

Prepared = tuple[EventType, str | None, bytes, tuple[str, str] | None]
"""(type, tool_call_id, canonical payload, index_key) of an event about to be stored."""

_TYPES: Final = frozenset(t.value for t in EventType)


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
    try:
        payload = json.loads(text)
        kind = EventType(type_)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _undecodable(run_id, seq, str(exc)) from exc
    if not isinstance(payload, dict):
        raise _undecodable(run_id, seq, "the payload is not a JSON object")
    return Event(run_id, seq, kind, at, tool_call_id, payload, prev_hash, digest)


def _undecodable(run_id: str, seq: int, why: str) -> LedgerError:
    message = f"event {seq} of run {run_id!r} cannot be decoded ({why}); verify the ledger"
    return LedgerError(message)


class Verifier:
    """Walks events in (run_id, seq) order and collects problems."""

    def __init__(self, heads: dict[str, Head]) -> None:
        self.heads = heads
        self.problems: list[Problem] = []
        self.runs = 0
        self.events = 0
        self._open_calls: dict[tuple[str, str], None] = {}  # REQUEST seen, no RESULT yet

    def run(self, rows: Iterable[tuple[Any, ...]]) -> VerifyReport:
        current: str | None = None
        expected, prev, last = 1, GENESIS_HASH, (0, GENESIS_HASH)
        for row in rows:
            run_id, seq, _, _, _, _, prev_hash, stored = row
            if run_id != current:
                if current is not None:
                    self._check_head(current, last)
                current, expected, prev = run_id, 1, GENESIS_HASH
                self.runs += 1
            self.events += 1
            if seq != expected:
                self._add(run_id, seq, "gap", f"expected seq {expected}, found seq {seq}")
            elif prev_hash != prev:
                self._add(run_id, seq, "broken_link", "prev_hash is not the previous hash")
            self._check_event(row)
            self._track_call(row)
            expected, prev, last = seq + 1, stored, (seq, stored)
        if current is not None:
            self._check_head(current, last)
        for run_id, (seq, _) in sorted(self.heads.items()):
            self.runs += 1
            self._add(run_id, None, "head_mismatch", f"head records seq {seq}, no events")
        return VerifyReport(self.runs, self.events, self.problems, list(self._open_calls))

    def _track_call(self, row: tuple[Any, ...]) -> None:
        run_id, _, type_, _, tool_call_id, *_ = row
        if tool_call_id is None:
            return
        if type_ == EventType.TOOL_CALL_REQUEST:
            self._open_calls[(run_id, tool_call_id)] = None
        elif type_ == EventType.TOOL_CALL_RESULT:
            self._open_calls.pop((run_id, tool_call_id), None)

    def _check_event(self, row: tuple[Any, ...]) -> None:
        run_id, seq, type_, at, tool_call_id, text, prev_hash, stored = row
        if type_ not in _TYPES:
            self._add(run_id, seq, "bad_payload", f"unknown event type {type_!r}")
        try:
            payload = json.loads(text)
            canonical = canonical_json(payload)
        except (TypeError, ValueError, RecursionError) as exc:
            self._add(run_id, seq, "bad_payload", f"payload is not JSON: {exc}")
            return
        if not isinstance(payload, dict) or canonical.decode() != text:
            self._add(run_id, seq, "bad_payload", "payload is not a canonical JSON object")
        computed = chained_hash(run_id, seq, type_, at, tool_call_id, canonical, prev_hash)
        if computed != stored:
            self._add(run_id, seq, "hash_mismatch", "stored fields do not match the hash")

    def _check_head(self, run_id: str, last: Head) -> None:
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

    def _add(self, run_id: str, seq: int | None, kind: ProblemKind, detail: str) -> None:
        self.problems.append(Problem(run_id, seq, kind, detail))

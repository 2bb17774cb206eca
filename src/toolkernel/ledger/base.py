"""The ledger's records and the interface every storage backend implements.

The ledger is append-only. Per run, events carry a gap-free ``seq`` starting at 1, and
each event's ``hash`` covers its own fields plus the previous event's hash
(``prev_hash``; :data:`GENESIS_HASH` for ``seq`` 1). Editing, reordering or deleting a
stored event therefore breaks the chain, and :meth:`Ledger.verify` says where. A
per-run *head* (last ``seq`` and hash), written in the same transaction as the events,
makes a deleted tail detectable too. The idempotency index (:attr:`NewEvent.index_key`)
is outside the chain; verify checks its entries against the events they point at.

The chain is unkeyed: it detects accidental damage and naive edits, not someone with
write access who recomputes every hash and the head, or who deletes a run with its head
or moves a head back over a deleted tail (no hashing needed). Anchoring heads outside
the database is what closes that gap.
"""

from __future__ import annotations

import abc
import json.encoder
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Any, Final, Literal, Self

from toolkernel.canonical import sha256_hex, sha256_of
from toolkernel.errors import LedgerError

__all__ = [
    "GENESIS_HASH",
    "Event",
    "EventType",
    "Ledger",
    "LedgerError",
    "NewEvent",
    "Problem",
    "ProblemKind",
    "RunSummary",
    "VerifiedRead",
    "VerifyReport",
    "chained_hash",
    "event_hash",
]

# The string encoder canonical JSON uses (ensure_ascii=False): same escapes, same bytes.
_json_str: Final = json.encoder.encode_basestring

GENESIS_HASH: Final = "sha256:" + "0" * 64
"""The ``prev_hash`` of every run's first event."""


class EventType(StrEnum):
    """What an event records."""

    TOOLS_EXPOSED = "TOOLS_EXPOSED"
    TOOL_CALL_REQUEST = "TOOL_CALL_REQUEST"
    TOOL_CALL_STARTED = "TOOL_CALL_STARTED"
    TOOL_CALL_PROGRESS = "TOOL_CALL_PROGRESS"
    TOOL_CALL_RESULT = "TOOL_CALL_RESULT"
    APPROVAL_REQUESTED = "APPROVAL_REQUESTED"
    APPROVAL_GRANTED = "APPROVAL_GRANTED"
    APPROVAL_DENIED = "APPROVAL_DENIED"
    REMOTE_TOOL_REJECTED = "REMOTE_TOOL_REJECTED"
    REMOTE_TOOL_CHANGED = "REMOTE_TOOL_CHANGED"


@dataclass(slots=True)  # not frozen: three a call, and a frozen init costs 2.5 times as much
class NewEvent:
    """An event the kernel asks the ledger to append; read-only once handed over (a
    group-commit ledger stores it later, from another thread).

    Attributes:
        type: What the event records.
        payload: JSON-able data; stored as canonical JSON.
        tool_call_id: The tool call the event belongs to, if any.
        index_key: ``(tool name, idempotency key)``: makes the stored event findable
            with :meth:`Ledger.find_indexed`. The first event stored under a key keeps
            it.
        plain: The payload holds only plain JSON data (the kernel built it from checked
            parts), so backends encode it with :func:`~toolkernel.canonical.plain_json`
            and skip checking its types again.
    """

    type: EventType
    payload: Mapping[str, Any]
    tool_call_id: str | None = None
    index_key: tuple[str, str] | None = None
    plain: bool = False


@dataclass(frozen=True, slots=True)
class Event:
    """A stored event.

    Attributes:
        run_id: The run the event belongs to.
        seq: Position in the run, from 1, without gaps.
        type: What the event records.
        at: When it was appended: ISO-8601 UTC with microseconds
            (``2026-11-29T19:20:01.123456Z``).
        tool_call_id: The tool call the event belongs to, if any.
        payload: The event's data, as decoded from its stored canonical JSON.
        prev_hash: ``hash`` of the event before (``GENESIS_HASH`` for ``seq`` 1).
        hash: :func:`event_hash` of the fields above.
    """

    run_id: str
    seq: int
    type: EventType
    at: str
    tool_call_id: str | None
    payload: dict[str, Any]
    prev_hash: str
    hash: str


def event_hash(
    run_id: str,
    seq: int,
    type: str,
    at: str,
    tool_call_id: str | None,
    payload: Mapping[str, Any],
    prev_hash: str,
) -> str:
    """The chain hash of one event: ``sha256:<hex>`` of a canonical JSON object.

    The object has the camelCase keys ``runId``, ``seq``, ``type``, ``at``,
    ``toolCallId``, ``payload`` and ``prevHash``, so other implementations (the
    PostgreSQL backend, an external verifier) can recompute it.
    """
    return sha256_of(
        {
            "runId": run_id,
            "seq": seq,
            "type": str(type),
            "at": at,
            "toolCallId": tool_call_id,
            "payload": payload,
            "prevHash": prev_hash,
        }
    )


def chained_hash(
    run_id: str,
    seq: int,
    type: str,
    at: str,
    tool_call_id: str | None,
    payload_json: bytes,
    prev_hash: str,
) -> str:
    """:func:`event_hash`, given the payload already as canonical JSON bytes.

    Backends store the canonical payload anyway; splicing it in spares encoding the
    payload a second time on every append. The key order below is the sorted order
    canonical JSON prescribes, so the bytes are identical to :func:`event_hash`'s.
    """
    call = "null" if tool_call_id is None else _json_str(tool_call_id)
    head = f'{{"at":{_json_str(at)},"payload":'
    tail = (
        f',"prevHash":{_json_str(prev_hash)},"runId":{_json_str(run_id)},"seq":{seq:d},'
        f'"toolCallId":{call},"type":{_json_str(type)}}}'
    )
    return sha256_hex(head.encode() + payload_json + tail.encode())


ProblemKind = Literal[
    "hash_mismatch", "broken_link", "gap", "head_mismatch", "bad_payload", "index_mismatch"
]


@dataclass(frozen=True)
class Problem:
    """One inconsistency :meth:`Ledger.verify` found.

    Attributes:
        run_id: The run it was found in.
        seq: The event it concerns, or ``None`` when it concerns the run as a whole.
        kind: ``hash_mismatch`` (an event's fields no longer match its hash),
            ``broken_link`` (``prev_hash`` is not the previous event's hash), ``gap``
            (a ``seq`` is missing, or stored twice), ``head_mismatch`` (the run's
            recorded head is not its last event: a deleted tail or run), ``bad_payload``
            (a stored field cannot be decoded, or is stored as another type) or
            ``index_mismatch`` (an idempotency index entry does not point at the RESULT
            of its tool and key, or a RESULT stored under a key has no entry).
        detail: A sentence for the operator.
    """

    run_id: str
    seq: int | None
    kind: ProblemKind
    detail: str


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :meth:`Ledger.verify`."""

    runs_checked: int
    events_checked: int
    problems: list[Problem] = field(default_factory=list)
    unfinished: list[tuple[str, str]] = field(default_factory=list)
    """``(run_id, tool_call_id)`` of calls with a REQUEST and no RESULT: still running,
    or cut short by a process that died. Not a problem of the chain: ``ok`` ignores it."""

    @property
    def ok(self) -> bool:
        """Whether no problem was found."""
        return not self.problems


@dataclass(frozen=True)
class VerifiedRead:
    """What :meth:`Ledger.read_verified` read: the events, and the report on exactly them.

    Attributes:
        report: What verify found in the events read.
        events: The events read, run by run (runs by their first event's time); a run
            with an event that cannot be decoded is left out whole.
        left_out: The runs left out, by id, with why their events cannot be decoded.
    """

    report: VerifyReport
    events: list[Event]
    left_out: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunSummary:
    """One run as :meth:`Ledger.runs` lists it."""

    run_id: str
    events: int
    first_at: str
    last_at: str


class Ledger(abc.ABC):
    """Append-only, hash-chained storage of events, per run.

    Implementations are safe to call from several threads, and stay correct when other
    processes append to the same storage. Use as a context manager, or call
    :meth:`close`.
    """

    @abc.abstractmethod
    def append(self, run_id: str, events: Sequence[NewEvent]) -> list[Event]:
        """Append ``events`` to ``run_id``, atomically: all are stored, or none.

        The events get contiguous ``seq`` numbers after the run's last event (from 1
        for a new run), are chained in order, and share one timestamp.

        Returns:
            The stored events, in order.

        Raises:
            LedgerError: nothing was stored.
        """

    @abc.abstractmethod
    def events(self, run_id: str, *, after_seq: int = 0) -> list[Event]:
        """The events of ``run_id`` with ``seq > after_seq``, in ``seq`` order.

        An unknown run has no events.

        Raises:
            LedgerError: the events could not be read or decoded.
        """

    @abc.abstractmethod
    def runs(self) -> list[RunSummary]:
        """Every run that has events, oldest first.

        Raises:
            LedgerError: the runs could not be read.
        """

    @abc.abstractmethod
    def find_indexed(self, tool_name: str, key: str) -> Event | None:
        """The event stored under ``(tool_name, key)`` by :attr:`NewEvent.index_key`.

        Raises:
            LedgerError: the event could not be read or decoded.
        """

    @abc.abstractmethod
    def verify(self, run_id: str | None = None) -> VerifyReport:
        """Check the chain of one run, or of every run, and the idempotency index
        entries pointing into it; tampering shows as problems.

        Raises:
            LedgerError: the storage could not be read at all.
        """

    @abc.abstractmethod
    def read_verified(self, run_id: str | None = None) -> VerifiedRead:
        """The events of one run, or of every run, with :meth:`verify`'s report on
        those very events: one read, so what is presented is what was verified (a
        ``verify`` and then an ``events`` are two reads, and the ledger may change, or
        answer differently, between them).

        Raises:
            LedgerError: the storage could not be read at all.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the storage. Closing twice is harmless."""

    def append_batch(self, batches: Sequence[tuple[str, Sequence[NewEvent]]]) -> None:
        """Append several runs' events; backends that can make it one transaction do.

        Raises:
            LedgerError: what was not stored (the default appends run by run).
        """
        for run_id, events in batches:
            self.append(run_id, events)

    def append_durable(self, batches: Sequence[tuple[str, Sequence[NewEvent]]]) -> None:
        """``append_batch``, returning only once these events and every earlier one are
        stored (``append_batch``, then ``sync``; a ledger that defers storing may do it
        faster).

        Raises:
            LedgerError: something was not stored.
        """
        self.append_batch(batches)
        self.sync()

    def claim_key(self, tool_name: str, key: str, owner: str, lease_s: float) -> bool:
        """Claim an idempotency key for one call, for every process that shares this
        ledger: True when ``owner`` may run the call (nobody holds the key, or the
        holder's lease of ``lease_s`` seconds ran out: its process died), False when
        another owner holds it now. ``owner`` claiming its own key again renews the
        lease.

        The kernel claims a key after finding no result under it, looks again once it
        holds the claim (a holder stores its result before letting go), and releases
        it once the result is stored. The default, for a ledger only one process uses,
        grants every claim: the kernel's own lock already keeps duplicates apart there.

        Raises:
            LedgerError: the claim could not be recorded.
        """
        return True

    def renew_key(self, tool_name: str, key: str, owner: str, lease_s: float) -> bool:
        """Extend the lease of a claim ``owner`` holds; False when it holds none (it
        was released, or it lapsed and another took it). Never claims anew.

        Raises:
            LedgerError: the lease could not be extended.
        """
        return True

    def release_key(self, tool_name: str, key: str, owner: str) -> None:  # noqa: B027
        """Let go of a claim ``owner`` holds (nothing happens if it does not).

        Raises:
            LedgerError: the claim could not be removed.
        """

    def sync(self) -> None:  # noqa: B027 - a no-op for ledgers that store on append
        """Return once everything appended so far is stored.

        Ledgers whose ``append`` stores before returning have nothing to wait for.

        Raises:
            LedgerError: something appended earlier could not be stored.
        """

    def check_writable(self) -> None:  # noqa: B027 - a no-op for ledgers that store on append
        """Raise now the ``LedgerError`` an append would raise, without appending.

        A ledger that knows it cannot take events (group commit waiting to retry a
        store) says so before a call runs whose events it could not take; one that
        stores on append finds out only by trying, so this does nothing.

        Raises:
            LedgerError: the ledger takes no events now.
        """

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

"""The tamper-evident ledger: every tool call, recorded in a per-run hash chain.

:class:`Ledger` is the interface; :class:`SqliteLedger` the embedded backend;
:class:`GroupCommitLedger` stores another ledger's appends in background batches.
"""

from toolkernel.ledger.base import (
    GENESIS_HASH,
    Event,
    EventType,
    Ledger,
    LedgerError,
    NewEvent,
    Problem,
    ProblemKind,
    RunSummary,
    VerifiedRead,
    VerifyReport,
    event_hash,
)
from toolkernel.ledger.group import GroupCommitLedger
from toolkernel.ledger.sqlite import SqliteLedger

__all__ = [
    "GENESIS_HASH",
    "Event",
    "EventType",
    "GroupCommitLedger",
    "Ledger",
    "LedgerError",
    "NewEvent",
    "Problem",
    "ProblemKind",
    "RunSummary",
    "SqliteLedger",
    "VerifiedRead",
    "VerifyReport",
    "event_hash",
]

"""Idempotency claims in the ledger: renewed while held, never brought back once let
go, left to lapse when the call's result could not be stored."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from toolkernel import claims
from toolkernel.claims import KeyClaims
from toolkernel.ledger import SqliteLedger


@pytest.fixture
def fast_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claims, "LEASE_S", 0.3)
    monkeypatch.setattr(claims, "RENEW_S", 0.05)


class PausedRenewal(SqliteLedger):
    """A ledger whose first renewal waits until the claim has been released."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.renewing = threading.Event()
        self.released = threading.Event()

    def renew_key(self, tool_name: str, key: str, owner: str, lease_s: float) -> bool:
        if not self.renewing.is_set():
            self.renewing.set()
            self.released.wait(5)
        return super().renew_key(tool_name, key, owner, lease_s)


def test_a_renewal_in_flight_does_not_bring_back_a_released_claim(
    tmp_path: Path, fast_leases: None
) -> None:
    ledger = PausedRenewal(tmp_path / "ledger.db")
    mine, theirs = KeyClaims(ledger), KeyClaims(SqliteLedger(tmp_path / "ledger.db"))
    try:
        owner = mine.claim("file.patch", "k1", "run-1", "call-1")
        assert owner is not None
        assert ledger.renewing.wait(5)  # the renewer took its snapshot
        mine.release("file.patch", "k1", owner)
        ledger.released.set()
        time.sleep(0.2)  # the renewal ran
        assert theirs.claim("file.patch", "k1", "run-2", "call-2") is not None
    finally:
        mine.close()
        theirs.close()


def test_an_abandoned_claim_lapses_with_its_lease(tmp_path: Path, fast_leases: None) -> None:
    mine = KeyClaims(SqliteLedger(tmp_path / "ledger.db"))
    theirs = KeyClaims(SqliteLedger(tmp_path / "ledger.db"))
    try:
        owner = mine.claim("file.patch", "k1", "run-1", "call-1")
        assert owner is not None
        time.sleep(0.6)  # held past two leases: renewed
        assert theirs.claim("file.patch", "k1", "run-2", "call-2") is None
        mine.abandon("file.patch", "k1", owner)  # its result could not be stored
        time.sleep(0.6)
        assert theirs.claim("file.patch", "k1", "run-2", "call-3") is not None
    finally:
        mine.close()
        theirs.close()

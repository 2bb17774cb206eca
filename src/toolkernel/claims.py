"""Idempotency keys claimed in the ledger, for every process that shares it.

Within one process the kernel's own lock keeps two calls with one key apart. Across
processes (several ``toolkernel call``\\ s, workers on one PostgreSQL ledger) only the
ledger is shared: just before a keyed call starts, its key is claimed there
(``Ledger.claim_key``), and let go once its result is stored. A claim is a lease:
this module renews the leases of the keys a kernel holds from a thread of its own,
so a call may take as long as it needs (a slow batch, a human approving), while the
key of a process that died is free again within ``LEASE_S``.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from typing import Final

from toolkernel.errors import LedgerError
from toolkernel.ledger import Ledger

__all__ = ["LEASE_S", "RENEW_S", "KeyClaims"]

LEASE_S: Final = 60.0
"""How long a claim lasts without renewal: how long a dead process blocks a key."""

RENEW_S: Final = 15.0
"""How often the leases of held keys are renewed."""

_log = logging.getLogger(__name__)


class KeyClaims:
    """The keys one kernel holds in its ledger, renewed until released."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        # Unique per kernel: two kernels of one process, or processes on two hosts
        # with the same pid, run id and call id, never take each other's claim.
        self._instance = secrets.token_hex(8)
        self._held: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._renewer: threading.Thread | None = None

    def claim(self, tool_name: str, key: str, run_id: str, call_id: str) -> str | None:
        """Claim ``key`` for this call; its owner name, or None when another holds it.

        Raises:
            LedgerError: the claim could not be recorded.
        """
        owner = f"{self._instance}:{os.getpid()}:{run_id}:{call_id}"
        if not self._ledger.claim_key(tool_name, key, owner, LEASE_S):
            return None
        with self._lock:
            self._held[(tool_name, key)] = owner
            if self._renewer is None and not self._closing.is_set():
                self._renewer = threading.Thread(
                    target=self._renew, name="toolkernel-key-claims", daemon=True
                )
                self._renewer.start()
        return owner

    def release(self, tool_name: str, key: str, owner: str) -> None:
        """Let go of a claim (after the call's result is stored).

        Raises:
            LedgerError: the claim could not be removed (it then lapses with its lease).
        """
        with self._lock:
            if self._held.get((tool_name, key)) == owner:
                del self._held[(tool_name, key)]
        self._ledger.release_key(tool_name, key, owner)

    def abandon(self, tool_name: str, key: str, owner: str) -> None:
        """Stop renewing a claim without releasing it: its call's result could not be
        stored, so the claim is left to lapse with its lease (``LEASE_S``)."""
        with self._lock:
            if self._held.get((tool_name, key)) == owner:
                del self._held[(tool_name, key)]

    def close(self) -> None:
        """Stop renewing (claims still held lapse with their lease)."""
        self._closing.set()
        with self._lock:
            renewer = self._renewer
        if renewer is not None:
            renewer.join(timeout=5)

    def _renew(self) -> None:
        while not self._closing.wait(RENEW_S):
            with self._lock:
                held = list(self._held.items())
            for (tool_name, key), owner in held:
                try:
                    # Update only: a claim released meanwhile is not brought back.
                    renewed = self._ledger.renew_key(tool_name, key, owner, LEASE_S)
                except LedgerError as exc:
                    _log.warning("could not renew the claim of %s key %r: %s", tool_name, key, exc)
                    continue
                with self._lock:
                    still_held = self._held.get((tool_name, key)) == owner
                if not renewed and still_held:
                    # Lapsed while this process could not renew it (suspended, say).
                    _log.error("the claim of %s key %r was lost to another process", tool_name, key)

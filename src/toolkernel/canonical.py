"""Canonical JSON and the hashes built on it.

One byte form per JSON value (sorted keys, no insignificant whitespace, UTF-8), so that
the same arguments or the same tool definition always hash the same. Used for
``argumentsHash``, definition pins and the ledger's hash chain.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["canonical_json", "sha256_hex", "sha256_of"]

_ENCODER = json.JSONEncoder(
    ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
)


def canonical_json(value: Any) -> bytes:
    """Encode ``value`` as canonical JSON bytes.

    Raises:
        ValueError: the value holds NaN or Infinity, which JSON cannot carry.
        TypeError: the value holds something JSON cannot carry.
    """
    return _ENCODER.encode(value).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    """``sha256:<hex>`` of raw bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def sha256_of(value: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``value``."""
    return sha256_hex(canonical_json(value))

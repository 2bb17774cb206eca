"""Canonical JSON and the hashes built on it.

One byte form per JSON value (sorted keys, no insignificant whitespace, UTF-8), so that
the same arguments or the same tool definition always hash the same. Used for
``argumentsHash``, definition pins and the ledger's hash chain.

The form is defined by the standard library's encoder (``sort_keys``, compact
separators, ``ensure_ascii=False``, no NaN). Encoding every ledger payload with it
cost more than the rest of a call's bookkeeping, so values are first encoded with
orjson, ten times faster, and that output is kept only when it is the same bytes:
it decodes back to a value equal to the input (so no NaN became ``null``, no UUID,
enum or tuple was accepted that the standard encoder treats otherwise) and it holds
no float in the ranges where the two write floats differently (``1e-7`` against
``1e-07``). Anything else (such floats, errors) goes through the
standard encoder, which gives the canonical bytes or the canonical error. The
equivalence is a property test (tests/test_canonical.py). One exception is known and
left alone: a plain ``Enum`` member whose own ``__eq__`` says it equals its value is
written as that value, where the standard encoder refuses it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

import orjson

__all__ = ["canonical_json", "plain_json", "sha256_hex", "sha256_of", "utf8_text"]

_ENCODER: Final = json.JSONEncoder(
    ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
)
_FAST_OPTIONS: Final = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
)
# Where orjson spells a float differently from Python. Both write the shortest digits
# that read back as the same float, in plain decimal from 1e-4 up to 1e16 and with a
# signed exponent above; below 1e-4 Python writes ``1e-05``/``1e-07`` where orjson
# writes ``0.00001``/``1e-7``. Each such orjson spelling holds a digit followed by
# ``e-``, or ``0.0000``; seeing one (in a number or in a string) sends the value to the
# standard encoder.
_DIGITS: Final = frozenset(b"0123456789")


def _odd_float(data: bytes) -> bool:
    """Whether ``data`` may hold a float that orjson spells differently from Python."""
    at = data.find(b"e-")
    while at != -1:
        if at and data[at - 1] in _DIGITS:
            return True
        at = data.find(b"e-", at + 2)
    return b"0.0000" in data


def _refuse(value: Any) -> Any:
    raise TypeError  # orjson's ``default``: whatever it does not know natively


def canonical_json(value: Any) -> bytes:
    """Encode ``value`` as canonical JSON bytes.

    Raises:
        ValueError: the value holds NaN or Infinity, which JSON cannot carry.
        TypeError: the value holds something JSON cannot carry.
    """
    try:
        fast = orjson.dumps(value, default=_refuse, option=_FAST_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        pass
    else:
        if _exact(value) or (not _odd_float(fast) and _same(orjson.loads(fast), value)):
            return fast
    return _ENCODER.encode(value).encode("utf-8")


_EXACT: Final = frozenset((str, int, bool, type(None)))


def _exact(value: Any) -> bool:
    """Whether ``value`` is a str, int, bool or None, or a dict of them under str keys:
    what orjson, having accepted it, wrote as the standard encoder does (no float, no
    subclass, nothing to tell apart by decoding). Most arguments and outputs are."""
    kind = type(value)
    if kind in _EXACT:
        return True
    if kind is not dict:
        return False
    for key, item in value.items():
        if type(key) is not str or type(item) not in _EXACT:
            return False
    return True


def plain_json(value: Any) -> bytes:
    """:func:`canonical_json` of a value known to hold only plain JSON data: one the
    runtime built itself from parts that went through :func:`canonical_json` already (a
    call's checked arguments, its normalized output). The check that the fast encoder
    read every value as the standard one would is skipped; floats are still spelled the
    standard way, and what the fast encoder refuses still gets the standard bytes or
    error. Given a value that is not plain JSON, it may encode what
    :func:`canonical_json` refuses (NaN or infinity as ``null``, an enum as its value).
    """
    try:
        fast = orjson.dumps(value, default=_refuse, option=_FAST_OPTIONS)
    except TypeError:
        return canonical_json(value)
    return _ENCODER.encode(value).encode("utf-8") if _odd_float(fast) else fast


def _same(decoded: Any, value: Any) -> bool:
    try:
        return bool(decoded == value)
    except Exception:  # noqa: BLE001 - an object's own __eq__ failed: not plain JSON data
        return False


def sha256_hex(data: bytes) -> str:
    """``sha256:<hex>`` of raw bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def sha256_of(value: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``value``."""
    return sha256_hex(canonical_json(value))


def utf8_text(text: str) -> str:
    """``text`` with every character that has no UTF-8 form (a lone surrogate, from a
    non-UTF-8 file name or an escape in JSON) spelled as a backslash escape, so that it
    can be encoded."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")

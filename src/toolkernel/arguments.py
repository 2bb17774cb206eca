"""Turning a model's raw tool arguments into a JSON object, or a specific refusal.

Models emit arguments as text that may be truncated, repeat keys, carry NaN, nest
absurdly deep or be enormous. The size cap is applied *before* parsing; the parser is
strict where ``json.loads`` is lenient (duplicate keys, NaN/Infinity, huge integers).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from toolkernel.canonical import canonical_json, sha256_hex
from toolkernel.codes import ErrorCode, safe_field

__all__ = ["ArgumentsRejected", "ParsedArguments", "parse_arguments"]

DEFAULT_MAX_BYTES: Final = 256 * 1024
DEFAULT_MAX_DEPTH: Final = 32
MAX_NUMBER_DIGITS: Final = 100


@dataclass(slots=True)  # not frozen: one a call, and a frozen init costs twice as much
class ParsedArguments:
    """A JSON object ready for validation, with its canonical hash."""

    value: dict[str, Any]
    hash: str


@dataclass(frozen=True, slots=True)
class ArgumentsRejected:
    """Why the raw arguments are not a usable JSON object; ``hash`` is of the raw bytes."""

    code: ErrorCode
    fields: Mapping[str, object] = field(default_factory=dict)
    hash: str = ""


class _Reject(Exception):
    def __init__(self, code: ErrorCode, **fields: object) -> None:
        self.code = code
        self.fields = fields


def parse_arguments(
    raw: str | bytes | Mapping[str, Any] | None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> ParsedArguments | ArgumentsRejected:
    """Parse and bound a tool call's arguments.

    ``None`` and the empty string mean "no arguments" (``{}``), as providers send them.
    An already-decoded mapping is bounded by the size of its canonical JSON.
    """
    if raw is None:
        raw = {}
    if type(raw) is dict or isinstance(raw, Mapping):  # a dict skips the ABC check
        return _from_mapping(raw, max_bytes=max_bytes, max_depth=max_depth)
    if not isinstance(raw, str | bytes | bytearray | memoryview):
        # Already decoded, but not an object: a list, a number (bytes(5) would be five
        # NUL bytes, "not JSON"). A tuple is what a list is.
        value = list(raw) if isinstance(raw, tuple) else raw
        kind = _kind(value) if isinstance(value, list | int | float) else "a value"
        return ArgumentsRejected(ErrorCode.ARGUMENTS_NOT_OBJECT, {"kind": kind}, "")
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
    raw_hash = sha256_hex(data)
    if len(data) > max_bytes:
        return ArgumentsRejected(ErrorCode.ARGUMENTS_TOO_LARGE, {"limit": max_bytes}, raw_hash)
    if not data.strip():
        return ParsedArguments({}, _hash_of({}))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return ArgumentsRejected(ErrorCode.ARGUMENTS_INVALID_UTF8, {}, raw_hash)
    try:
        _check_depth(text, max_depth)
        value = json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
            parse_int=_bounded_int,
            parse_float=_bounded_float,
        )
    except _Reject as exc:
        return ArgumentsRejected(exc.code, exc.fields, raw_hash)
    except json.JSONDecodeError as exc:
        return ArgumentsRejected(ErrorCode.ARGUMENTS_NOT_JSON, {"detail": _where(exc)}, raw_hash)
    except RecursionError:
        return ArgumentsRejected(ErrorCode.NESTING_TOO_DEEP, {"limit": max_depth}, raw_hash)
    if not isinstance(value, dict):
        return ArgumentsRejected(ErrorCode.ARGUMENTS_NOT_OBJECT, {"kind": _kind(value)}, raw_hash)
    try:
        return ParsedArguments(value, _hash_of(value))
    except UnicodeEncodeError:  # a "\ud800" escape: valid JSON, but no Unicode text
        return ArgumentsRejected(ErrorCode.ARGUMENTS_INVALID_UTF8, {}, raw_hash)


def _from_mapping(
    raw: Mapping[str, Any], *, max_bytes: int, max_depth: int
) -> ParsedArguments | ArgumentsRejected:
    value = dict(raw)
    try:
        encoded = canonical_json(value)
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 form
        return ArgumentsRejected(ErrorCode.ARGUMENTS_INVALID_UTF8, {}, "")
    except RecursionError:  # nested deeper than Python can walk
        return ArgumentsRejected(ErrorCode.NESTING_TOO_DEEP, {"limit": max_depth}, "")
    except ValueError as exc:  # NaN or Infinity, a cycle, an integer past 4300 digits
        if "Circular reference" in str(exc):
            return ArgumentsRejected(ErrorCode.NESTING_TOO_DEEP, {"limit": max_depth}, "")
        if "digits" in str(exc):  # Python's own limit on writing an integer
            return ArgumentsRejected(ErrorCode.NUMBER_TOO_LARGE, {"limit": MAX_NUMBER_DIGITS}, "")
        return ArgumentsRejected(ErrorCode.NON_FINITE_NUMBER, {}, "")
    except TypeError as exc:  # a value JSON cannot carry (a set, bytes, an object)
        detail = f"{_kind_of_unencodable(exc)} is not a JSON value"
        return ArgumentsRejected(ErrorCode.ARGUMENTS_NOT_JSON, {"detail": detail}, "")
    raw_hash = sha256_hex(encoded)
    if len(encoded) > max_bytes:
        return ArgumentsRejected(ErrorCode.ARGUMENTS_TOO_LARGE, {"limit": max_bytes}, raw_hash)
    # Decoded arguments (Anthropic's input) are held to the digit limit that parsing
    # text applies; only a run of that many digits (in a string, or not) is looked into.
    if _LONG_DIGITS.search(encoded) and _has_long_int(value, max_depth):
        return ArgumentsRejected(ErrorCode.NUMBER_TOO_LARGE, {"limit": MAX_NUMBER_DIGITS}, raw_hash)
    # The depth cannot exceed the number of openers, which is cheap to count.
    if (
        encoded.count(b"{") + encoded.count(b"[") > max_depth
        and _depth(value, max_depth) > max_depth
    ):
        return ArgumentsRejected(ErrorCode.NESTING_TOO_DEEP, {"limit": max_depth}, raw_hash)
    return ParsedArguments(value, raw_hash)


_LONG_DIGITS: Final = re.compile(rb"[0-9]{%d}" % (MAX_NUMBER_DIGITS + 1))
_LIMIT: Final = 10**MAX_NUMBER_DIGITS


def _has_long_int(value: Any, depth: int) -> bool:
    """Whether ``value`` holds an integer of more than ``MAX_NUMBER_DIGITS`` digits."""
    if type(value) is int:
        return abs(value) >= _LIMIT
    if depth < 0:
        return False
    if isinstance(value, dict):
        return any(_has_long_int(item, depth - 1) for item in value.values())
    if isinstance(value, list | tuple):
        return any(_has_long_int(item, depth - 1) for item in value)
    return False


def _kind_of_unencodable(exc: TypeError) -> str:
    """ "a set" from the standard encoder's "Object of type set is not JSON serializable"."""
    match = re.match(r"Object of type (\w+) is not JSON serializable", str(exc))
    return f"a {match.group(1)}" if match else "a value"


def _hash_of(value: dict[str, Any]) -> str:
    return sha256_hex(canonical_json(value))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _Reject(ErrorCode.DUPLICATE_KEY, key=safe_field(key, 40))
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise _Reject(ErrorCode.NON_FINITE_NUMBER)


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_NUMBER_DIGITS:
        raise _Reject(ErrorCode.NUMBER_TOO_LARGE, limit=MAX_NUMBER_DIGITS)
    return int(text)


def _bounded_float(text: str) -> float:
    if len(text) > MAX_NUMBER_DIGITS + 10:
        raise _Reject(ErrorCode.NUMBER_TOO_LARGE, limit=MAX_NUMBER_DIGITS)
    number = float(text)
    if math.isinf(number):
        raise _Reject(ErrorCode.NUMBER_TOO_LARGE, limit=MAX_NUMBER_DIGITS)
    return number


def _check_depth(text: str, max_depth: int) -> None:
    """Refuse deep nesting before json.loads recurses into it."""
    if text.count("[") + text.count("{") <= max_depth:
        return  # cannot be deeper than the number of openers; skip the scan
    depth = 0
    in_string = False
    escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                raise _Reject(ErrorCode.NESTING_TOO_DEEP, limit=max_depth)
        elif char in "]}":
            depth -= 1


def _depth(value: Any, limit: int) -> int:
    """The nesting depth of ``value``, counted no further than ``limit + 1``."""
    deepest = 0
    level: list[tuple[Any, int]] = [(value, 0)]
    while level:
        item, depth = level.pop()
        if isinstance(item, Mapping | list | tuple):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
            children = item.values() if isinstance(item, Mapping) else item
            level.extend((child, depth) for child in children)
    return deepest


def _where(exc: json.JSONDecodeError) -> str:
    if exc.pos >= len(exc.doc):
        return "it ends before the object is complete"
    message = exc.msg.lower().removesuffix(" at")  # "…starting at" names the place itself
    return f"{message} at character {exc.pos}"


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"

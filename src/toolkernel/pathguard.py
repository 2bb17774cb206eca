"""The one path guard shared by every tool that takes workspace paths.

Schema fields marked ``"format": "workspace-path"`` go through :meth:`PathGuard.check`.
It either returns a :class:`GuardedPath` (the normalized relative path and the resolved
absolute path inside the workspace) or a :class:`PathViolation` carrying one error code.
The rules run in this order, each with its own code:

1. ``INVALID_PATH``: empty, longer than :data:`MAX_PATH_LENGTH`, or holding control
   characters or lone surrogates.
2. ``ABSOLUTE_PATH``: ``/``, ``\\``, a drive (``C:``), UNC, ``~`` or a URL, as written
   or once normalized (``./~`` is ``~``, which a shell expands).
3. ``PATH_TRAVERSAL``: ``..`` would climb above the workspace root. ``\\`` counts as a
   separator. The same check runs on *decoded variants* of the value (percent-decoding
   up to three times, ``%uXXXX``, overlong UTF-8, NUL truncation, NFKC and look-alike
   slashes), because a downstream tool or server may decode what it is given. A variant
   that is absolute is ``ABSOLUTE_PATH``.
4. ``SYMLINK_ESCAPE``: after resolving symbolic links the path is outside the
   workspace. Both the normalized path and the value as written are resolved (the
   kernel applies ``..`` *after* following a link, the lexical normalisation before).
   Paths that do not exist yet are fine when their existing prefix resolves inside.
5. ``FORBIDDEN_PATH``: a forbidden glob matches the lexical, the resolved or a decoded
   relative path, so a link ``notes -> .env`` is as forbidden as ``.env``.

Checks are point-in-time: a link created between :meth:`PathGuard.check` and the use of
the path is not seen. Tools should use :attr:`GuardedPath.absolute`, never the raw value.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from toolkernel.codes import ErrorCode
from toolkernel.errors import UsageError
from toolkernel.globs import compile_globs

__all__ = ["DEFAULT_FORBIDDEN", "MAX_PATH_LENGTH", "GuardedPath", "PathGuard", "PathViolation"]

MAX_PATH_LENGTH: Final = 4096

DEFAULT_FORBIDDEN: Final[tuple[str, ...]] = (
    ".git",
    ".git/**",
    ".git-credentials",
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".ssh/",
    ".gnupg/",
    ".aws/",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".pgpass",
    ".kube/",
    ".docker/",
    ".azure/",
    "**/.config/gcloud/",
    ".toolkernel/",  # the runtime's own state: ledger, artifacts, approvals
)


@dataclass(frozen=True, slots=True)
class GuardedPath:
    """A path the guard accepted.

    Attributes:
        relative: normalized workspace-relative POSIX path, ``"."`` for the root.
        absolute: the fully resolved absolute path, inside the workspace.
        target: ``absolute`` relative to the workspace: where the path leads, which is
            ``relative`` unless a symlink on the way leads elsewhere in the workspace.
    """

    relative: str
    absolute: Path
    target: str


@dataclass(frozen=True, slots=True)
class PathViolation:
    """Why the guard refused a path.

    Attributes:
        code: one of the path codes of :class:`~toolkernel.codes.ErrorCode`.
        detail: a short fixed phrase; never the input and never a host path.
    """

    code: ErrorCode
    detail: str


class PathGuard:
    """Checks workspace paths proposed by the model.

    Attributes:
        workspace: the resolved workspace directory.
    """

    def __init__(self, workspace: Path, *, forbidden: Iterable[str] = DEFAULT_FORBIDDEN) -> None:
        """Resolve ``workspace`` once and compile the forbidden globs.

        Raises:
            UsageError: the workspace is not an existing directory, or a glob is invalid.
        """
        resolved = os.path.realpath(workspace)
        if not Path(resolved).is_dir():
            raise UsageError(f"the workspace {workspace} must be an existing directory")
        self.workspace = Path(resolved)
        self._root = resolved
        self._prefix = resolved if resolved.endswith("/") else resolved + "/"
        self._forbidden = compile_globs(forbidden)

    def check(self, value: str) -> GuardedPath | PathViolation:
        """Check a proposed path against the rules in the module docstring, in order."""
        problem = _unusable(value)
        if problem is not None:
            return PathViolation(ErrorCode.INVALID_PATH, problem)
        if _is_absolute(value):
            return PathViolation(ErrorCode.ABSOLUTE_PATH, "absolute path")
        segments = _normalize(value)
        if segments is None:
            return PathViolation(ErrorCode.PATH_TRAVERSAL, "climbs above the workspace root")
        relative = "/".join(segments) or "."
        # "./~" normalizes to "~", which a shell would expand: absolute after all.
        if _is_absolute(relative):
            return PathViolation(ErrorCode.ABSOLUTE_PATH, "absolute path")
        variants = _decoded_variants(value)
        # The normalized form is decoded too: "./%2f" is "%2f" once "./" is dropped, so
        # it must be refused as "%2f" is (a check of the result must give the result).
        violation = _variant_violation(variants) or _variant_violation(
            _decoded_variants(relative) if relative != value else []
        )
        if violation is not None:
            return violation
        # NUL-bearing variants cannot name a file; their truncated variant stands in.
        usable = [variant for variant in variants if "\x00" not in variant]
        lexical = {relative, *(_joined(variant) for variant in usable)}
        # Without a ".." segment, resolving the written form equals resolving the
        # normalized one; with one, the kernel applies it after following links.
        written = {
            form for form in (v.replace("\\", "/") for v in (value, *usable)) if _climbs(form)
        }
        resolved = {path: self._resolve(path) for path in lexical | written}
        absolute = resolved[relative]
        if absolute is None or None in resolved.values():
            return PathViolation(ErrorCode.SYMLINK_ESCAPE, "resolves outside the workspace")
        names = lexical | {name for name in resolved.values() if name is not None}
        if any(self.is_forbidden(name) for name in names):
            return PathViolation(ErrorCode.FORBIDDEN_PATH, "protected path")
        return GuardedPath(relative, Path(self._absolute(absolute)), absolute)

    def is_forbidden(self, relative: str) -> bool:
        """Whether a normalized workspace-relative path is forbidden.

        Segments are also tried without trailing dots and spaces, which Windows file
        systems drop (``.git.`` is ``.git`` there).
        """
        if self._forbidden.matches(relative):
            return True
        trimmed = "/".join(s for s in (s.rstrip(". ") for s in relative.split("/")) if s)
        return trimmed != relative and self._forbidden.matches(trimmed or ".")

    def _resolve(self, relative: str) -> str | None:
        """Resolve symlinks; the workspace-relative result, or None when outside."""
        resolved = os.path.realpath(self._prefix + relative)
        if resolved == self._root:
            return "."
        if not resolved.startswith(self._prefix):
            return None
        return resolved[len(self._prefix) :]

    def _absolute(self, relative: str) -> str:
        return self._root if relative == "." else self._prefix + relative


# C0, DEL and C1 controls, and lone surrogates, which no file name can hold.
_UNUSABLE_CHAR = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _unusable(value: object) -> str | None:
    """Why ``value`` is not a usable path string, or None."""
    if not isinstance(value, str):
        return "not a string"
    if not value:
        return "empty"
    if len(value) > MAX_PATH_LENGTH:
        return "too long"
    if _UNUSABLE_CHAR.search(value) is not None:
        return "control character"
    return None


_DRIVE_OR_URL = re.compile(r"[A-Za-z]:|[A-Za-z][A-Za-z0-9+.\-]*://|file:", re.IGNORECASE)


def _is_absolute(value: str) -> bool:
    """Absolute, or a reference a shell or tool would make absolute."""
    return value.startswith(("/", "\\", "~")) or _DRIVE_OR_URL.match(value) is not None


def _normalize(value: str) -> list[str] | None:
    """Lexical segments with ``.`` dropped and ``..`` applied; None if it climbs out."""
    stack: list[str] = []
    for segment in value.replace("\\", "/").split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not stack:
                return None
            stack.pop()
        else:
            stack.append(segment)
    return stack


def _variant_violation(variants: list[str]) -> PathViolation | None:
    """Rules 2 and 3 for the decoded readings of a value."""
    for variant in variants:
        segments = _normalize(variant)
        if _is_absolute(variant) or (segments and _is_absolute(segments[0])):
            return PathViolation(ErrorCode.ABSOLUTE_PATH, "decodes to an absolute path")
        if segments is None:
            return PathViolation(
                ErrorCode.PATH_TRAVERSAL, "decodes to a path above the workspace root"
            )
    return None


def _joined(value: str) -> str:
    """The normalized relative form of a value already known not to climb out."""
    return "/".join(_normalize(value) or ()) or "."


def _climbs(value: str) -> bool:
    """Whether a value holds a ``..`` segment (``\\`` already turned into ``/``)."""
    return ".." in value.split("/")


# --- decoded variants -------------------------------------------------------------

_MAX_DECODE_ROUNDS: Final = 4  # three percent-decodings, plus one Unicode folding
_MAX_VARIANTS: Final = 256
_PERCENT = re.compile(r"%(?:[uU]([0-9A-Fa-f]{4})|([0-9A-Fa-f]{2}))")
# Careless decoders take any two alphanumerics as "hex" (digit value 0-35, overflow
# dropped): "%c0%qf" becomes c0 af, an overlong "/".
_PERCENT_CARELESS = re.compile(r"%(?:[uU]([0-9A-Fa-f]{4})|([0-9A-Za-z]{2}))")
# Look-alikes that "best fit" code-page conversions turn into separators.
_LOOKALIKES: Final = str.maketrans(
    {
        "\u2215": "/",  # DIVISION SLASH
        "\u2044": "/",  # FRACTION SLASH
        "\u29f8": "/",  # BIG SOLIDUS
        "\u2216": "\\",  # SET MINUS
        "\u29f9": "\\",  # BIG REVERSE SOLIDUS
        "\u00a5": "\\",  # YEN SIGN: the backslash of Japanese code pages
        "\u20a9": "\\",  # WON SIGN: the backslash of Korean code pages
    }
)


def _decoded_variants(value: str) -> list[str]:
    """Other readings of ``value`` a decoding consumer might arrive at (not ``value``)."""
    if value.isascii() and "%" not in value:
        return []
    seen = {value}
    frontier = [value]
    for _ in range(_MAX_DECODE_ROUNDS):
        found = [
            decoded
            for text in frontier
            for decode in _DECODERS
            if (decoded := decode(text)) not in seen
        ]
        frontier = list(dict.fromkeys(found))
        seen.update(frontier)
        if not frontier or len(seen) > _MAX_VARIANTS:
            break
    seen.discard(value)
    return sorted(seen)


def _percent_bytes(text: str, pattern: re.Pattern[str] = _PERCENT) -> bytes:
    """Percent-decode to bytes; ``%uXXXX`` (IIS style) becomes UTF-8."""
    out = bytearray()
    position = 0
    for match in pattern.finditer(text):
        out += text[position : match.start()].encode("utf-8", "surrogatepass")
        unit, pair = match.groups()
        if unit is not None:
            out += _char(int(unit, 16)).encode("utf-8")
        else:
            out.append((int(pair[0], 36) * 16 + int(pair[1], 36)) & 0xFF)
        position = match.end()
    out += text[position:].encode("utf-8", "surrogatepass")
    return bytes(out)


def _decode_overlong(text: str) -> str:
    """Percent-decode and read UTF-8 like a careless decoder (``%c0%ae`` is ``.``).

    Hex digits are not validated, lead bytes take their continuation bytes without
    validating them, and overlong and 5- and 6-byte forms are accepted, as in the
    decoders those payloads target.
    """
    data = _percent_bytes(text, _PERCENT_CARELESS)
    out: list[str] = []
    i, n = 0, len(data)
    while i < n:
        lead = data[i]
        width = _SEQUENCE_WIDTH[lead]
        if width == 0 or i + width >= n:
            out.append(chr(lead) if lead < 0x80 else "\ufffd")
            i += 1
            continue
        point = lead & (0x3F >> width)
        for follow in data[i + 1 : i + 1 + width]:
            point = (point << 6) | (follow & 0x3F)
        out.append(_char(point))
        i += 1 + width
    return "".join(out)


# Continuation bytes a lead byte announces (0: ASCII or not a lead byte).
_SEQUENCE_WIDTH: Final = bytes(
    1
    if 0xC0 <= b < 0xE0
    else 2
    if 0xE0 <= b < 0xF0
    else 3
    if 0xF0 <= b < 0xF8
    else 4
    if 0xF8 <= b < 0xFC
    else 5
    if 0xFC <= b < 0xFE
    else 0
    for b in range(256)
)


def _decode_strict(text: str) -> str:
    """Percent-decode as UTF-8, dropping invalid bytes (``%c0%5c`` is ``\\``)."""
    return _percent_bytes(text).decode("utf-8", "ignore")


def _fold_unicode(text: str) -> str:
    """NFKC (fullwidth full stops and solidus become ``../``) plus look-alike separators."""
    return unicodedata.normalize("NFKC", text).translate(_LOOKALIKES)


def _truncate_nul(text: str) -> str:
    """What a C string consumer sees: everything before the first NUL."""
    return text.partition("\x00")[0]


def _char(point: int) -> str:
    """The character for a code point; U+FFFD for surrogates and out-of-range values."""
    if point > 0x10FFFF or 0xD800 <= point <= 0xDFFF:
        return "\ufffd"
    return chr(point)


_DECODERS: Final[tuple[Callable[[str], str], ...]] = (
    _decode_overlong,
    _decode_strict,
    _fold_unicode,
    _truncate_nul,
)

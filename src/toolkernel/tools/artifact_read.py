"""``artifact.read``: the continuation of a PARTIAL result — a range of a stored artifact.

A NATIVE tool: it reads the runtime's own store, not the workspace, and runs in a
worker thread (a line range may mean scanning far into a large artifact). Either a
byte range or a line range, never both; at most ``maxBytes`` come back, and the
result says where to continue.

Artifacts hold unredacted output, and the model chooses the ranges, so a range could
cut a secret in two and neither half would look like a secret. Hence the guarantee:
secrets are looked for (``Redactor.secret_spans``: known secrets, private keys and
every pattern rule) in the range widened by ``_REACH`` bytes on each side, and every
byte of the returned range that lies in a secret found there comes back as
``[REDACTED]``, counted by kind under ``withheld``. Every secret rule matches at most
1 KiB, and a private key block at most ~12 KiB up to its END line, all within the
reach: so, whatever the boundaries, no range shows any part of such a secret, nor a
value whose keyword (``password=``) lies outside the range. A key block without an
END line is masked only as far as the reach goes past its BEGIN line.

Host paths get the same treatment where the kernel would not find them: found in the
widened window by the redactor's own path patterns, the part inside the range comes
back as ``<host-path>`` (counted as ``host-path``) unless the same path is found in
the range itself, since ``home/alice/…`` without its leading "/", or a path whose
boundary lies before the range, would no longer look like a path. What the tool
returns then goes through the kernel's redaction like every projection, which masks
stack traces and the host paths it finds in the range, and shows workspace paths
relative.

A large output is stored as canonical JSON, where a newline is the two characters "\\"
and "n": that "n" reads as the first letter of the secret or path after it, and the
rules do not see one start there. So the window is also scanned as it decodes (each
escape, ``\\n`` to ``\\uXXXX``, read as the character it stands for), as the call's
own projection was redacted, and what is found there is masked in the escaped text.
A key block's lines escape only their line breaks and a rule's 1 KiB match grows at
most sixfold, so the reach still holds them.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, BinaryIO, Final

from annotated_types import Ge, Le, MaxLen, MinLen

from toolkernel.codes import ErrorCode, safe_message
from toolkernel.context import ToolContext
from toolkernel.definition import ConcurrencyGroup
from toolkernel.dispatch import ToolOutput
from toolkernel.errors import ToolFailed, UsageError
from toolkernel.functions import tool
from toolkernel.redaction import (  # the path patterns: a cut path is masked as a whole one is
    _HOST_PATH,
    _WINDOWS_PATH,
    HOST_PATH_MASK,
    SECRET_MASK,
    Redactor,
    merged_masks,
)
from toolkernel.validation import Violation

__all__ = ["artifact_read", "check_artifact_read"]

_NAME: Final = "artifact.read"
_MAX_LINE_SCAN: Final = 64 * 1024
_REACH: Final = 16 * 1024
"""Bytes searched on each side of a range for the secrets that reach into it."""
# Left to right, so an escaped backslash is taken before the letter after it.
_JSON_ESCAPE: Final = re.compile(r'\\(?:u[0-9A-Fa-f]{4}|["\\/bfnrt])')
_JSON_CHARS: Final = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}

_Found = tuple[int, int, str]
"""A span of text and the kind of what is there."""
_Shown = tuple[int, int, str | None]
"""A span to mask, and the kind to count it under (None: counted by another span)."""


@tool(
    _NAME,
    idempotent=True,
    concurrency_group=ConcurrencyGroup.READ_ONLY,
    timeout_ms=20_000,
    max_output_bytes=80_000,
    tags=("builtin",),
)
def artifact_read(
    ctx: ToolContext,
    artifactId: Annotated[str, MinLen(71), MaxLen(71)],
    startByte: Annotated[int, Ge(0)] | None = None,
    endByte: Annotated[int, Ge(1)] | None = None,
    startLine: Annotated[int, Ge(1)] | None = None,
    endLine: Annotated[int, Ge(1)] | None = None,
    maxBytes: Annotated[int, Ge(1), Le(65_536)] = 32_768,
) -> ToolOutput:
    """Read part of a stored artifact (the full output behind a cut result).

    Args:
        artifactId: the artifact's id, "sha256:<hex>", from a result's artifacts.
        startByte: first byte to read (0-based); byte mode.
        endByte: end of the byte range (exclusive); byte mode.
        startLine: first line to read (1-based); line mode.
        endLine: last line to read (inclusive); line mode.
        maxBytes: cap on the returned text; the result says where to continue.
    """
    bounds = {
        "startByte": startByte,
        "endByte": endByte,
        "startLine": startLine,
        "endLine": endLine,
    }
    if (violation := check_artifact_read(bounds)) is not None:
        raise ToolFailed(
            safe_message(
                violation.code, tool=_NAME, property=violation.property, **violation.fields
            ),
            code=violation.code,
        )
    lines_mode = startLine is not None or endLine is not None
    if ctx.kernel is None:
        raise ToolFailed(safe_message(ErrorCode.INTERNAL_ERROR, tool=_NAME))
    store = ctx.kernel.artifacts
    try:
        meta = store.metadata(artifactId)
        handle = store.open(artifactId)
    except UsageError:
        note = store.pruned_note()
        pruned = f" It may have been pruned: {note}; run the call again for it." if note else ""
        raise ToolFailed(
            f"There is no artifact '{artifactId}'. Use an id from a result's artifacts." + pruned,
            code=ErrorCode.NOT_FOUND,
        ) from None
    with handle:
        size = int(meta.get("size", 0))
        if lines_mode:
            data, (first, stop) = _lines(handle, startLine or 1, endLine, maxBytes)
        else:
            data, (first, stop) = _bytes(startByte or 0, endByte, maxBytes, size)
        content, withheld = _masked(handle, first, stop, ctx.kernel.redactor)
    data = {
        "artifactId": artifactId,
        "mediaType": meta.get("type"),
        "size": size,
        **data,
        "content": content,
    }
    if withheld:
        data["withheld"] = dict(sorted(withheld.items()))
    return ToolOutput(data, _summary(data))


def check_artifact_read(arguments: Mapping[str, Any]) -> Violation | None:
    """What the schema cannot say about ``artifact.read``'s arguments: one range, in order.

    `toolkernel.tools.install` has the kernel run this in validation, so such a call is
    refused before it starts; the tool checks again when registered without it.
    """
    start_byte, end_byte = arguments.get("startByte"), arguments.get("endByte")
    start_line, end_line = arguments.get("startLine"), arguments.get("endLine")
    if (start_byte is not None or end_byte is not None) and (
        start_line is not None or end_line is not None
    ):
        rule = "give a byte range or a line range, not both"
        return Violation(ErrorCode.SCHEMA_VIOLATION, "startLine", {"rule": rule})
    if _out_of_order(start_byte, end_byte, inclusive=False):
        bound = "endByte must be greater than startByte"
        return Violation(ErrorCode.OUT_OF_BOUNDS, "endByte", {"bound": bound})
    if _out_of_order(start_line, end_line, inclusive=True):
        bound = "endLine must not be less than startLine"
        return Violation(ErrorCode.OUT_OF_BOUNDS, "endLine", {"bound": bound})
    return None


def _out_of_order(start: object, end: object, *, inclusive: bool) -> bool:
    """Whether ``end`` lies before ``start``; an exclusive end must lie after it."""
    if not isinstance(start, int | float) or not isinstance(end, int | float):
        return False
    return end < start if inclusive else end <= start


def _masked(
    handle: BinaryIO, start: int, stop: int, redactor: Redactor
) -> tuple[str, Counter[str]]:
    """Bytes ``[start, stop)`` as text, every byte of a secret around them masked, and
    every byte of a host path the kernel would not find in them."""
    if stop <= start:  # nothing to show (a start past the end: no seek there either)
        return "", Counter()
    reach = max(_REACH, 4 * redactor.max_secret_length)  # UTF-8: up to 4 bytes a character
    low = max(0, start - reach)
    handle.seek(low)
    window = handle.read(max(0, stop + reach - low))
    first, last = start - low, min(stop - low, len(window))
    # surrogateescape keeps one character per undecodable byte, so that character
    # offsets map back to byte offsets exactly.
    text = window.decode("utf-8", errors="surrogateescape")
    secrets: list[_Shown] = [*redactor.secret_spans(text)]
    paths: list[_Shown] = [*_host_path_spans(text)]
    view = _JsonView(text)
    if view.text != text:
        decoded = view.spans(redactor.secret_spans(view.text))
        secrets = [*decoded, *_uncounted_where_overlapped(secrets, decoded)]
        decoded = view.spans(_host_path_spans(view.text))
        paths = [*decoded, *_uncounted_where_overlapped(paths, decoded)]
    # A path the kernel finds in the range itself is its to redact (a workspace path
    # becomes relative); one the range cuts, or one that only the text around the range
    # or the decoded view shows to be a path, would get past it.
    in_range = window[first:last].decode("utf-8", errors="surrogateescape")
    own = {(first + b, first + e) for b, e, _ in _byte_spans(in_range, _host_path_spans(in_range))}
    hidden = [span for span in _byte_spans(text, paths) if span[:2] not in own]
    spans = [(b, e, k, SECRET_MASK) for b, e, k in _byte_spans(text, secrets)] + [
        (b, e, k, HOST_PATH_MASK) for b, e, k in hidden
    ]
    withheld: Counter[str] = Counter()
    pieces: list[str] = []
    done = first
    for begin, end, mask in merged_masks(spans, first, last, withheld):
        pieces += [window[done:begin].decode("utf-8", errors="replace"), mask]
        done = end
    pieces.append(window[done:last].decode("utf-8", errors="replace"))
    return "".join(pieces), withheld


def _host_path_spans(text: str) -> list[_Found]:
    """Where ``text`` holds host paths, found by the redactor's own path patterns."""
    spans = [(m.start(), m.end(), "host-path") for m in _HOST_PATH.finditer(text)]
    # The Windows pattern starts at the colon; its span takes in the drive letter.
    spans += [(m.start() - 1, m.end(), "host-path") for m in _WINDOWS_PATH.finditer(text)]
    return spans


class _JsonView:
    """``text`` with its JSON string escapes decoded, and the way back to its offsets."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._after: list[int] = []  # offsets of the view just past an escape's character
        self._shift: list[int] = []  # how far ``text`` is ahead of the view from there
        if "\\" not in text:
            return
        pieces: list[str] = []
        done = shift = 0
        for match in _JSON_ESCAPE.finditer(text):
            escape = match.group()
            letter = escape[1]
            pieces += [text[done : match.start()], _JSON_CHARS.get(letter, letter)]
            if letter == "u":
                pieces[-1] = chr(int(escape[2:], 16))
            shift += len(escape) - 1
            self._after.append(match.end() - shift)
            self._shift.append(shift)
            done = match.end()
        self.text = "".join([*pieces, text[done:]])

    def spans(self, found: Sequence[_Found]) -> list[_Found]:
        """Spans of the view as spans of ``text``: an escape is in one whole or not at all."""
        return [(self._origin(begin), self._origin(end), kind) for begin, end, kind in found]

    def _origin(self, at: int) -> int:
        index = bisect.bisect_right(self._after, at) - 1
        return at if index < 0 else at + self._shift[index]


def _uncounted_where_overlapped(spans: Sequence[_Shown], by: Sequence[_Found]) -> list[_Shown]:
    """``spans``, those that overlap one of ``by`` without a kind: still masked, but what
    they found is counted once, under the kind ``by`` gives it."""
    ordered = sorted(by)
    starts = [begin for begin, _, _ in ordered]
    reach: list[int] = []  # the furthest end among ``ordered[: i + 1]``
    for _, end, _ in ordered:
        reach.append(max(end, reach[-1]) if reach else end)
    kept: list[_Shown] = []
    for begin, end, kind in spans:
        before = bisect.bisect_left(starts, end)  # those of ``by`` that start before ``end``
        overlapped = before > 0 and reach[before - 1] > begin
        kept.append((begin, end, None if overlapped else kind))
    return kept


def _byte_spans(text: str, spans: Sequence[_Shown]) -> list[_Shown]:
    """Character spans of ``text`` as byte spans of its surrogateescape UTF-8 encoding."""
    if text.isascii():
        return list(spans)
    offsets: dict[int, int] = {}
    char = byte = 0
    for point in sorted({p for begin, end, _ in spans for p in (begin, end)}):
        byte += len(text[char:point].encode("utf-8", errors="surrogateescape"))
        char = point
        offsets[point] = byte
    return [(offsets[begin], offsets[end], kind) for begin, end, kind in spans]


def _bytes(
    start: int, end: int | None, cap: int, size: int
) -> tuple[dict[str, Any], tuple[int, int]]:
    """The result's fields for a byte range, and the bytes it covers."""
    stop = max(start, min(size, start + cap, size if end is None else end))
    result: dict[str, Any] = {"startByte": start, "endByte": stop, "eof": stop >= size}
    if not result["eof"] and (end is None or stop < end):
        result["nextByte"] = stop
    return result, (start, stop)


def _lines(
    handle: BinaryIO, start: int, end: int | None, cap: int
) -> tuple[dict[str, Any], tuple[int, int]]:
    """The result's fields for a line range, and the bytes it covers.

    The kept lines are contiguous: only the last one can be cut short, and then the
    fields say so (``lineCut``) and where the rest of it is (``nextByte``, byte mode),
    and ``nextLine`` only if a line follows it.
    """
    kept: list[bytes] = []
    used = number = first = 0
    last = start - 1
    eof = cut = line_cut = False
    followed = True  # a line follows the last one kept
    while True:
        if number == start - 1:
            first = handle.tell()
        found = _next_line(handle)
        if found is None:
            eof = True
            break
        line, whole = found
        number += 1
        if number < start:
            continue
        if end is not None and number > end:
            break
        if whole and used + len(line) <= cap:
            kept.append(line)
            used += len(line)
            last = number
            continue
        if not kept:  # one line longer than the cap: its beginning, not nothing
            kept.append(_whole_characters(line[:cap]))
            last = number
            line_cut = True
            followed = bool(handle.read(1))  # past the line's end: the rest was skipped
        cut = True
        break
    result: dict[str, Any] = {"startLine": start, "endLine": last, "eof": eof}
    stop = first + sum(map(len, kept))
    if line_cut:
        result["lineCut"] = True
        result["nextByte"] = stop
    if cut and followed:
        result["nextLine"] = last + 1
    return result, (first, stop)


def _next_line(handle: BinaryIO) -> tuple[bytes, bool] | None:
    """The next line, and whether it is whole: a line longer than `_MAX_LINE_SCAN`
    comes back cut there (its rest read and skipped, in bounded pieces)."""
    line = handle.readline(_MAX_LINE_SCAN)
    if not line:
        return None
    if line.endswith(b"\n") or len(line) < _MAX_LINE_SCAN:
        return line, True
    rest = line
    while rest and not rest.endswith(b"\n"):
        rest = handle.readline(_MAX_LINE_SCAN)
    return line, False


def _whole_characters(data: bytes) -> bytes:
    """``data`` without the UTF-8 character its end cuts in two, unless that is all of it."""
    for back in range(1, min(4, len(data)) + 1):
        lead = data[-back]
        if lead & 0xC0 != 0x80:  # the first byte of the last character
            needed = 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            return data[:-back] if back < needed and back < len(data) else data
    return data


def _summary(data: dict[str, Any]) -> str:
    if "lineCut" in data:
        where = f"lines {data['startLine']}-{data['endLine']}"
        more = (
            f" Line {data['endLine']} was cut: read the rest of it with "
            f"startByte={data['nextByte']} (byte mode)"
        )
        if "nextLine" in data:
            more += f", the lines after it with startLine={data['nextLine']}"
        more += "."
    elif "startLine" in data:
        where = f"lines {data['startLine']}-{data['endLine']}"
        more = f" Continue with startLine={data['nextLine']}." if "nextLine" in data else ""
    else:
        where = f"bytes {data['startByte']}-{data['endByte']}"
        more = f" Continue with startByte={data['nextByte']}." if "nextByte" in data else ""
    withheld = data.get("withheld", {})
    if withheld:
        kinds = ", ".join(f"{count} {kind}" for kind, count in withheld.items())
        more += f" Withheld in or across the range: {kinds}."
    return f"Read {where} of artifact {data['artifactId']} ({data['size']} bytes).{more}"

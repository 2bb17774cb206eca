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

Host paths get the same treatment where the range cuts them: found in the widened
window by the redactor's own path patterns, the part inside the range comes back as
``<host-path>`` (counted as ``host-path``), since ``home/alice/…`` without its
leading "/" would no longer look like a path. What the tool returns then goes through
the kernel's redaction like every projection, which masks stack traces and the host
paths wholly inside the range, and shows workspace paths relative.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
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
)
from toolkernel.validation import Violation

__all__ = ["artifact_read", "check_artifact_read"]

_NAME: Final = "artifact.read"
_MAX_LINE_SCAN: Final = 64 * 1024
_REACH: Final = 16 * 1024
"""Bytes searched on each side of a range for the secrets that reach into it."""


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
        raise ToolFailed(
            f"There is no artifact '{artifactId}'. Use an id from a result's artifacts.",
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
    every byte of a host path they cut."""
    reach = max(_REACH, 4 * redactor.max_secret_length)  # UTF-8: up to 4 bytes a character
    low = max(0, start - reach)
    handle.seek(low)
    window = handle.read(max(0, stop + reach - low))
    first, last = start - low, min(stop - low, len(window))
    # surrogateescape keeps one character per undecodable byte, so that character
    # offsets map back to byte offsets exactly.
    text = window.decode("utf-8", errors="surrogateescape")
    secrets = _byte_spans(text, redactor.secret_spans(text))
    # A path wholly in the range is the kernel's to redact (a workspace path becomes
    # relative); one the range cuts would no longer look like a path to it.
    paths = [
        (begin, end, kind)
        for begin, end, kind in _byte_spans(text, _host_path_spans(text))
        if begin < first or end > last
    ]
    spans = sorted(
        [(b, e, k, SECRET_MASK) for b, e, k in secrets]
        + [(b, e, k, HOST_PATH_MASK) for b, e, k in paths]
    )
    withheld: Counter[str] = Counter()
    masked: list[tuple[int, int, str]] = []
    for begin, end, kind, mask in spans:
        if end <= first or begin >= last:
            continue
        withheld[kind] += 1
        begin, end = max(begin, first), min(end, last)
        if masked and begin <= masked[-1][1]:  # overlapping or adjacent: one mask
            before, until, shown = masked[-1]
            strongest = SECRET_MASK if SECRET_MASK in (shown, mask) else mask
            masked[-1] = (before, max(until, end), strongest)
        else:
            masked.append((begin, end, mask))
    pieces: list[str] = []
    done = first
    for begin, end, mask in masked:
        pieces += [window[done:begin].decode("utf-8", errors="replace"), mask]
        done = end
    pieces.append(window[done:last].decode("utf-8", errors="replace"))
    return "".join(pieces), withheld


def _host_path_spans(text: str) -> list[tuple[int, int, str]]:
    """Where ``text`` holds host paths, found by the redactor's own path patterns."""
    spans = [(m.start(), m.end(), "host-path") for m in _HOST_PATH.finditer(text)]
    # The Windows pattern starts at the colon; its span takes in the drive letter.
    spans += [(m.start() - 1, m.end(), "host-path") for m in _WINDOWS_PATH.finditer(text)]
    return spans


def _byte_spans(text: str, spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Character spans of ``text`` as byte spans of its surrogateescape UTF-8 encoding."""
    if text.isascii():
        return spans
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

    The kept lines are contiguous: only the last one can be cut short.
    """
    kept: list[bytes] = []
    used = number = first = 0
    last = start - 1
    eof = cut = False
    while True:
        if number == start - 1:
            first = handle.tell()
        line = _next_line(handle)
        if line is None:
            eof = True
            break
        number += 1
        if number < start:
            continue
        if end is not None and number > end:
            break
        if used + len(line) > cap:
            if not kept:  # one line longer than the cap: its beginning, not nothing
                kept.append(line[:cap])
                last = number
            cut = True
            break
        kept.append(line)
        used += len(line)
        last = number
    result: dict[str, Any] = {"startLine": start, "endLine": last, "eof": eof}
    if cut:
        result["nextLine"] = last + 1
    return result, (first, first + sum(map(len, kept)))


def _next_line(handle: BinaryIO) -> bytes | None:
    """The next line; a giant line is read in bounded pieces and returned cut."""
    line = handle.readline(_MAX_LINE_SCAN)
    if not line:
        return None
    if line.endswith(b"\n"):
        return line
    head = line
    while line and not line.endswith(b"\n"):  # skip the rest of an over-long line
        line = handle.readline(_MAX_LINE_SCAN)
    return head


def _summary(data: dict[str, Any]) -> str:
    if "startLine" in data:
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

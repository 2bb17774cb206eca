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
END line is masked only as far as the reach goes past its BEGIN line. What the tool
returns then goes through the kernel's redaction like every projection, which masks
stack traces and host paths in the returned text itself.
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, BinaryIO, Final

from annotated_types import Ge, Le, MaxLen, MinLen

from toolkernel.codes import ErrorCode, safe_message
from toolkernel.context import ToolContext
from toolkernel.definition import ConcurrencyGroup
from toolkernel.dispatch import ToolOutput
from toolkernel.errors import ToolFailed, UsageError
from toolkernel.functions import tool
from toolkernel.redaction import SECRET_MASK, Redactor

__all__ = ["artifact_read"]

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
    bytes_mode = startByte is not None or endByte is not None
    lines_mode = startLine is not None or endLine is not None
    if bytes_mode and lines_mode:
        raise ToolFailed(
            safe_message(
                ErrorCode.SCHEMA_VIOLATION,
                property="startLine",
                tool=_NAME,
                rule="give a byte range or a line range, not both",
            ),
            code=ErrorCode.SCHEMA_VIOLATION,
        )
    if startByte is not None and endByte is not None and endByte <= startByte:
        raise _before_start("endByte", "endByte must be greater than startByte")
    if startLine is not None and endLine is not None and endLine < startLine:
        raise _before_start("endLine", "endLine must not be less than startLine")
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


def _masked(
    handle: BinaryIO, start: int, stop: int, redactor: Redactor
) -> tuple[str, Counter[str]]:
    """Bytes ``[start, stop)`` as text, every byte of a secret around them masked."""
    reach = max(_REACH, 4 * redactor.max_secret_length)  # UTF-8: up to 4 bytes a character
    low = max(0, start - reach)
    handle.seek(low)
    window = handle.read(max(0, stop + reach - low))
    first, last = start - low, min(stop - low, len(window))
    # surrogateescape keeps one character per undecodable byte, so that character
    # offsets map back to byte offsets exactly.
    text = window.decode("utf-8", errors="surrogateescape")
    withheld: Counter[str] = Counter()
    masked: list[list[int]] = []
    for begin, end, kind in _byte_spans(text, redactor.secret_spans(text)):
        if end <= first or begin >= last:
            continue
        withheld[kind] += 1
        begin, end = max(begin, first), min(end, last)
        if masked and begin <= masked[-1][1]:  # overlapping or adjacent: one mask
            masked[-1][1] = max(masked[-1][1], end)
        else:
            masked.append([begin, end])
    pieces: list[str] = []
    done = first
    for begin, end in masked:
        pieces += [window[done:begin].decode("utf-8", errors="replace"), SECRET_MASK]
        done = end
    pieces.append(window[done:last].decode("utf-8", errors="replace"))
    return "".join(pieces), withheld


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
        more += f" Secrets in or across the range were withheld: {kinds}."
    return f"Read {where} of artifact {data['artifactId']} ({data['size']} bytes).{more}"


def _before_start(prop: str, bound: str) -> ToolFailed:
    return ToolFailed(
        safe_message(ErrorCode.OUT_OF_BOUNDS, property=prop, tool=_NAME, bound=bound),
        code=ErrorCode.OUT_OF_BOUNDS,
    )

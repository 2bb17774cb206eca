"""``artifact.read``: the continuation of a PARTIAL result — a range of a stored artifact.

A NATIVE tool: it reads the runtime's own store, not the workspace, and runs in a
worker thread (a line range may mean scanning far into a large artifact). Either a
byte range or a line range, never both; at most ``maxBytes`` come back, and the
result says where to continue. What it returns goes through the kernel's redaction
like every projection — prefer line ranges: a secret cut in half by a byte boundary
is not recognisable in either half.
"""

from __future__ import annotations

from typing import Annotated, Any, BinaryIO, Final

from annotated_types import Ge, Le, MaxLen, MinLen

from toolkernel.codes import ErrorCode, safe_message
from toolkernel.context import ToolContext
from toolkernel.definition import ConcurrencyGroup
from toolkernel.dispatch import ToolOutput
from toolkernel.errors import ToolFailed, UsageError
from toolkernel.functions import tool

__all__ = ["artifact_read"]

_NAME: Final = "artifact.read"
_MAX_LINE_SCAN: Final = 64 * 1024


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
            data = _lines(handle, startLine or 1, endLine, maxBytes)
        else:
            data = _bytes(handle, startByte or 0, endByte, maxBytes, size)
    data = {"artifactId": artifactId, "mediaType": meta.get("type"), "size": size, **data}
    return ToolOutput(data, _summary(data))


def _bytes(handle: BinaryIO, start: int, end: int | None, cap: int, size: int) -> dict[str, Any]:
    stop = min(size, start + cap, size if end is None else end)
    handle.seek(start)
    chunk = handle.read(max(0, stop - start))
    result: dict[str, Any] = {
        "startByte": start,
        "endByte": start + len(chunk),
        "content": chunk.decode("utf-8", errors="replace"),
        "eof": start + len(chunk) >= size,
    }
    if not result["eof"] and (end is None or start + len(chunk) < end):
        result["nextByte"] = start + len(chunk)
    return result


def _lines(handle: BinaryIO, start: int, end: int | None, cap: int) -> dict[str, Any]:
    kept: list[bytes] = []
    used = number = 0
    last = start - 1
    eof = cut = False
    while True:
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
    result: dict[str, Any] = {
        "startLine": start,
        "endLine": last,
        "content": b"".join(kept).decode("utf-8", errors="replace"),
        "eof": eof,
    }
    if cut:
        result["nextLine"] = last + 1
    return result


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
    return f"Read {where} of artifact {data['artifactId']} ({data['size']} bytes).{more}"


def _before_start(prop: str, bound: str) -> ToolFailed:
    return ToolFailed(
        safe_message(ErrorCode.OUT_OF_BOUNDS, property=prop, tool=_NAME, bound=bound),
        code=ErrorCode.OUT_OF_BOUNDS,
    )

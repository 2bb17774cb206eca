"""``file.read``: a line range of a workspace file, its hash, and a binary-file policy.

It runs in-process even though its mode is SANDBOX_READ_ONLY: reading one file runs
no foreign code, so the sandbox would add a bubblewrap start (milliseconds, the bulk
of the call) and protect nothing the link-free ``openat`` walk of `workspace_io` does
not already. The mode still matters: it puts the tool under the sandbox adapter, the
read-only concurrency group, and the policy of its mode. The reading itself runs in a
worker thread (`in_worker`): the call's timeout applies, and the event loop is free.

A file that ``file.patch`` can change (up to `MAX_PATCHED_BYTES`) is streamed once
(bounded memory) to compute ``sha256`` — the ``baseHash`` ``file.patch`` expects, of
the whole file — and to count its lines; only the requested range, cut at
``maxBytes``, is kept. A larger file is read only as far as the range needs: its
``sha256`` is ``null``, and so is ``totalLines`` unless the range reached the end
(lines 1-2 of a log of gigabytes cost two lines, not the log). Lines break at ``\\n``
alone, as ``file.patch`` breaks them. A line longer than ``maxBytes`` is cut with
``Redactor.clip`` (a secret the cut goes through, or whose keyword is before the range,
is masked whole), and the result says where to go on: ``startColumn`` reads on inside
the line. A file whose first 8 KiB hold a NUL byte is binary (git's rule): it is
described by media type, size and hash, never dumped. UTF-16 without a byte order
mark is read as UTF-16LE.
"""

from __future__ import annotations

import codecs
import errno
import hashlib
import logging
import mimetypes
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from itertools import chain
from typing import Annotated, Any, BinaryIO, Final

from annotated_types import Ge, Le

from toolkernel.codes import ErrorCode, safe_field, safe_message
from toolkernel.context import ToolContext
from toolkernel.definition import ConcurrencyGroup, ExecutionMode, Permissions
from toolkernel.dispatch import ToolOutput
from toolkernel.errors import RESOURCE_SHORTAGES, ToolFailed, runtime_failure
from toolkernel.functions import WorkspacePath, tool
from toolkernel.redaction import Redactor
from toolkernel.tools.patch import MAX_PATCHED_BYTES
from toolkernel.tools.workspace_io import (
    HASH_PREFIX,
    Checkpoint,
    Encoding,
    Target,
    in_worker,
    locate,
    open_dir,
    open_file,
)
from toolkernel.validation import Violation

_log = logging.getLogger(__name__)

__all__ = ["check_file_read", "file_read"]

_NAME: Final = "file.read"
_SNIFF_BYTES: Final = 8192
_CHUNK: Final = 256 * 1024
_MAX_LINE: Final = 10_000_000
_CONTEXT_CHARS: Final = 32_768
"""Characters of a line kept on each side of what is returned, for ``clip`` to find
the secrets (and their keywords) that reach across a cut."""


@dataclass(frozen=True, slots=True)
class _Range:
    """What the call asks for: lines ``start``-``end`` from character ``column`` of the
    first, at most ``max_bytes`` of them, decoded as ``encoding``."""

    start: int
    end: int | None
    column: int
    max_bytes: int
    encoding: str


@tool(
    _NAME,
    execution_mode=ExecutionMode.SANDBOX_READ_ONLY,
    permissions=Permissions(read_workspace=True),
    concurrency_group=ConcurrencyGroup.READ_ONLY,
    idempotent=True,
    timeout_ms=20_000,
    max_output_bytes=160_000,
    tags=("workspace", "builtin"),
)
async def file_read(
    ctx: ToolContext,
    path: WorkspacePath,
    startLine: Annotated[int, Ge(1), Le(_MAX_LINE)] = 1,
    endLine: Annotated[int, Ge(1), Le(_MAX_LINE)] | None = None,
    maxBytes: Annotated[int, Ge(1), Le(131_072)] = 65_536,
    encoding: Encoding = "utf-8",
    startColumn: Annotated[int, Ge(1)] = 1,
) -> ToolOutput:
    """Read a workspace file (or a line range of it); returns its sha256 for file.patch.

    Args:
        path: workspace-relative file, e.g. "src/app.py".
        startLine: first line to return (1-based).
        endLine: last line to return (inclusive); the end of the file when left out.
        maxBytes: cap on the returned text in bytes; the result says where to continue.
        encoding: how the file's bytes are decoded.
        startColumn: character of startLine to start at (1-based), to read on in a line
            that was cut at maxBytes.
    """
    if (violation := check_file_read({"startLine": startLine, "endLine": endLine})) is not None:
        raise ToolFailed(
            safe_message(
                violation.code, tool=_NAME, property=violation.property, **violation.fields
            ),
            code=violation.code,
        )
    target = locate(ctx, path, tool=_NAME)
    assert ctx.kernel is not None  # locate refuses a call without one
    wanted = _Range(startLine, endLine, startColumn, maxBytes, encoding)
    return await in_worker(ctx, partial(_read, target, wanted, ctx.kernel.redactor))


def check_file_read(arguments: Mapping[str, Any]) -> Violation | None:
    """What the schema cannot say about ``file.read``'s arguments: the range's order.

    `toolkernel.tools.install` has the kernel run this in validation, so such a call is
    refused before it starts; the tool checks again when registered without it.
    """
    start, end = arguments.get("startLine", 1), arguments.get("endLine")
    if isinstance(start, int | float) and isinstance(end, int | float) and end < start:
        bound = "endLine must not be less than startLine"
        return Violation(ErrorCode.OUT_OF_BOUNDS, "endLine", {"bound": bound})
    return None


def _read(target: Target, wanted: _Range, redactor: Redactor, checkpoint: Checkpoint) -> ToolOutput:
    """Open the file without following links and read it (blocking)."""
    try:
        with open_dir(target) as dir_fd:
            fd = open_file(dir_fd, target.name)
    except FileNotFoundError:
        raise ToolFailed(
            f"There is no file '{target.relative}'. Check the path with repo.search.",
            code=ErrorCode.NOT_FOUND,
        ) from None
    except PermissionError:
        raise ToolFailed(
            f"'{target.relative}' cannot be read: permission denied.",
            code=ErrorCode.NOT_FOUND,
        ) from None
    except OSError as exc:
        if exc.errno in RESOURCE_SHORTAGES:  # the runtime's shortage, not the file's
            _log.error("file.read could not open a file: %s", exc)
            raise runtime_failure(_NAME, exc) from None
        raise ToolFailed(_unreadable(target.relative, exc), code=ErrorCode.NOT_FOUND) from None
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(fd).st_size
        head = handle.read(_SNIFF_BYTES)
        digest = hashlib.sha256() if size <= MAX_PATCHED_BYTES else None
        chunks = _chunks(head, handle, digest, checkpoint)
        if wanted.encoding != "utf-16" and b"\0" in head:
            return _describe_binary(target.relative, head, size, chunks, digest)
        return _read_text(target.relative, size, chunks, wanted, head, digest, redactor=redactor)


def _chunks(head: bytes, handle: BinaryIO, digest: Any, checkpoint: Checkpoint) -> Iterator[bytes]:
    """The file's bytes from ``head`` on, each hashed (with a ``digest``) as it is read."""
    chunk = head
    while chunk:
        if digest is not None:
            digest.update(chunk)
        yield chunk
        checkpoint()
        chunk = handle.read(_CHUNK)


def _describe_binary(
    relative: str, head: bytes, size: int, chunks: Iterable[bytes], digest: Any
) -> ToolOutput:
    media_type = mimetypes.guess_type(relative)[0] or "application/octet-stream"
    data = {
        "path": relative,
        "binary": True,
        "mediaType": media_type,
        "size": size,
        "sha256": _hexdigest(chunks, digest),
    }
    summary = f"{relative} is a binary file ({media_type}, {size} bytes); its content is not shown."
    if digest is None:
        summary += f" {_UNHASHED}"
    return ToolOutput(data, summary)


def _hexdigest(chunks: Iterable[bytes], digest: Any) -> str | None:
    """``sha256:<hex>`` once every chunk is read; ``None`` without a digest (none read)."""
    if digest is None:
        return None
    for _ in chunks:
        pass
    return f"{HASH_PREFIX}{digest.hexdigest()}"


_UNHASHED: Final = (
    f"It is larger than file.patch changes ({MAX_PATCHED_BYTES // (1024 * 1024)} MiB): "
    "it has no sha256, and was read only as far as needed."
)


@dataclass(frozen=True, slots=True)
class _Line:
    """A line's characters ``offset`` to ``offset + len(text)`` (what its window kept),
    and its whole ``length`` (its ``\\n`` included)."""

    number: int
    text: str
    offset: int
    length: int


class _Lines:
    """The lines of a decoded text, each kept only within its window of characters
    (``window(number)``: from, to), so that a giant line cannot fill memory.

    Once ``done`` is set, the lines left are only counted (``count``), at the speed
    of ``str.count``.
    """

    def __init__(self, texts: Iterator[str], window: Callable[[int], tuple[int, int]]) -> None:
        self._texts = texts
        self._window = window
        self.done = False
        self.count = 0

    def __iter__(self) -> Iterator[_Line]:
        number, length = 1, 0
        kept: list[str] = []
        low, high = self._window(number)
        for text in self._texts:
            pieces = text.split("\n")
            for index, piece in enumerate(pieces):
                ended = index < len(pieces) - 1
                size = len(piece) + ended
                if length < high and low < length + size:
                    segment = piece + "\n" if ended else piece
                    kept.append(segment[max(0, low - length) : high - length])
                length += size
                if not ended:
                    continue
                yield _Line(number, "".join(kept), min(low, length), length)
                self.count = number
                if self.done:
                    self._count_rest("\n".join(pieces[index + 1 :]))
                    return
                number, kept, length = number + 1, [], 0
                low, high = self._window(number)
        if length:
            yield _Line(number, "".join(kept), min(low, length), length)
            self.count = number

    def _count_rest(self, tail: str) -> None:
        ends_line = True
        for text in chain((tail,), self._texts):
            if text:
                self.count += text.count("\n")
                ends_line = text.endswith("\n")
        self.count += not ends_line


def _decoded(chunks: Iterable[bytes], encoding: str, head: bytes) -> Iterator[str]:
    """The text of ``chunks``. UTF-16 without a byte order mark is read as UTF-16LE
    (what Windows tools write), where Python's codec would raise."""
    if encoding == "utf-16" and not head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        encoding = "utf-16-le"
    decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
    for chunk in chunks:
        yield decoder.decode(chunk)
    yield decoder.decode(b"", final=True)


def _read_text(
    relative: str,
    size: int,
    chunks: Iterable[bytes],
    wanted: _Range,
    head: bytes,
    digest: Any,
    *,
    redactor: Redactor,
) -> ToolOutput:
    start, end, skip, cap = wanted.start, wanted.end, wanted.column - 1, wanted.max_bytes
    context = max(_CONTEXT_CHARS, redactor.max_secret_length)

    def window(number: int) -> tuple[int, int]:
        if number == start:
            return max(0, skip - context), skip + cap + context
        return (0, cap + context) if number > start else (0, 0)

    lines = _Lines(_decoded(chunks, wanted.encoding, head), window)
    kept: list[str] = []
    used = 0
    last = start - 1
    next_line = next_column = None
    counted = True  # every line was seen, so lines.count is the file's
    for line in lines:
        if line.number < start:
            continue
        begin = skip if line.number == start else 0
        shown = line.text[begin - line.offset :]
        whole = begin + len(shown) >= line.length
        encoded = len(shown.encode())
        if whole and used + encoded <= cap:
            edge = begin > 0  # a piece of the line: secrets across its start are masked
            kept.append(_part(line, begin, len(shown), redactor) if edge else shown)
            used += encoded
            last = line.number
        elif used == 0:  # longer than the cap on its own: its beginning, not nothing
            # At least one character, so that startColumn=nextColumn always moves on.
            chars = max(1, len(shown.encode()[:cap].decode("utf-8", errors="ignore")))
            kept.append(_part(line, begin, chars, redactor))
            last, next_line, next_column = line.number, line.number, begin + chars + 1
        else:
            next_line = line.number
        if next_line is not None or line.number == end:
            if digest is None:
                counted = False
                break
            lines.done = True
    data: dict[str, Any] = {
        "path": relative,
        "encoding": wanted.encoding,
        "startLine": start,
        "endLine": last,
        "totalLines": lines.count if counted else None,
        "size": size,
        "sha256": _hexdigest(chunks, digest),
        "content": "".join(kept),
        "truncated": next_line is not None,
    }
    if skip:
        data["startColumn"] = wanted.column
    if next_line is not None:
        data["nextLine"] = next_line
    if next_column is not None:
        data["nextColumn"] = next_column
    return ToolOutput(data, _summary(data, cap))


def _part(line: _Line, begin: int, chars: int, redactor: Redactor) -> str:
    """Characters ``begin`` to ``begin + chars`` of ``line``, every secret that reaches
    into them masked (``clip``); what that masks is not counted, since a tool cannot
    add to its result's notices. A mask longer than the piece of secret it hides can
    take the text a few bytes past the cap."""
    return redactor.clip(line.text, begin - line.offset, begin - line.offset + chars, Counter())


def _summary(data: dict[str, Any], cap: int) -> str:
    relative, start, last = data["path"], data["startLine"], data["endLine"]
    total = data["totalLines"]
    extent = f"{total} lines" if total is not None else f"{data['size']} bytes"
    unhashed = "" if data["sha256"] is not None else f" {_UNHASHED}"
    if total is not None and start > total:
        return f"{relative} has {total} lines; nothing from line {start}.{unhashed}"
    column = f" from column {data['startColumn']}" if "startColumn" in data else ""
    read = f"Read lines {start}-{last}{column} of {relative} ({extent})"
    if "nextColumn" in data:
        more = (
            f"; line {last} is cut at {cap} bytes, read on with startLine={last}, "
            f"startColumn={data['nextColumn']}."
        )
    elif data["truncated"]:
        more = f"; cut at {cap} bytes, continue with startLine={data['nextLine']}."
    else:
        more = "."
    return read + more + unhashed


def _unreadable(relative: str, exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        return f"'{safe_field(relative, 80)}' cannot be read: a name in it is too long."
    if exc.errno == errno.ELOOP:
        return f"'{relative}' is a symbolic link; read the file it points to instead."
    return f"'{relative}' is not a regular file that can be read."

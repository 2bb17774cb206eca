"""``file.read``: a line range of a workspace file, its hash, and a binary-file policy.

It runs in-process even though its mode is SANDBOX_READ_ONLY: reading one file runs
no foreign code, so the sandbox would add a bubblewrap start (milliseconds, the bulk
of the call) and protect nothing the link-free ``openat`` walk of `workspace_io` does
not already. The mode still matters: it puts the tool under the sandbox adapter, the
read-only concurrency group, and the policy of its mode.

The whole file is streamed once (bounded memory) to compute ``sha256`` — the
``baseHash`` that ``file.patch`` expects — and to count its lines; only the requested
range, cut at ``maxBytes``, is kept. A line longer than ``maxBytes`` on its own is cut
with ``Redactor.clip``: a secret the cut goes through, or whose keyword is before the
range, is masked whole. A file whose first 8 KiB hold a NUL byte is binary (git's
rule): it is described by media type, size and hash, never dumped.
"""

from __future__ import annotations

import codecs
import errno
import hashlib
import logging
import mimetypes
import os
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Final, Literal

from annotated_types import Ge, Le

from toolkernel.codes import ErrorCode, safe_field, safe_message
from toolkernel.context import ToolContext
from toolkernel.definition import ConcurrencyGroup, ExecutionMode, Permissions
from toolkernel.dispatch import ToolOutput
from toolkernel.errors import RESOURCE_SHORTAGES, ToolFailed, runtime_failure
from toolkernel.functions import WorkspacePath, tool
from toolkernel.redaction import Redactor
from toolkernel.tools.workspace_io import HASH_PREFIX, locate, open_dir, open_file
from toolkernel.validation import Violation

_log = logging.getLogger(__name__)

__all__ = ["check_file_read", "file_read"]

Encoding = Literal["utf-8", "utf-16", "latin-1", "cp1252", "ascii"]

_NAME: Final = "file.read"
_SNIFF_BYTES: Final = 8192
_CHUNK: Final = 256 * 1024
_MAX_LINE: Final = 10_000_000
_MAX_LINE_CHARS: Final = 1_048_576


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
) -> ToolOutput:
    """Read a workspace file (or a line range of it); returns its sha256 for file.patch.

    Args:
        path: workspace-relative file, e.g. "src/app.py".
        startLine: first line to return (1-based).
        endLine: last line to return (inclusive); the end of the file when left out.
        maxBytes: cap on the returned text in bytes; the result says where to continue.
        encoding: how the file's bytes are decoded.
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
        head = handle.read(_SNIFF_BYTES)
        binary = encoding not in ("utf-16",) and b"\0" in head
        if binary:
            return _describe_binary(target.relative, head, handle)
        return _read_text(
            target.relative,
            head,
            handle,
            startLine,
            endLine,
            maxBytes,
            encoding,
            redactor=ctx.kernel.redactor,
        )


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


def _describe_binary(relative: str, head: bytes, handle: Any) -> ToolOutput:
    digest = hashlib.sha256(head)
    size = len(head)
    while chunk := handle.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    media_type = mimetypes.guess_type(relative)[0] or "application/octet-stream"
    data = {
        "path": relative,
        "binary": True,
        "mediaType": media_type,
        "size": size,
        "sha256": HASH_PREFIX + digest.hexdigest(),
    }
    summary = f"{relative} is a binary file ({media_type}, {size} bytes); its content is not shown."
    return ToolOutput(data, summary)


def _lines(head: bytes, handle: Any, encoding: str, digest: Any) -> Iterator[str]:
    """Each line of the file with its ``\n`` (rg's numbering), hashing every byte read.

    A line longer than `_MAX_LINE_CHARS` is cut there so one giant line cannot fill
    memory; the rest of it is hashed and skipped.
    """
    decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
    pending: list[str] = []
    pending_len = 0
    chunk = head
    while True:
        digest.update(chunk)
        pieces = decoder.decode(chunk, final=not chunk).split("\n")
        for index, piece in enumerate(pieces):
            if index > 0:
                yield "".join(pending) + "\n"
                pending, pending_len = [], 0
            if piece and pending_len < _MAX_LINE_CHARS:
                pending.append(piece[: _MAX_LINE_CHARS - pending_len])
                pending_len += len(pending[-1])
        if not chunk:
            break
        chunk = handle.read(_CHUNK)
    if pending:
        yield "".join(pending)


def _read_text(
    relative: str,
    head: bytes,
    handle: Any,
    start: int,
    end: int | None,
    max_bytes: int,
    encoding: str,
    *,
    redactor: Redactor,
) -> ToolOutput:
    digest = hashlib.sha256()
    line_no = 0
    kept: list[str] = []
    kept_bytes = 0
    truncated = False
    last_line = start - 1
    for line_no, line in enumerate(_lines(head, handle, encoding, digest), start=1):
        if line_no < start or (end is not None and line_no > end) or truncated:
            continue
        encoded = line.encode("utf-8")
        if kept_bytes + len(encoded) > max_bytes:
            truncated = True
            if not kept:  # one line longer than the cap: its beginning, not nothing
                kept.append(_beginning(line, encoded, max_bytes, redactor))
                last_line = line_no
            continue
        kept.append(line)
        kept_bytes += len(encoded)
        last_line = line_no
    total_lines = line_no
    data: dict[str, Any] = {
        "path": relative,
        "encoding": encoding,
        "startLine": start,
        "endLine": last_line,
        "totalLines": total_lines,
        "size": handle.tell(),
        "sha256": HASH_PREFIX + digest.hexdigest(),
        "content": "".join(kept),
        "truncated": truncated,
    }
    if truncated:
        data["nextLine"] = last_line + 1
    if start > total_lines:
        summary = f"{relative} has {total_lines} lines; nothing from line {start}."
    elif truncated:
        summary = (
            f"Read lines {start}-{last_line} of {relative} ({total_lines} lines); "
            f"cut at {max_bytes} bytes, continue with startLine={last_line + 1}."
        )
    else:
        summary = f"Read lines {start}-{last_line} of {relative} ({total_lines} lines)."
    return ToolOutput(data, summary)


def _beginning(line: str, encoded: bytes, max_bytes: int, redactor: Redactor) -> str:
    """The first ``max_bytes`` of ``line`` (UTF-8 ``encoded``), no character split, and
    every secret that reaches into them masked.

    A mask longer than the piece of secret it hides can take the text a few bytes past
    the cap; the counts are dropped, since a tool cannot add to its result's notices.
    """
    chars = len(encoded[:max_bytes].decode("utf-8", errors="ignore"))
    return redactor.clip(line, 0, chars, Counter())


def _unreadable(relative: str, exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        return f"'{safe_field(relative, 80)}' cannot be read: a name in it is too long."
    if exc.errno == errno.ELOOP:
        return f"'{relative}' is a symbolic link; read the file it points to instead."
    return f"'{relative}' is not a regular file that can be read."

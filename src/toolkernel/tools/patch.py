"""``file.patch``: change one file by unified diff or exact edits, against a ``baseHash``.

The precondition is the file's sha256 as the model read it (``file.read`` returns it):
if the file holds anything else now, nothing is written and the call is
FAILED/PRECONDITION_FAILED, so a change is never applied to text the model has not
seen. Without ``baseHash`` the file must not exist yet, and is created.

Every hunk or edit is applied in memory first; only a complete result is written,
atomically (temporary file in the same directory, ``fsync``, ``rename``, keeping the
file's mode), through the link-free directory walk of `workspace_io`. Like
``file.read`` it runs in-process: it executes nothing, and the walk gives the
confinement a sandbox would. It works in a worker thread, under the call's timeout:
a call that times out or is cancelled before the new content is renamed into place
leaves the file as it was. Write scope and the idempotency key are the kernel's
(authorization, and the ledger's recorded result).
"""

from __future__ import annotations

import codecs
import difflib
import hashlib
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, Final, TypedDict

from annotated_types import MaxLen

from toolkernel.codes import ErrorCode, safe_message
from toolkernel.context import ToolContext
from toolkernel.definition import ConcurrencyGroup, ExecutionMode, Permissions
from toolkernel.dispatch import ToolOutput
from toolkernel.errors import ToolFailed
from toolkernel.functions import WorkspacePath, tool
from toolkernel.pathguard import GuardedPath, PathGuard
from toolkernel.terminal import printable
from toolkernel.tools.diffs import PatchError, apply_edits, apply_unified_diff, parse_unified_diff
from toolkernel.tools.workspace_io import (
    Checkpoint,
    Encoding,
    Target,
    atomic_write,
    file_hash,
    in_worker,
    locate,
    open_dir,
    open_file,
)
from toolkernel.validation import Violation

__all__ = ["Edit", "check_file_patch", "file_patch"]

MAX_PATCHED_BYTES: Final = 8 * 1024 * 1024
"""Largest file ``file.patch`` rewrites: it holds old and new text in memory."""

_HASH: Final = re.compile(r"sha256:[0-9a-f]{64}")
_NAME: Final = "file.patch"
_NAME_SHOWN: Final = 80  # characters of a header's file name quoted back
_UTF16_MARKS: Final = ((codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))


class Edit(TypedDict):
    """Replace the one occurrence of ``search`` with ``replace``."""

    search: Annotated[str, MaxLen(100_000)]
    replace: Annotated[str, MaxLen(100_000)]


@tool(
    _NAME,
    execution_mode=ExecutionMode.SANDBOX_WRITE,
    permissions=Permissions(read_workspace=True, write_workspace=True),
    mutating=True,
    concurrency_group=ConcurrencyGroup.WORKSPACE_MUTATION,
    timeout_ms=20_000,
    tags=("workspace", "builtin"),
)
async def file_patch(
    ctx: ToolContext,
    path: WorkspacePath,
    baseHash: Annotated[str, MaxLen(71)] | None = None,
    diff: Annotated[str, MaxLen(200_000)] | None = None,
    edits: Annotated[list[Edit], MaxLen(50)] | None = None,
    encoding: Encoding = "utf-8",
) -> ToolOutput:
    """Change a file by a unified diff or by exact search/replace edits.

    Args:
        path: workspace-relative file to change or create.
        baseHash: the sha256 file.read returned for this file ("sha256:<hex>"); leave it
            out only to create a file that does not exist yet.
        diff: a unified diff of this one file (hunks must match exactly).
        edits: search/replace pairs applied in order; each search text must occur
            exactly once. To create a file, use one edit with an empty search.
        encoding: the file's encoding, as given to file.read; the change is written in it.
    """
    arguments = {"path": path, "baseHash": baseHash, "diff": diff, "edits": edits}
    guard = ctx.kernel.guard if ctx.kernel else None
    if (violation := check_file_patch(arguments, guard)) is not None:
        raise ToolFailed(
            safe_message(
                violation.code, tool=_NAME, property=violation.property, **violation.fields
            ),
            code=violation.code,
        )
    target = locate(ctx, path, tool=_NAME)
    change = await in_worker(ctx, partial(_patch, target, baseHash, diff, edits, encoding))
    created = change.current is None
    data: dict[str, Any] = {
        "path": target.relative,
        "created": created,
        "changed": change.changed,
        "sha256": change.new_hash,
        "linesAdded": change.added,
        "linesRemoved": change.removed,
    }
    verb = "Created" if created else ("Patched" if change.changed else "Left unchanged")
    counts = f"+{change.added} -{change.removed}"
    return ToolOutput(data, f"{verb} {target.relative} ({counts}); new {change.new_hash}.")


def check_file_patch(arguments: Mapping[str, Any], guard: PathGuard | None) -> Violation | None:
    """What the schema cannot say about ``file.patch``'s arguments: one kind of change,
    a well-formed ``baseHash``, a diff of the patched file alone (``guard`` normalizes
    ``path``; without it the diff's file names are not compared).

    `toolkernel.tools.install` has the kernel run this in validation, so such a call is
    refused before it starts; the tool checks again when registered without it.
    """
    diff, edits = arguments.get("diff"), arguments.get("edits")
    base_hash = arguments.get("baseHash")
    if (diff is None) == (edits is None):
        return _schema("diff", "give exactly one of 'diff' or 'edits'")
    if base_hash is not None and not (isinstance(base_hash, str) and _HASH.fullmatch(base_hash)):
        return _schema("baseHash", "it must be 'sha256:' followed by 64 lowercase hex digits")
    if not isinstance(diff, str):
        return None
    try:
        _, names = parse_unified_diff(diff)
    except PatchError as exc:
        return _schema("diff", exc.reason)
    except ValueError:  # a line number longer than int() takes; the kernel must not crash
        return _schema("diff", "a hunk header's line numbers are too long")
    checked = guard.check(str(arguments.get("path", ""))) if guard is not None else None
    if not isinstance(checked, GuardedPath):
        return None
    others = sorted(names - {checked.relative})
    if not others:
        return None
    named = ", ".join(f"'{printable(name)[:_NAME_SHOWN]}'" for name in others[:3])
    return _schema(
        "diff",
        f"its file headers name {named}, not the patched path '{printable(checked.relative)}'",
    )


@dataclass(frozen=True, slots=True)
class _Change:
    """A change worked out in memory: the file as read (``None``: absent), its mode,
    its new bytes and their hash, and the lines added and removed."""

    current: bytes | None
    mode: int
    new: bytes
    new_hash: str
    added: int
    removed: int

    @property
    def changed(self) -> bool:
        return self.current is None or self.new != self.current


def _patch(
    target: Target,
    base_hash: str | None,
    diff: str | None,
    edits: list[Edit] | None,
    encoding: str,
    checkpoint: Checkpoint,
) -> _Change:
    """Work out the change and write it (blocking). A call that is over before the new
    content is renamed into place leaves the file as it was."""
    change = _plan(target, base_hash, diff, edits, encoding, checkpoint)
    if change.changed:
        _write(target, change.new, change.mode, expected=change.current, checkpoint=checkpoint)
    return change


def _plan(
    target: Target,
    base_hash: str | None,
    diff: str | None,
    edits: list[Edit] | None,
    encoding: str,
    checkpoint: Checkpoint,
) -> _Change:
    """Read the file, check ``base_hash`` and apply the change in memory (blocking)."""
    current, mode = _read_current(target, binary_ok=encoding == "utf-16")
    _check_precondition(target, current, base_hash)
    checkpoint()
    text = _Text.decode(target.relative, current or b"", encoding)
    old_text = text.body
    try:
        if diff is not None:
            new_text, added, removed = apply_unified_diff(
                old_text, diff, exists=current is not None
            )
        else:
            new_text = apply_edits(old_text, [(e["search"], e["replace"]) for e in edits or []])
            added, removed = _count_changes(old_text, new_text)
    except PatchError as exc:
        detail = f"The change does not apply to '{target.relative}': {exc.reason}."
        raise _precondition(detail) from None
    new_bytes = text.encode(new_text)
    if len(new_bytes) > MAX_PATCHED_BYTES:
        raise ToolFailed(f"The patched '{target.relative}' would be too large to write.")
    return _Change(current, mode, new_bytes, "sha256:" + _sha(new_bytes), added, removed)


@dataclass(frozen=True, slots=True)
class _Text:
    """A file's text as ``file.read`` decoded it for the model, and how to write it back.

    UTF-8 is decoded with ``surrogateescape``: bytes that are not UTF-8 are kept as they
    were, but a file that has any gets no other non-ASCII text added, which would leave
    it in two encodings. UTF-16 is read as ``file.read`` reads it (little-endian without
    a byte-order mark) and written back with the byte order and mark it had. Other
    encodings decode strictly, and text they cannot hold is refused.
    """

    where: str
    body: str
    codec: str
    bom: bytes
    not_utf8: bool

    @classmethod
    def decode(cls, where: str, data: bytes, encoding: str) -> _Text:
        codec, bom = encoding, b""
        if encoding == "utf-16":
            codec = "utf-16-le"
            for mark, order in _UTF16_MARKS:
                if data.startswith(mark):
                    codec, bom = order, mark
                    break
        if codec == "utf-8":
            body = data.decode("utf-8", errors="surrogateescape")
            return cls(where, body, codec, bom, not_utf8=_escaped(body) > 0)
        try:
            body = data[len(bom) :].decode(codec)
        except UnicodeDecodeError as exc:
            byte, offset = exc.object[exc.start], exc.start + len(bom)
            raise _precondition(
                f"'{where}' is not {encoding} text (byte {byte:#04x} at offset {offset})."
            ) from None
        return cls(where, body, codec, bom, not_utf8=False)

    def encode(self, new_text: str) -> bytes:
        if self.codec == "utf-8":
            if self.not_utf8 and _non_ascii(new_text) > _non_ascii(self.body):
                raise _precondition(
                    f"'{self.where}' is not UTF-8 text, and the change adds text that is "
                    "not ASCII; pass the encoding file.read used (for example "
                    '"latin-1"), or keep the change ASCII.'
                )
            return new_text.encode("utf-8", errors="surrogateescape")
        try:
            return self.bom + new_text.encode(self.codec)
        except UnicodeEncodeError as exc:
            char = exc.object[exc.start]
            name = "utf-16" if self.codec.startswith("utf-16") else self.codec
            raise _precondition(
                f"{name} cannot encode {char!r}, which the change adds to '{self.where}'."
            ) from None


def _escaped(text: str) -> int:
    """Characters that stand for bytes ``surrogateescape`` could not decode."""
    return sum(1 for char in text if "\udc80" <= char <= "\udcff")


def _non_ascii(text: str) -> int:
    """Characters outside ASCII that are text (not bytes kept by ``surrogateescape``)."""
    return sum(1 for char in text if char > "\x7f") - _escaped(text)


def _read_current(target: Target, *, binary_ok: bool) -> tuple[bytes | None, int]:
    """The file's bytes (``None`` if it does not exist) and its permission bits. A NUL
    byte marks a binary file, unless ``binary_ok`` (UTF-16 text is full of them)."""
    try:
        with open_dir(target) as dir_fd:
            fd = open_file(dir_fd, target.name)
    except FileNotFoundError:
        return None, 0o644
    except OSError:
        raise ToolFailed(
            f"'{target.relative}' is not a regular file that can be patched.",
            code=ErrorCode.PRECONDITION_FAILED,
        ) from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if info.st_size > MAX_PATCHED_BYTES:
            raise ToolFailed(f"'{target.relative}' is too large for file.patch.")
        data = handle.read(MAX_PATCHED_BYTES + 1)
    if not binary_ok and b"\0" in data[:8192]:
        raise ToolFailed(f"'{target.relative}' is a binary file; file.patch changes text files.")
    return data, stat.S_IMODE(info.st_mode)


def _check_precondition(target: Target, current: bytes | None, base_hash: str | None) -> None:
    where = target.relative
    if current is None and base_hash is not None:
        raise _precondition(f"'{where}' does not exist, so it cannot match baseHash.")
    if current is not None and base_hash is None:
        raise _precondition(f"'{where}' already exists; pass the baseHash file.read returned.")
    if current is not None and "sha256:" + _sha(current) != base_hash:
        raise _precondition(f"'{where}' has changed since it was read (baseHash does not match).")


def _write(
    target: Target, data: bytes, mode: int, *, expected: bytes | None, checkpoint: Checkpoint
) -> None:
    try:
        with open_dir(target, create=expected is None) as dir_fd:
            # Checked again on the very descriptor we write through: the window for a
            # concurrent change is now the rename alone.
            if expected is not None:
                fd = open_file(dir_fd, target.name)
                try:
                    unchanged = file_hash(fd) == "sha256:" + _sha(expected)
                finally:
                    os.close(fd)
                if not unchanged:
                    raise _precondition(f"'{target.relative}' changed while it was being patched.")
            elif _exists(dir_fd, target.name):
                raise _precondition(f"'{target.relative}' was created by someone else meanwhile.")
            atomic_write(dir_fd, target.name, data, mode=mode, checkpoint=checkpoint)
    except OSError as exc:
        raise ToolFailed(
            f"'{target.relative}' could not be written ({exc.strerror or 'I/O error'}); "
            "it is unchanged."
        ) from exc


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _count_changes(old: str, new: str) -> tuple[int, int]:
    added = removed = 0
    # Lines as diffs.py breaks them, at "\n" alone (str.splitlines breaks at form feeds).
    for line in difflib.unified_diff(old.split("\n"), new.split("\n"), lineterm="", n=0):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _precondition(detail: str) -> ToolFailed:
    return ToolFailed(
        safe_message(ErrorCode.PRECONDITION_FAILED, detail=detail),
        code=ErrorCode.PRECONDITION_FAILED,
    )


def _schema(prop: str, rule: str) -> Violation:
    return Violation(ErrorCode.SCHEMA_VIOLATION, prop, {"rule": rule})

"""Opening and replacing workspace files without following links planted after the guard.

The kernel's path guard checked the argument before dispatch; between that check and
the use, a link could be swapped in. So a tool re-resolves the path with the guard and
then walks the *resolved* path one component at a time with ``openat`` and
``O_NOFOLLOW``: the resolved path has no links, so any link met on the walk was
created since, and the walk refuses it (``ELOOP``/``ENOTDIR``) instead of following it
out of the workspace.

Writes are atomic: a temporary file in the target's directory (same directory fd),
``fsync``, ``rename`` over the target, ``fsync`` of the directory. A failure at any
step leaves the old file untouched and no temporary file behind.

The tools' handlers are async, but reading, hashing and diffing a file is blocking
work: `in_worker` runs it in a worker thread, so that the call's timeout and cancel
apply and the event loop (under ``serve``, every other request) is not held up.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Final, Literal, NoReturn, TypeVar

import anyio.to_thread

from toolkernel.cancel import CancellationToken
from toolkernel.codes import ErrorCode, safe_message
from toolkernel.context import ToolContext
from toolkernel.errors import ToolFailed
from toolkernel.pathguard import PathViolation

__all__ = [
    "HASH_PREFIX",
    "Checkpoint",
    "Encoding",
    "Target",
    "atomic_write",
    "file_hash",
    "in_worker",
    "locate",
    "open_dir",
    "open_file",
]

HASH_PREFIX: Final = "sha256:"
Encoding = Literal["utf-8", "utf-16", "latin-1", "cp1252", "ascii"]
"""The encodings ``file.read`` decodes and ``file.patch`` writes in."""
_CHUNK: Final = 1024 * 1024
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_T = TypeVar("_T")


class _Abandoned(Exception):
    """Ends work whose call is over; raised in a thread nobody waits for, so never seen."""


class Checkpoint:
    """Called by blocking work between steps; raises once nobody waits for the work.

    ``commit`` is the last check before a step that cannot be taken back (the rename
    that replaces a file): once it passed, the call waits for the work to end and its
    outcome is the call's, even past the deadline, rather than reporting TIMED_OUT
    for a file it changed.
    """

    def __init__(self, token: CancellationToken) -> None:
        self._token = token
        self._lock = threading.Lock()
        self._over = False
        self.committed = False

    def __call__(self) -> None:
        self._token.raise_if_cancelled()
        if self._over:
            raise _Abandoned

    def commit(self) -> None:
        with self._lock:
            self()
            self.committed = True

    def abandon(self) -> bool:
        """Nobody waits for the work from now, unless it committed: whether it did."""
        with self._lock:
            self._over = True
            return self.committed


@dataclass(frozen=True, slots=True)
class Target:
    """A guarded workspace path: its relative form and its resolved parts."""

    relative: str
    parts: tuple[str, ...]
    workspace: Path

    @property
    def name(self) -> str:
        return self.parts[-1] if self.parts else "."


def locate(ctx: ToolContext, value: str, *, tool: str, prop: str = "path") -> Target:
    """Re-check ``value`` with the kernel's guard; the resolved, link-free target.

    Raises:
        ToolFailed: the guard now refuses the path (it changed since validation).
    """
    if ctx.kernel is None:
        raise ToolFailed(safe_message(ErrorCode.INTERNAL_ERROR, tool=tool))
    guard = ctx.kernel.guard
    checked = guard.check(value)
    if isinstance(checked, PathViolation):
        raise ToolFailed(
            safe_message(checked.code, tool=tool, property=prop, detail=checked.detail),
            code=checked.code,
        )
    resolved = checked.absolute.relative_to(guard.workspace)
    parts = tuple(p for p in PurePosixPath(resolved.as_posix()).parts if p not in ("", "."))
    return Target(checked.relative, parts, guard.workspace)


@contextmanager
def open_dir(target: Target, *, create: bool = False) -> Iterator[int]:
    """A descriptor of the target's parent directory, reached without following links.

    Raises:
        FileNotFoundError: a directory on the way is missing (and ``create`` is off).
        OSError: a link or non-directory was met on the way (ELOOP, ENOTDIR).
    """
    fd = os.open(target.workspace, _DIR_FLAGS)
    try:
        for part in target.parts[:-1]:
            if create:
                with suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def open_file(dir_fd: int, name: str) -> int:
    """Open a regular file for reading without following a link.

    Raises:
        FileNotFoundError: it does not exist.
        IsADirectoryError: it is not a regular file.
        OSError: it is a link (ELOOP) or cannot be opened.
    """
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        # O_NONBLOCK above keeps a FIFO from hanging the open; it is refused here.
        raise IsADirectoryError(errno.EISDIR, "not a regular file")
    os.set_blocking(fd, True)
    return fd


async def in_worker(ctx: ToolContext, work: Callable[[Checkpoint], _T]) -> _T:
    """``work(checkpoint)`` in a worker thread; its result or its exception.

    At the call's deadline or cancel the call ends at once and the thread is
    abandoned: from then on ``checkpoint`` raises in it, so work that calls it between
    chunks stops there instead of running on to the end of a huge file. Work past its
    ``checkpoint.commit()`` is waited for instead: what it changed is the call's result.
    """
    checkpoint = Checkpoint(ctx.token)
    finished = threading.Event()
    ended: list[Callable[[], _T]] = []  # how the work ended, for a wait past the deadline

    def run() -> _T:
        try:
            result = work(checkpoint)
        except BaseException as exc:
            ended.append(partial(_reraise, exc))
            raise
        else:
            ended.append(lambda: result)
            return result
        finally:
            finished.set()

    try:
        return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        if not checkpoint.abandon():
            raise
    with anyio.CancelScope(shield=True):  # the deadline has passed: this wait is short
        await anyio.to_thread.run_sync(finished.wait)
    return ended[0]()


def _reraise(exc: BaseException) -> NoReturn:
    raise exc


def file_hash(fd: int) -> str:
    """``sha256:<hex>`` of everything readable from ``fd``, from its current offset."""
    digest = hashlib.sha256()
    while chunk := os.read(fd, _CHUNK):
        digest.update(chunk)
    return HASH_PREFIX + digest.hexdigest()


def atomic_write(
    dir_fd: int, name: str, data: bytes, *, mode: int, checkpoint: Checkpoint | None = None
) -> None:
    """Replace (or create) ``name`` in ``dir_fd`` with ``data`` in one rename.

    ``checkpoint`` commits once the data is on disk, right before the rename: a call
    that ended meanwhile (`in_worker`) leaves the previous file as it was, and one that
    ends after waits for the rename to be done.

    Raises:
        OSError: the write failed; the previous file (if any) is unchanged.
    """
    tmp = f".{name[:100]}.tk-{secrets.token_hex(6)}.tmp"
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=dir_fd,
    )
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        if checkpoint is not None:
            checkpoint.commit()
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)  # the rename itself survives a crash only once the directory is synced

"""Policy files that a sandboxed process creates where there were none.

A writable sandbox mounts the runtime's configuration file read-only, so nothing in
it can change the policy. A file that does not exist cannot be mounted, though: a
command (``shell.run``) or a workspace-writable MCP server could create
``toolkernel.toml`` in the workspace, and the next runtime started there would read
it as its policy. So whoever runs such a process takes a ``PolicySnapshot`` before
it runs and restores it when it is done: whatever now stands where a file was absent
is removed, whatever its kind (file, directory tree, symlink, FIFO), and even when
the process took away the owner's write permission on the way.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import anyio.to_thread

from toolkernel.calls import ArtifactRef
from toolkernel.codes import ErrorCode
from toolkernel.config import CONFIG_FILENAME
from toolkernel.errors import ToolFailed

__all__ = ["QUARANTINE_DIRNAME", "Planted", "PolicySnapshot", "absent_policy_files"]

QUARANTINE_DIRNAME: Final = "quarantine"  # in the state directory

_log = logging.getLogger(__name__)
_OWNER_RWX = stat.S_IRUSR | stat.S_IWUSR | stat.S_IXUSR


@dataclass(frozen=True, slots=True)
class Planted:
    """What stood where a policy file was absent, and what of it could not be removed."""

    found: tuple[Path, ...] = ()
    left: tuple[Path, ...] = ()
    kept: tuple[Path, ...] = ()  # where what was taken away was moved (quarantine)

    def __bool__(self) -> bool:
        return bool(self.found)

    def violation(
        self,
        who: str,
        workspace: Path,
        *,
        output: object = None,
        artifacts: tuple[ArtifactRef, ...] = (),
    ) -> ToolFailed:
        """The call's result: POLICY_VIOLATION, naming the files by workspace path."""
        names = ", ".join(sorted(p.relative_to(workspace).as_posix() for p in self.found))
        fate = (
            "it could not be undone; fix it before starting toolkernel here again"
            if self.left
            else "it was undone"
        )
        if self.kept:
            fate += " (what stood there was moved to the runtime's quarantine folder)"
        return ToolFailed(
            f"{who} created or changed {names}, the runtime's configuration, which no "
            f"tool may write; {fate}. Do not create or change it.",
            code=ErrorCode.POLICY_VIOLATION,
            output=output,
            artifacts=artifacts,
        )


def absent_policy_files(policy_files: Iterable[Path], workspace: Path) -> tuple[Path, ...]:
    """The policy files in ``workspace`` that do not exist (yet)."""
    return tuple(
        path
        for path in sorted(policy_files)
        if path.is_relative_to(workspace) and not os.path.lexists(path)
    )


@dataclass(frozen=True, slots=True)
class PolicySnapshot:
    """Every policy file of a workspace before a writable command runs: the absent
    ones (``None``) and the content of the existing ones, at any depth (a runtime
    started in a subdirectory reads the ``toolkernel.toml`` there).

    Existing files are mounted read-only, but a command can still move their directory
    aside and put a new one, or a symlink, in its place; ``restore`` undoes that too.
    It acts only through directories it opened without following a symlink, starting
    at ``workspace``: a symlink a process put in the way is removed, never followed, so
    nothing outside the workspace is touched. What it takes away is moved to
    ``quarantine`` when that is on the same file system (a user's own edit made while
    a server runs is not lost), and removed otherwise.
    """

    files: dict[Path, bytes | None]
    links: dict[Path, str] = field(default_factory=dict)  # existing symlinks: their target
    workspace: Path | None = None  # None: each path's own directory is trusted
    quarantine: Path | None = None
    # Existing entries of that name that are no file (a directory, a FIFO): the user's,
    # left as they are while they stay so (no runtime reads one as its policy).
    others: frozenset[Path] = frozenset()

    @classmethod
    def take(
        cls,
        policy_files: Iterable[Path],
        workspace: Path,
        existing: Iterable[Path],
        *,
        quarantine: Path | None = None,
    ) -> PolicySnapshot:
        files: dict[Path, bytes | None] = {
            path: None
            for path in absent_policy_files(policy_files, workspace)
            if _inspect(workspace, path).kind != "diverted"  # under a symlink: not ours
        }
        links: dict[Path, str] = {}
        others: set[Path] = set()
        for path in existing:
            if path.name != CONFIG_FILENAME:
                continue
            seen = _inspect(workspace, path)
            if seen.kind == "link":
                links[path] = seen.target
                # A runtime started there reads what the link points to: that file is
                # a policy file too, when it is the workspace's own.
                with suppress(OSError, RuntimeError):
                    target = path.resolve(strict=True)
                    if target.is_relative_to(workspace) and target not in files:
                        content = _inspect(workspace, target)
                        if content.kind == "file":
                            files[target] = content.content
            elif seen.kind == "file":
                files[path] = seen.content
            elif seen.kind == "other":
                others.add(path)
        return cls(files, links, workspace, quarantine, frozenset(others))

    def restore(self, now: Iterable[Path] = ()) -> Planted:
        """Put every policy file back as it was; ``now`` lists those there now.

        New ones are removed, changed or replaced ones get their content back. Call it
        once the process that could change them is gone, so nothing redoes it. Never
        raises: what cannot be undone is in ``Planted.left`` (and logged as an error).
        """
        changed = [p for p in now if p not in self.files and p not in self.links]
        changed = [
            p for p in changed if not (p in self.others and self._inspect(p).kind == "other")
        ]
        changed += [p for p in (*self.links, *self.files) if self._inspect(p) != self._expected(p)]
        if not changed:
            return Planted()
        found: list[Path] = []
        left: list[Path] = []
        kept: list[Path] = []
        for path in dict.fromkeys(changed):
            _log.warning("restoring %s, which a sandboxed process changed", path)
            found.append(path)
            restored = self._put_back(path, kept)
            if not restored:
                _log.error("could not restore %s, which a sandboxed process changed", path)
                left.append(path)
        return Planted(tuple(found), tuple(left), tuple(kept))

    async def restore_async(self, listing: Callable[[], Iterable[Path]] | None = None) -> Planted:
        """``restore`` in a worker thread (a planted tree can be large), with ``listing``
        giving the policy files there now (without, the snapshot's own are checked)."""
        if listing is None and not self.files:
            return Planted()
        return await anyio.to_thread.run_sync(
            lambda: self.restore(() if listing is None else listing())
        )

    def _root(self, path: Path) -> Path:
        return path.parent if self.workspace is None else self.workspace

    def _inspect(self, path: Path) -> _Seen:
        return _inspect(self._root(path), path)

    def _expected(self, path: Path) -> _Seen:
        """What the snapshot says stands at ``path`` (nothing, for a new one)."""
        if path in self.links:
            return _Seen("link", target=self.links[path])
        content = self.files.get(path)
        return _Seen("absent") if content is None else _Seen("file", content=content)

    def _put_back(self, path: Path, kept: list[Path]) -> bool:
        """Make ``path`` what the snapshot says, through directories opened without
        following symlinks; whether it is so now."""
        content, target = self.files.get(path), self.links.get(path)
        create = content is not None or target is not None
        try:
            with _Parent(self._root(path), path, self._aside(kept), create=create) as parent:
                if parent.fd is None:
                    return not create  # its directory is gone: so is the planted file
                name = path.name
                if not parent.remove(name):
                    return False
                if content is not None:
                    parent.write(name, content)
                elif target is not None:
                    os.symlink(target, name, dir_fd=parent.fd)
        except OSError:
            return False
        return self._inspect(path) == self._expected(path)

    def _aside(self, kept: list[Path]) -> Callable[[int, str, Path], bool]:
        """Moves an entry into the quarantine folder; False when it cannot."""

        def move(dir_fd: int, name: str, path: Path) -> bool:
            quarantine = self.quarantine
            if quarantine is None or not _worth_keeping(dir_fd, name):
                return False
            root = self._root(path)
            label = path.relative_to(root).as_posix() if path.is_relative_to(root) else name
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            destination = quarantine / f"{stamp}-{secrets.token_hex(4)}-{label.replace('/', '__')}"
            try:
                quarantine.mkdir(mode=0o700, parents=True, exist_ok=True)
                # Only into the state directory itself, never where a symlink leads.
                if os.path.realpath(quarantine) != str(quarantine):
                    return False
                if sum(1 for _ in quarantine.iterdir()) >= _QUARANTINE_MAX:
                    return False
                os.rename(name, destination, src_dir_fd=dir_fd)
            except OSError:  # another file system (EXDEV), or no room: removed instead
                return False
            _log.warning("moved what stood at %s to %s", path, destination)
            kept.append(destination)
            return True

        return move


@dataclass(frozen=True, slots=True)
class _Seen:
    """What stands at a path: ``absent``, a ``file`` (its content), a ``link`` (its
    target), ``other`` (a directory, FIFO, …) or ``diverted`` (a directory on the way
    is a symlink or not a directory)."""

    kind: str
    content: bytes | None = None
    target: str = ""


def _inspect(root: Path, path: Path) -> _Seen:
    try:
        with _Parent(root, path, None, create=False) as parent:
            if parent.diverted:
                return _Seen("diverted")
            if parent.fd is None:
                return _Seen("absent")
            return parent.look(path.name)
    except OSError:
        return _Seen("other")


_DIRECTORY_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# What is kept in quarantine: a policy file someone wrote (and symlinks), not a tree
# or a huge file a process planted (those are removed); and not without end.
_QUARANTINE_FILE_MAX: Final = 1 << 20
_QUARANTINE_MAX: Final = 1000


def _worth_keeping(dir_fd: int, name: str) -> bool:
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISLNK(info.st_mode) or (
        stat.S_ISREG(info.st_mode) and info.st_size <= _QUARANTINE_FILE_MAX
    )


class _Parent:
    """The directory holding ``path``, opened from ``root`` one component at a time
    without following symlinks (``fd``; None when a directory is missing). A component
    that is a symlink or not a directory makes it ``diverted``; given ``aside``, such a
    component is taken away (moved aside or removed). With ``create``, missing
    directories are made."""

    def __init__(
        self,
        root: Path,
        path: Path,
        aside: Callable[[int, str, Path], bool] | None,
        *,
        create: bool,
    ) -> None:
        self._root, self._path, self._aside, self._create = root, path, aside, create
        self.fd: int | None = None
        self.diverted = False

    def __enter__(self) -> _Parent:
        fd = os.open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        here = self._root
        for part in self._path.relative_to(self._root).parts[:-1]:
            here = here / part
            try:
                opened = self._open(fd, part, here)
            finally:
                os.close(fd)
            if opened is None:
                return self
            fd = opened
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def _open(self, fd: int, part: str, here: Path) -> int | None:
        for _ in range(3):
            try:
                return os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not self._create:
                    return None
                with suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            except PermissionError:
                _grant_owner_at(fd, part)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                self.diverted = True
                if self._aside is None:  # only looking
                    return None
                _log.warning("removing %s, which a sandboxed process put in place", here)
                if not (self._aside(fd, part, here) or _remove_at(fd, part)):
                    raise
                if not self._create:
                    return None
        raise PermissionError(errno.EACCES, "cannot open the directory", str(here))

    def look(self, name: str) -> _Seen:
        assert self.fd is not None
        try:
            info = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return _Seen("absent")
        if stat.S_ISLNK(info.st_mode):
            return _Seen("link", target=os.readlink(name, dir_fd=self.fd))
        if not stat.S_ISREG(info.st_mode):
            return _Seen("other")
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.fd
        )
        with os.fdopen(fd, "rb") as file:
            return _Seen("file", content=file.read())

    def remove(self, name: str) -> bool:
        """Take away whatever stands at ``name`` (moved aside when it can be)."""
        assert self.fd is not None
        if self.look(name).kind == "absent":
            return True
        path = self._path.parent / name
        if self._aside is not None and self._aside(self.fd, name, path):
            return True
        return _remove_at(self.fd, name)

    def write(self, name: str, content: bytes) -> None:
        assert self.fd is not None
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o644, dir_fd=self.fd)
        with os.fdopen(fd, "wb") as file:
            file.write(content)


def _remove_at(dir_fd: int, name: str) -> bool:
    """Remove ``name`` in the directory ``dir_fd`` (a tree too, never through a
    symlink); on a permission error, give the owner back rwx and retry."""
    for attempt in range(2):
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(name, dir_fd=dir_fd)
            else:
                os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return True
        except OSError:
            if attempt == 0:
                with suppress(OSError):
                    os.fchmod(dir_fd, stat.S_IMODE(os.fstat(dir_fd).st_mode) | _OWNER_RWX)
                _grant_tree_at(dir_fd, name)
                continue
            return False
        return True
    return False


def _grant_owner_at(dir_fd: int, name: str) -> None:
    """Give the owner rwx on the directory ``name`` in ``dir_fd``, never on what a
    symlink put there in the meantime points to: the entry is pinned by an ``O_PATH``
    descriptor, checked to be a directory, and changed through that descriptor."""
    with suppress(OSError):  # best effort: what follows reports the outcome
        pinned = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            info = os.fstat(pinned)
            if stat.S_ISDIR(info.st_mode):
                Path(f"/proc/self/fd/{pinned}").chmod(stat.S_IMODE(info.st_mode) | _OWNER_RWX)
        finally:
            os.close(pinned)


def _grant_tree_at(dir_fd: int, name: str) -> None:
    """Give the owner rwx on the directory ``name`` in ``dir_fd`` and every directory
    in it (not through symlinks): a process can take its own write permission away to
    make removal fail."""
    _grant_owner_at(dir_fd, name)
    try:
        top = os.open(
            name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return
    try:
        # Top-down, by descriptor, never into a symlink: each directory is given its
        # permissions back before fwalk opens (lists) it.
        for _, dirs, _, fd in os.fwalk(".", dir_fd=top):
            for sub in dirs:
                _grant_owner_at(fd, sub)
    finally:
        os.close(top)

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

import logging
import os
import shutil
import stat
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import anyio.to_thread

from toolkernel.calls import ArtifactRef
from toolkernel.codes import ErrorCode
from toolkernel.config import CONFIG_FILENAME
from toolkernel.errors import ToolFailed

__all__ = ["Planted", "PolicySnapshot", "absent_policy_files"]

_log = logging.getLogger(__name__)
_OWNER_RWX = stat.S_IRUSR | stat.S_IWUSR | stat.S_IXUSR


@dataclass(frozen=True, slots=True)
class Planted:
    """What stood where a policy file was absent, and what of it could not be removed."""

    found: tuple[Path, ...] = ()
    left: tuple[Path, ...] = ()

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
    aside and put a new one in its place; ``restore`` undoes that too.
    """

    files: dict[Path, bytes | None]
    links: dict[Path, str] = field(default_factory=dict)  # existing symlinks: their target

    @classmethod
    def take(
        cls, policy_files: Iterable[Path], workspace: Path, existing: Iterable[Path]
    ) -> PolicySnapshot:
        files: dict[Path, bytes | None] = dict.fromkeys(
            absent_policy_files(policy_files, workspace)
        )
        links: dict[Path, str] = {}
        for path in existing:
            if path.name != CONFIG_FILENAME:
                continue
            with suppress(OSError):
                if path.is_symlink():
                    links[path] = str(path.readlink())
                elif path.is_file():
                    files[path] = path.read_bytes()
        return cls(files, links)

    def restore(self, now: Iterable[Path] = ()) -> Planted:
        """Put every policy file back as it was; ``now`` lists those there now.

        New ones are removed, changed or replaced ones get their content back. Call it
        once the process that could change them is gone, so nothing redoes it. Never
        raises: what cannot be undone is in ``Planted.left`` (and logged as an error).
        """
        changed = [p for p in now if p not in self.files and p not in self.links]
        changed += [p for p, target in self.links.items() if _link_target(p) != target]
        for path, content in self.files.items():
            if content is None:
                if os.path.lexists(path):
                    changed.append(path)
            elif path.is_symlink() or not path.is_file() or _read(path) != content:
                changed.append(path)
        if not changed:
            return Planted()
        found, left = [], []
        for path in changed:
            _log.warning("restoring %s, which a sandboxed process changed", path)
            found.append(path)
            removed = not os.path.lexists(path) or _remove(path)
            content = self.files.get(path)
            if removed and content is not None:
                with suppress(OSError):
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(content)
            elif removed and path in self.links:
                with suppress(OSError):
                    path.symlink_to(self.links[path])
            if not removed or (content is not None and _read(path) != content):
                _log.error("could not restore %s, which a sandboxed process changed", path)
                left.append(path)
        return Planted(tuple(found), tuple(left))

    async def restore_async(self, listing: Callable[[], Iterable[Path]] | None = None) -> Planted:
        """``restore`` in a worker thread (a planted tree can be large), with ``listing``
        giving the policy files there now (without, the snapshot's own are checked)."""
        if listing is None and not self.files:
            return Planted()
        return await anyio.to_thread.run_sync(
            lambda: self.restore(() if listing is None else listing())
        )


def _link_target(path: Path) -> str | None:
    try:
        return str(path.readlink())
    except OSError:
        return None


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _remove(path: Path) -> bool:
    """Remove ``path``; on a permission error, give the owner back rwx and retry."""
    for attempt in range(2):
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except FileNotFoundError:
            return True
        except OSError:
            if attempt == 0:
                _restore_owner_access(path)
                continue
            return not os.path.lexists(path)
        return True
    return not os.path.lexists(path)


def _restore_owner_access(path: Path) -> None:
    """Give the owner rwx on ``path``'s directory and, for a tree, on every directory
    in it: a process can take its own write permission away to make removal fail."""
    _grant_owner(path.parent)
    if not path.is_dir() or path.is_symlink():
        return
    _grant_owner(path)
    for root, dirs, _ in os.walk(path):  # top-down: a directory is opened (listed)
        for name in dirs:  # after its parent has given it back its permissions
            sub = Path(root, name)
            if not sub.is_symlink():
                _grant_owner(sub)


def _grant_owner(directory: Path) -> None:
    with suppress(OSError):  # best effort: the removal that follows reports the outcome
        directory.chmod(stat.S_IMODE(directory.lstat().st_mode) | _OWNER_RWX)

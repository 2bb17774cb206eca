"""A pids cgroup per command: the process ceiling where ``RLIMIT_NPROC`` does not bind.

Linux exempts a real uid 0 from ``RLIMIT_NPROC`` whatever its capabilities, so a
command run by root (toolkernel run as root, as in many containers and CI machines)
could fork without bound and exhaust the host's process table. For root, each
command therefore gets a cgroup of its own whose ``pids.max`` is ``max_processes``:
bubblewrap's child joins it before it runs the command, and everything the command
starts is counted there (threads included, as ``RLIMIT_NPROC`` counts them). Where no
pids cgroup can be made, the limit cannot be set and the command is refused (`find`
says why); other users need none.

Both cgroup versions are looked up from ``/proc/self/mountinfo`` and
``/proc/self/cgroup``: v1's ``pids`` hierarchy, or v2's unified one where the pids
controller is enabled for the children of this process's cgroup.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
from pathlib import Path
from typing import Final

import anyio

__all__ = ["PidsCgroup", "needs_pids_cgroup"]

_log = logging.getLogger(__name__)

_MOUNTINFO: Final = Path("/proc/self/mountinfo")
_OWN_CGROUPS: Final = Path("/proc/self/cgroup")


def needs_pids_cgroup() -> bool:
    """Whether ``RLIMIT_NPROC`` cannot hold this process's commands (its real uid is 0)."""
    return os.getuid() == 0


class PidsCgroup:
    """One command's pids cgroup; `create` makes it, `remove` deletes it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, max_processes: int) -> PidsCgroup:
        """A new cgroup below this process's own, holding at most ``max_processes``.

        Raises:
            OSError: no pids cgroup could be made here; its message says why.
        """
        parent = _own_pids_cgroup()
        _sweep(parent)
        path = parent / f"toolkernel-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            path.mkdir(mode=0o755)
        except OSError as exc:
            raise OSError(exc.errno, f"no pids cgroup could be made in {parent}: {exc}") from exc
        cgroup = cls(path)
        limit = path / "pids.max"
        if not limit.exists():  # v2 without the pids controller for our children
            cgroup.remove()
            raise OSError(errno.ENOTSUP, f"the pids controller is not enabled in {parent}")
        try:
            limit.write_text(f"{max_processes}\n")
        except OSError:
            cgroup.remove()
            raise
        return cgroup

    def add(self, pid: int) -> None:
        """Move ``pid`` (and what it starts from now on) into the cgroup.

        Raises:
            ProcessLookupError: ``pid`` is gone.
            OSError: it could not be moved.
        """
        try:
            (self.path / "cgroup.procs").write_text(f"{pid}\n")
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                raise ProcessLookupError(exc.errno, f"process {pid} is gone") from exc
            raise

    async def remove_when_empty(self, wait_s: float = 2.0) -> None:
        """`remove`, once the last process has left: a killed process leaves only when
        it is reaped, a moment after its tree was seen gone."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(wait_s):
            while self._holds_processes():
                await anyio.sleep(0.01)
        self.remove()

    def _holds_processes(self) -> bool:
        try:
            return bool((self.path / "cgroup.procs").read_text().strip())
        except OSError:
            return False

    def remove(self) -> None:
        """Delete the cgroup (once its processes are gone; a survivor keeps it, logged)."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            _log.warning("the pids cgroup %s could not be removed: %s", self.path, exc)


def _sweep(parent: Path) -> None:
    """Remove the empty cgroups of runtimes that are gone (killed mid-command, say):
    named ``toolkernel-PID-…`` after a process that no longer exists."""
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            if not entry.name.startswith("toolkernel-"):
                continue
            pid = entry.name.removeprefix("toolkernel-").partition("-")[0]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):  # not empty, or another sweep's
                    entry.rmdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's
    return True


def _own_pids_cgroup() -> Path:
    """The directory of this process's cgroup in a hierarchy with the pids controller.

    Raises:
        OSError: there is none, or it cannot be read.
    """
    own = _own_paths(_OWN_CGROUPS.read_text())
    for root, mount_point, version in _pids_mounts(_MOUNTINFO.read_text()):
        path = own.get(version)
        if path is None:
            continue
        inside = path.removeprefix(root) if root != "/" and path.startswith(root) else path
        directory = Path(mount_point, inside.lstrip("/"))
        if directory.is_dir():
            return directory
    raise OSError(errno.ENOENT, "no cgroup hierarchy with the pids controller is mounted")


def _own_paths(text: str) -> dict[str, str]:
    """``/proc/self/cgroup`` as ``{"v1": path in the pids hierarchy, "v2": path}``."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":
            found["v2"] = path
        elif "pids" in controllers.split(","):
            found["v1"] = path
    return found


def _pids_mounts(text: str) -> list[tuple[str, str, str]]:
    """``(root, mount point, version)`` of each cgroup mount that can hold pids.max,
    v1's pids hierarchy first."""
    mounts: list[tuple[str, str, str]] = []
    for line in text.splitlines():
        fields, _, after = line.partition(" - ")
        parts, tail = fields.split(), after.split()
        if len(parts) < 5 or len(tail) < 3:
            continue
        root, mount_point = _unescape(parts[3]), _unescape(parts[4])
        kind, options = tail[0], tail[2].split(",")
        if kind == "cgroup" and "pids" in options:
            mounts.insert(0, (root, mount_point, "v1"))
        elif kind == "cgroup2":
            mounts.append((root, mount_point, "v2"))
    return mounts


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes come octal-escaped."""
    with contextlib.suppress(UnicodeDecodeError):
        if "\\" in field:
            return field.encode().decode("unicode_escape").encode("latin-1").decode()
    return field

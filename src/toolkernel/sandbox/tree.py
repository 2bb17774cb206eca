"""Finding and killing every process one command started, without cgroups.

A command's tree is the union of what the kernel lets us see from ``/proc``:

* the leader's descendants by parent pid (this covers a whole bubblewrap PID
  namespace, whose orphans re-parent to the namespace's init, itself a descendant);
* the leader's process group and session (the leader is spawned as a session leader);
* for unsandboxed runs, every process whose environment carries the run's cookie
  variable, which children inherit even after ``setsid`` and a double fork re-parents
  them to the host's init.

Limits, stated honestly: an unsandboxed process that clears its environment *and*
leaves the session *and* is re-parented away escapes all three; only a PID namespace
(the sandboxed path) or a cgroup closes that gap. ``/proc/<pid>/environ`` of another
user's process is unreadable, which cannot matter here because a child runs as us.

Signals go through pidfds, opened after checking the process start time against the
scan, so a recycled pid is never signalled by mistake.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio

__all__ = ["KILL_CONFIRM_S", "POLL_INTERVAL_S", "ProcessTree", "child_with_cookie"]

POLL_INTERVAL_S: Final = 0.005
"""How often a waiting killer rescans ``/proc``: short, because kill latency is budgeted."""

KILL_CONFIRM_S: Final = 5.0
"""How long SIGKILLed processes may take to disappear before we report survivors."""

_DEAD_STATES: Final = frozenset({"Z", "X", "x"})


@dataclass(frozen=True, slots=True)
class _Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    start_ticks: int


def _read_stat(pid: int) -> _Proc | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    rest = raw[raw.rfind(b")") + 2 :].split()
    return _Proc(
        pid=pid,
        ppid=int(rest[1]),
        pgid=int(rest[2]),
        sid=int(rest[3]),
        state=rest[0].decode(),
        start_ticks=int(rest[19]),
    )


def _all_processes() -> Iterator[_Proc]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (proc := _read_stat(int(entry.name))) is not None:
            yield proc


def child_with_cookie(parent: int, cookie: bytes) -> int | None:
    """The child process of ``parent`` whose environment holds ``cookie``
    (``NAME=value``), if there is one: a process just spawned with it."""
    for proc in _all_processes():
        if proc.ppid == parent and _has_cookie(proc.pid, cookie):
            return proc.pid
    return None


def _has_cookie(pid: int, cookie: bytes) -> bool:
    try:
        return cookie in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


class ProcessTree:
    """The live processes belonging to one spawned command.

    Args:
        leader: Pid of the spawned process; it must have been started as a session
            leader (``start_new_session=True``), so its pid is also its group and
            session id.
        cookie: ``NAME=value`` environment entry unique to this run, for finding
            descendants that left the session; ``None`` when a PID namespace already
            contains the tree.
    """

    def __init__(self, leader: int, *, cookie: bytes | None = None) -> None:
        self.leader = leader
        self._cookie = cookie
        self._me = os.getpid()
        # Only processes started after the leader can carry its cookie: reading
        # environ for those alone keeps a scan cheap on a busy host.
        stat = _read_stat(leader)
        self._since = stat.start_ticks if stat is not None else 0

    def members(self) -> list[_Proc]:
        """Scan ``/proc`` for the tree's processes that are still running (not zombies)."""
        table = [p for p in _all_processes() if p.state not in _DEAD_STATES and p.pid != self._me]
        children: dict[int, list[_Proc]] = {}
        for proc in table:
            children.setdefault(proc.ppid, []).append(proc)
        found: dict[int, _Proc] = {}
        for proc in table:
            in_session = proc.pid == self.leader or self.leader in (proc.pgid, proc.sid)
            if in_session or (
                self._cookie is not None
                and proc.start_ticks >= self._since
                and _has_cookie(proc.pid, self._cookie)
            ):
                found[proc.pid] = proc
        stack = list(found.values())
        while stack:
            for child in children.get(stack.pop().pid, ()):
                if child.pid not in found:
                    found[child.pid] = child
                    stack.append(child)
        return list(found.values())

    def send(
        self, sig: int, *, spare: Collection[int] = (), members: list[_Proc] | None = None
    ) -> int:
        """Signal every member (from a fresh scan unless given) except ``spare``.

        Returns:
            How many processes were signalled.
        """
        sent = 0
        for proc in self.members() if members is None else members:
            if proc.pid not in spare and _signal_exact(proc, sig):
                sent += 1
        return sent

    async def kill(self, *, grace_s: float, spare_from_term: Collection[int] = ()) -> bool:
        """SIGTERM the tree, wait up to ``grace_s`` for it to go, then SIGKILL what is left.

        Args:
            grace_s: Seconds between SIGTERM and SIGKILL; 0 sends SIGKILL at once.
            spare_from_term: Pids that get no SIGTERM, only the final SIGKILL (the
                outer bubblewrap process, whose death would skip the grace period).

        Returns:
            True when no member is left, False if some survived ``KILL_CONFIRM_S``
            of repeated SIGKILLs.
        """
        members = self.members()
        if not members:
            return True
        if grace_s > 0:
            await self._terminate(members, grace_s, spare_from_term)
        # Each round kills everything seen; a child forked between scan and signal
        # is caught by the next round, and a killed process cannot fork again.
        deadline = time.monotonic() + KILL_CONFIRM_S
        while self.send(signal.SIGKILL):
            if time.monotonic() > deadline:
                return False
            await anyio.sleep(POLL_INTERVAL_S)
        return True

    async def _terminate(
        self, members: list[_Proc], grace_s: float, spare: Collection[int]
    ) -> None:
        # A process forked between a scan and the signal would miss SIGTERM and
        # sit out the whole grace period: newcomers get their SIGTERM on each rescan.
        signalled: set[tuple[int, int]] = set()
        with anyio.move_on_after(grace_s):
            while members:
                fresh = [p for p in members if (p.pid, p.start_ticks) not in signalled]
                self.send(signal.SIGTERM, spare=spare, members=fresh)
                signalled.update((p.pid, p.start_ticks) for p in fresh)
                await anyio.sleep(POLL_INTERVAL_S)
                members = self.members()


def _signal_exact(proc: _Proc, sig: int) -> bool:
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:
        return False
    try:
        # The pidfd pins one process; if the pid was recycled after the scan, the
        # start time differs and the newcomer is left alone.
        current = _read_stat(proc.pid)
        if current is None or current.start_ticks != proc.start_ticks:
            return False
        signal.pidfd_send_signal(pidfd, sig)
    except OSError:
        return False
    finally:
        os.close(pidfd)
    return True

"""Running one command, sandboxed or not, to completion, timeout or cancellation.

Shutdown escalation, whatever stopped the command (timeout, ``cancel``, or the
caller's own cancellation):

1. SIGTERM to every process of the tree (see `ProcessTree`) except the outer
   bubblewrap process, whose death would end the sandbox before the grace period;
2. up to ``TERM_GRACE_S`` for the tree to go (a sandbox goes as soon as its main
   command exits: bubblewrap's init then exits and the kernel kills the whole PID
   namespace, including grandchildren that ignore SIGTERM or called ``setsid``);
3. SIGKILL to everything left, repeated until ``/proc`` shows nothing of the tree.

The caller's own cancellation skips the grace period: it is a shutdown, not a
courtesy. After a normal exit the same sweep removes any background process the
command left behind, so a finished call never leaves an orphan.

Resource limits of a sandboxed command are set inside the sandbox: bubblewrap
reports its child once that has entered the new namespaces (``--json-status-fd``),
and the child waits on ``--block-fd`` after its mounts, before it starts the
command; in that window ``prlimit(2)`` gives it the limits, which the command
inherits from its first instruction, with no ``preexec_fn`` (unsafe with threads)
and nothing of the command running yet that a fork could outrun them with. Set
there, ``RLIMIT_NPROC`` counts the tasks of the sandbox's own user namespace (Linux
5.14 and newer): set on bubblewrap itself, it would also be checked against every
task the user runs, and a user with a few hundred threads elsewhere could not start
a sandbox at all. An unsandboxed command runs under util-linux ``prlimit`` (or,
where it is missing, a tiny Python trampoline) that then ``exec``s it.

A sandbox that never ran the command is not reported as the command's exit status:
bubblewrap reports ``exit-code`` only for a command it executed, so its own failure
(namespaces refused, a mount it could not make, limits that could not be set) is
`SandboxUnavailable`, with bubblewrap's message in ``reason``. A program that does
not exist or cannot be executed is the command's failure, with the exit status a
shell gives it, sandboxed or not: 127 (not found) or 126.

Output is streamed to two owner-only files, ``stdout`` and ``stderr``, in
``output_dir`` while the command runs; memory stays bounded by one read chunk.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import resource
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, Final

import anyio
import anyio.abc

from toolkernel.errors import SandboxUnavailable
from toolkernel.sandbox.bwrap import bwrap_argv
from toolkernel.sandbox.pids import PidsCgroup, needs_pids_cgroup
from toolkernel.sandbox.spec import SandboxLimits, SandboxSpec
from toolkernel.sandbox.tree import POLL_INTERVAL_S, ProcessTree

__all__ = [
    "COOKIE_VARIABLE",
    "DRAIN_TIMEOUT_S",
    "READ_CHUNK_BYTES",
    "TERM_GRACE_S",
    "OutputCallback",
    "ProcessOutcome",
    "RunningCallback",
    "run_sandboxed",
]

TERM_GRACE_S: Final = 2.0
"""Seconds between SIGTERM and SIGKILL: time for a test runner to flush its report."""

DRAIN_TIMEOUT_S: Final = 2.0
"""After the tree is dead, how long its pipes may take to report end-of-file."""

READ_CHUNK_BYTES: Final = 256 * 1024
"""Largest single read from a pipe: the bound on output held in memory per stream."""

COOKIE_VARIABLE: Final = "TOOLKERNEL_PROCESS_COOKIE"
"""Added to an unsandboxed command's environment so its escaped descendants can be found."""

OutputCallback = Callable[[bytes], None]
"""Receives each chunk of output as it is stored (stdout and stderr, in arrival order)."""

RunningCallback = Callable[[float, int], None]
"""Hears, every ``running_interval_s`` while a command runs, the seconds since it was
spawned and the bytes it has written to both streams so far."""

_log = logging.getLogger(__name__)

# Unsandboxed runs where util-linux prlimit is missing, or that must join a pids cgroup
# first: join it, set the limits, become the command. Arguments: NAME VALUE pairs
# (RLIMIT_* names, or "cgroup" and its cgroup.procs file), "--", the command.
_TRAMPOLINE: Final = """\
import os, resource, sys
args = sys.argv[1:]
split = args.index("--")
pairs = dict(zip(args[:split:2], args[1:split:2]))
procs = pairs.pop("cgroup", None)
if procs is not None:
    try:
        with open(procs, "w") as handle:
            handle.write(str(os.getpid()))
    except OSError as exc:
        sys.exit(f"toolkernel: the command could not join its pids cgroup: {exc}")
for name, value in pairs.items():
    resource.setrlimit(getattr(resource, name), (int(value),) * 2)
try:
    os.execvp(args[split + 1], args[split + 1 :])
except OSError as exc:
    print(f"toolkernel: cannot execute {args[split + 1]}: {exc.strerror}", file=sys.stderr)
    sys.exit(127 if isinstance(exc, FileNotFoundError) else 126)
"""

# bubblewrap's message when a sandbox never ran its command is short; more is not its.
_MESSAGE_BYTES: Final = 4096

# A setuid bubblewrap's child drops root microseconds after it is reported.
_SWITCH_TIMEOUT_S: Final = 1.0


class _Stop(StrEnum):
    TIMEOUT = "timeout"
    CANCEL = "cancel"
    UNLIMITED = "unlimited"  # the limits could not be set: the command was never let run


@dataclass(frozen=True)
class ProcessOutcome:
    """How a command ended and where its output is.

    Attributes:
        exit_code: The exit status, or ``None`` if the process we spawned was killed
            by a signal. A sandboxed command killed by signal N shows as ``128 + N``:
            bubblewrap reports it like a shell does.
        signal: The signal that killed the spawned process, if any.
        timed_out: ``timeout_s`` passed and the tree was killed.
        cancelled: ``cancel`` was set and the tree was killed.
        stdout_path: File holding the stored standard output.
        stderr_path: File holding the stored standard error.
        output_bytes: Bytes the command wrote to both streams, stored or not.
        truncated: Output passed ``max_output_bytes``; the rest was discarded.
        duration_s: Wall time from spawn until the tree was gone.
        sandboxed: False when the command ran without bubblewrap (an explicit opt-in
            the caller must record).
    """

    exit_code: int | None
    signal: int | None
    timed_out: bool
    cancelled: bool
    stdout_path: Path
    stderr_path: Path
    output_bytes: int
    truncated: bool
    duration_s: float
    sandboxed: bool = True


async def run_sandboxed(
    argv: Sequence[str],
    spec: SandboxSpec,
    *,
    bwrap: Path,
    timeout_s: float,
    output_dir: Path,
    cancel: anyio.Event | None = None,
    on_output: OutputCallback | None = None,
    unsandboxed: bool = False,
    term_grace_s: float = TERM_GRACE_S,
    on_running: RunningCallback | None = None,
    running_interval_s: float = 5.0,
) -> ProcessOutcome:
    """Run ``argv`` in a bubblewrap sandbox and wait until it and all its children are gone.

    Args:
        argv: The program and its arguments; never a shell string.
        spec: Filesystem, network, environment and limits of the run.
        bwrap: The bubblewrap binary (from `find_bwrap`, checked by `probe`).
        timeout_s: Wall-clock limit; the tree is killed when it passes.
        output_dir: Directory for the ``stdout`` and ``stderr`` files; created if
            missing, and must not already hold them.
        cancel: Setting it kills the tree; the outcome is marked cancelled.
        on_output: Called with each stored chunk of stdout, as it comes (on the
            event loop), for live progress or for reading the output as it is written.
        unsandboxed: Run without bubblewrap, only with process-group isolation, the
            environment allow-list and the limits. Only for configurations that
            opted in explicitly.
        term_grace_s: Seconds between SIGTERM and SIGKILL.
        on_running: Called every ``running_interval_s`` until the command ends (on
            the event loop), for a heartbeat that shows a long command still runs.
            What it raises is logged, and the command goes on.

    Returns:
        The outcome; output captured before a timeout or cancellation is kept.

    Raises:
        FileExistsError: if ``output_dir`` already holds output files.
        SandboxUnavailable: the sandbox never ran the command: bubblewrap could not
            set it up (its message is the ``reason``), or the limits could not be
            set in it. Its output files are removed.
    """
    if not argv:
        raise ValueError("argv must name a program")
    cookie = f"{COOKIE_VARIABLE}={secrets.token_hex(16)}" if unsandboxed else None
    env = dict(spec.env)
    if cookie is not None:
        env[COOKIE_VARIABLE] = cookie.partition("=")[2]
    async with contextlib.AsyncExitStack() as stack:
        cgroup = _pids_cgroup(spec.limits) if needs_pids_cgroup() else None
        if cgroup is not None:
            stack.push_async_callback(cgroup.remove_when_empty)
        gate = None if unsandboxed else stack.enter_context(_Gate())
        if gate is None:
            command = _with_limits(list(argv), spec.limits, cgroup)
        else:
            command = bwrap_argv(
                argv, spec, bwrap=bwrap, status_fd=gate.status_fd, block_fd=gate.block_fd
            )
        created = not output_dir.exists()
        output_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        started = time.monotonic()
        sink = stack.enter_context(_OutputSink(output_dir, spec.limits.max_output_bytes, on_output))
        process = await anyio.open_process(
            command,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=spec.cwd_path() if unsandboxed else None,
            start_new_session=True,
            pass_fds=gate.inherited if gate is not None else (),
        )
        # Closed on every path: a pipe transport left open is reported at exit.
        async with process:
            start = None
            if gate is not None:
                gate.spawned()
                start = partial(gate.release, spec.limits, cgroup)
            tree = ProcessTree(process.pid, cookie=cookie.encode() if cookie else None)
            # The outer bubblewrap gets no SIGTERM: its death would skip the grace period.
            spare = () if unsandboxed else (process.pid,)
            heartbeat = (
                None
                if on_running is None
                else partial(_heartbeat, on_running, running_interval_s, started, sink)
            )
            stop = await _supervise(
                process, tree, sink, timeout_s, cancel, term_grace_s, spare, start, heartbeat
            )
        # _supervise returns only after the process was reaped.
        status = process.returncode if process.returncode is not None else 0
        failure = None
        if gate is not None:
            status, failure = _sandbox_ending(gate, stop, status, sink, argv[0])
    if failure is not None:
        _discard(sink, output_dir if created else None)
        raise SandboxUnavailable(failure)
    return ProcessOutcome(
        exit_code=status if status >= 0 else None,
        signal=-status if status < 0 else None,
        timed_out=stop is _Stop.TIMEOUT,
        cancelled=stop is _Stop.CANCEL,
        stdout_path=sink.stdout_path,
        stderr_path=sink.stderr_path,
        output_bytes=sink.produced,
        truncated=sink.truncated,
        duration_s=time.monotonic() - started,
        sandboxed=not unsandboxed,
    )


async def _runs_as_us(pid: int) -> bool:
    """Wait until ``pid`` runs as this process's user (only then may its limits be
    set), or is gone. A setuid-root bubblewrap reports its child while that still
    runs as root, and lets it drop root right after."""
    with anyio.move_on_after(_SWITCH_TIMEOUT_S):
        while (uids := _real_effective_saved_uids(pid)) is not None and uids != {os.getuid()}:
            await anyio.sleep(POLL_INTERVAL_S)
        return True
    return False


def _real_effective_saved_uids(pid: int) -> set[int] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    line = next((line for line in status.splitlines() if line.startswith("Uid:")), "")
    return {int(uid) for uid in line.split()[1:4]} or None


def _sandbox_ending(
    gate: _Gate, stop: _Stop | None, status: int, sink: _OutputSink, program: str
) -> tuple[int, str | None]:
    """The command's exit status, and why the sandbox ran no command (``None`` when it
    ran one or was stopped).

    A program that could not be executed (not found, not executable) is the
    command's own failure, which bubblewrap reports as exit status 1: it gets the
    status a shell (and ``prlimit``, unsandboxed) gives it, 127 for a program not
    found and 126 for one that cannot be executed.
    """
    if stop is _Stop.UNLIMITED:
        return status, gate.problem
    if stop is not None or status < 0 or gate.command_ran():
        return status, None
    with sink.stderr_path.open("rb") as handle:
        message = handle.read(_MESSAGE_BYTES).decode(errors="replace").strip()
    if message.startswith(f"bwrap: execvp {program}: "):
        reason = message.removeprefix(f"bwrap: execvp {program}: ")
        return (127 if reason == os.strerror(errno.ENOENT) else 126), None
    return status, f"bubblewrap ran no command (exit status {status}): {message or 'no message'}"


def _discard(sink: _OutputSink, directory: Path | None) -> None:
    for path in (sink.stdout_path, sink.stderr_path):
        path.unlink(missing_ok=True)
    if directory is not None:
        with contextlib.suppress(OSError):
            directory.rmdir()


class _Gate:
    """How a sandbox starts: where bubblewrap reports, and what holds its child.

    bubblewrap writes ``{"child-pid": N, …}`` to the status pipe once it has cloned
    the sandbox's first process into the new namespaces, and ``{"exit-code": N}``
    only for a command it executed. That child reads one byte from the block pipe
    after its mounts and before it starts the command: until the byte is written,
    nothing of the command runs, and limits set on the child hold for all of it.
    """

    def __init__(self) -> None:
        self._open: list[int] = []
        try:
            self._status, self.status_fd = self._pipe()
            self.block_fd, self._unblock = self._pipe()
        except BaseException:
            self.__exit__()
            raise
        os.set_blocking(self._status, False)
        self._received = b""
        self.problem = ""

    def __enter__(self) -> _Gate:
        return self

    def __exit__(self, *exc_info: object) -> None:
        while self._open:
            os.close(self._open.pop())

    @property
    def inherited(self) -> tuple[int, int]:
        """The descriptors bubblewrap must be given."""
        return (self.status_fd, self.block_fd)

    def spawned(self) -> None:
        """Close bubblewrap's ends here, so that its exit ends the status stream."""
        self._close(self.status_fd)
        self._close(self.block_fd)

    async def release(self, limits: SandboxLimits, cgroup: PidsCgroup | None = None) -> bool:
        """Wait for bubblewrap's child, set ``limits`` on it (moving it into ``cgroup``,
        where its process ceiling is kept), and let it run the command.

        Returns:
            False when the limits could not be set (``problem`` says why): the command
            must not run. True also when bubblewrap failed before or during its
            setup, which its exit shows.
        """
        line = await self._next_line()
        if line is None:
            return True
        try:
            child = int(json.loads(line)["child-pid"])
        except (ValueError, KeyError, TypeError):
            self.problem = f"bubblewrap reported no sandbox process: {line[:200]!r}"
            return False
        if not await _runs_as_us(child):
            self.problem = "bubblewrap's child kept another user's identity: no limits set"
            return False
        for name, value in _limit_values(limits).items():
            try:
                resource.prlimit(child, getattr(resource, name), (value, value))
            except ProcessLookupError:
                return True
            except (OSError, ValueError, OverflowError) as exc:
                self.problem = f"{name} = {value} could not be set in the sandbox: {exc}"
                return False
        if cgroup is not None:
            try:
                cgroup.add(child)
            except ProcessLookupError:
                return True
            except OSError as exc:
                self.problem = f"the sandbox could not join its pids cgroup: {exc}"
                return False
        with contextlib.suppress(BrokenPipeError):  # the child is gone: its exit says why
            os.write(self._unblock, b"\n")
        self._close(self._unblock)
        return True

    def command_ran(self) -> bool:
        """Once bubblewrap has exited: whether it executed the command."""
        with contextlib.suppress(BlockingIOError):  # only a leaked writer could leave it open
            while chunk := os.read(self._status, 4096):
                self._received += chunk
        return any(b'"exit-code"' in line for line in self._received.splitlines())

    async def _next_line(self) -> bytes | None:
        while b"\n" not in self._received:
            await anyio.wait_readable(self._status)
            try:
                chunk = os.read(self._status, 4096)
            except BlockingIOError:
                continue
            if not chunk:
                return None
            self._received += chunk
        line, _, self._received = self._received.partition(b"\n")
        return line

    def _pipe(self) -> tuple[int, int]:
        read, write = os.pipe()
        self._open += (read, write)
        return read, write

    def _close(self, fd: int) -> None:
        if fd in self._open:
            self._open.remove(fd)
            os.close(fd)


async def _supervise(
    process: anyio.abc.Process,
    tree: ProcessTree,
    sink: _OutputSink,
    timeout_s: float,
    cancel: anyio.Event | None,
    term_grace_s: float,
    spare_from_term: tuple[int, ...],
    start: Callable[[], Awaitable[bool]] | None,
    heartbeat: Callable[[], Coroutine[Any, Any, None]] | None = None,
) -> _Stop | None:
    assert process.stdout is not None  # open_process pipes both by default
    assert process.stderr is not None
    drained = _Countdown(2)
    tree_gone = False
    try:
        async with anyio.create_task_group() as pumps:
            pumps.start_soon(_pump, process.stdout, sink.write_stdout, drained)
            pumps.start_soon(_pump, process.stderr, sink.write_stderr, drained)
            stop = await _wait_for_exit(process, timeout_s, cancel, start, heartbeat)
            await _kill(tree, process, grace_s=term_grace_s, spare_from_term=spare_from_term)
            tree_gone = True
            with anyio.move_on_after(DRAIN_TIMEOUT_S):
                await drained.wait()
            # A pipe still open here is held by a process we could not see (see
            # ProcessTree's limits); its output is abandoned, not waited for.
            pumps.cancel_scope.cancel()
    finally:
        if not tree_gone:
            with anyio.CancelScope(shield=True):
                await _kill(tree, process, grace_s=0, spare_from_term=())
    return stop


async def _kill(
    tree: ProcessTree,
    process: anyio.abc.Process,
    *,
    grace_s: float,
    spare_from_term: tuple[int, ...],
) -> None:
    if not await tree.kill(grace_s=grace_s, spare_from_term=spare_from_term):
        _log.warning("processes of pid %d survived SIGKILL", process.pid)
    await process.wait()


async def _wait_for_exit(
    process: anyio.abc.Process,
    timeout_s: float,
    cancel: anyio.Event | None,
    start: Callable[[], Awaitable[bool]] | None,
    heartbeat: Callable[[], Coroutine[Any, Any, None]] | None,
) -> _Stop | None:
    stop: _Stop | None = None

    async def watch_cancel(event: anyio.Event, scope: anyio.CancelScope) -> None:
        nonlocal stop
        await event.wait()
        stop = _Stop.CANCEL
        scope.cancel()

    async with anyio.create_task_group() as watchers:
        if cancel is not None:
            watchers.start_soon(watch_cancel, cancel, watchers.cancel_scope)
        if heartbeat is not None:
            watchers.start_soon(heartbeat)
        with anyio.move_on_after(timeout_s) as deadline:
            if start is not None and not await start():
                stop = _Stop.UNLIMITED
            else:
                await process.wait()
        if deadline.cancelled_caught and stop is None:
            stop = _Stop.TIMEOUT
        watchers.cancel_scope.cancel()
    return stop


async def _heartbeat(
    on_running: RunningCallback, interval_s: float, started: float, sink: _OutputSink
) -> None:
    """Tell ``on_running`` every ``interval_s`` that the command still runs (until
    cancelled: the command has ended)."""
    while True:
        await anyio.sleep(interval_s)
        try:
            on_running(time.monotonic() - started, sink.produced)
        except Exception:  # noqa: BLE001 - a listener's failure must not stop the command
            _log.exception("the running-command listener failed")


class _Countdown:
    def __init__(self, count: int) -> None:
        self._count = count
        self._done = anyio.Event()

    def tick(self) -> None:
        self._count -= 1
        if self._count == 0:
            self._done.set()

    async def wait(self) -> None:
        await self._done.wait()


async def _pump(
    stream: anyio.abc.ByteReceiveStream, write: Callable[[bytes], None], done: _Countdown
) -> None:
    try:
        while True:
            try:
                chunk = await stream.receive(READ_CHUNK_BYTES)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return
            write(chunk)
    finally:
        done.tick()


class _OutputSink:
    """Two capped output files; past the cap, bytes are counted and dropped."""

    def __init__(self, directory: Path, cap: int, on_output: OutputCallback | None) -> None:
        self.stdout_path = directory / "stdout"
        self.stderr_path = directory / "stderr"
        self.produced = 0
        self.stored = 0
        self.truncated = False
        self._cap = cap
        self._on_output = on_output
        self._stdout = _create_private(self.stdout_path)
        try:
            self._stderr = _create_private(self.stderr_path)
        except BaseException:
            self._stdout.close()
            raise

    def __enter__(self) -> _OutputSink:
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._stdout.close()
        finally:
            self._stderr.close()

    def write_stdout(self, chunk: bytes) -> None:
        self._store(self._stdout, chunk, self._on_output)

    def write_stderr(self, chunk: bytes) -> None:
        self._store(self._stderr, chunk, None)

    def _store(self, file: BinaryIO, chunk: bytes, on_output: OutputCallback | None) -> None:
        self.produced += len(chunk)
        kept = chunk[: max(0, self._cap - self.stored)]
        if len(kept) < len(chunk):
            self.truncated = True
        if kept:
            # A blocking write of one chunk to the page cache costs microseconds,
            # less than handing it to a worker thread would.
            file.write(kept)
            self.stored += len(kept)
            if on_output is not None:
                on_output(kept)


def _create_private(path: Path) -> BinaryIO:
    # Output may hold secrets: owner-only from the first byte, and never over an
    # earlier run's files.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "wb", buffering=0)


def _pids_cgroup(limits: SandboxLimits) -> PidsCgroup:
    """The cgroup that holds a root command's process ceiling.

    Raises:
        SandboxUnavailable: none can be made here: the command must not run unbounded.
    """
    try:
        return PidsCgroup.create(limits.max_processes)
    except OSError as exc:
        raise SandboxUnavailable(
            f"max_processes = {limits.max_processes} cannot be set: commands run as root, "
            f"whom RLIMIT_NPROC does not bind, and {exc}; run toolkernel "
            "as an unprivileged user, or where it can create a pids cgroup"
        ) from exc


def _limit_values(limits: SandboxLimits) -> dict[str, int]:
    return {
        "RLIMIT_CPU": limits.cpu_seconds,
        "RLIMIT_AS": limits.memory_bytes,
        "RLIMIT_NPROC": limits.max_processes,
        "RLIMIT_FSIZE": limits.file_size_bytes,
        "RLIMIT_CORE": 0,
    }


def _with_limits(command: list[str], limits: SandboxLimits, cgroup: PidsCgroup | None) -> list[str]:
    """``command`` under the limits, for an unsandboxed run (no namespace to set them in);
    in ``cgroup`` from its first instruction, when one holds its process ceiling."""
    values: dict[str, object] = dict(_limit_values(limits))
    prlimit = shutil.which("prlimit")
    if prlimit is not None:
        flags = [f"--{name[7:].lower()}={value}" for name, value in values.items()]
        limited = [prlimit, *flags, "--", *command]
        if cgroup is None:
            return limited
        # The shell joins the cgroup, then becomes prlimit, which becomes the command:
        # a millisecond, where the trampoline's interpreter takes some fifteen.
        procs = str(cgroup.path / "cgroup.procs")
        return ["/bin/sh", "-c", _JOIN_THEN_RUN, procs, *limited]
    if cgroup is not None:
        values["cgroup"] = cgroup.path / "cgroup.procs"
    pairs = [str(item) for pair in values.items() for item in pair]
    return [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, *pairs, "--", *command]


# $0 is the cgroup.procs file, "$@" the command: it runs only once the shell has joined.
_JOIN_THEN_RUN: Final = 'echo "$$" > "$0" && exec "$@"'

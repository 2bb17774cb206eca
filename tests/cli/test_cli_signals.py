"""A one-shot command stopped by SIGTERM or SIGHUP (a service manager, a closed
terminal) ends as Ctrl-C ends it: the call in flight is cancelled and recorded, what
it started is stopped, and the command says so, instead of dying mid-call."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolkernel.ledger import EventType, SqliteLedger

CONFIG = """
[run]
state = "EDITING"
profile = "developer"
[[exposure]]
tools = ["*"]
"""


def running_sleep(workspace: Path, sleep: str) -> subprocess.Popen[str]:
    """`toolkernel call shell.run` of a command that writes a mark, then sleeps."""
    (workspace / "toolkernel.toml").write_text(CONFIG)
    args = json.dumps({"argv": ["sh", "-c", f"echo started > mark.txt; {sleep}"]})
    argv = [sys.executable, "-m", "toolkernel", "call", "shell.run", "--args", args]
    process = subprocess.Popen(
        [*argv, "--approve", "--workspace", str(workspace)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (workspace / "mark.txt").exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    return process


def running(command: str) -> list[str]:
    """Pids of processes whose command line is ``command``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # not a process, or gone
        if b" ".join(argv).strip() == command.encode():
            found.append(entry.name)
    return found


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_call_is_recorded_cancelled_and_its_command_stopped(
    tmp_path: Path, signum: signal.Signals
) -> None:
    sleep = f"sleep 60.{signum:d}{time.monotonic_ns() % 10**6:06d}"  # found by pgrep
    process = running_sleep(tmp_path, sleep)

    process.send_signal(signum)
    with process:
        _, err = process.communicate(timeout=60)

    assert process.returncode == 128 + signum
    assert err.strip().endswith(f"Stopped by {signum.name}.")
    assert "Traceback" not in err
    with SqliteLedger(tmp_path / ".toolkernel" / "ledger.db", read_only=True) as ledger:
        report = ledger.verify()
        [run] = ledger.runs()
        [result] = [e for e in ledger.events(run.run_id) if e.type is EventType.TOOL_CALL_RESULT]
    assert report.ok
    assert report.unfinished == []
    assert result.payload["result"]["status"] == "CANCELLED"
    # The process was stopped, nobody cancelled the call: repeating it may work.
    assert result.payload["result"]["errorCode"] == "RUNTIME_STOPPED"
    assert result.payload["result"]["retryable"] is True
    assert running(sleep) == []


def test_a_stop_is_forgotten_once_its_command_has_ended() -> None:
    """A program that runs the CLI again (or embeds the kernel after it) records its
    later Ctrl-C as the user's, not as a stop of the process."""
    from toolkernel.cli import _stopped_like_ctrl_c
    from toolkernel.errors import ProcessStopped

    with pytest.raises(ProcessStopped), _stopped_like_ctrl_c():
        signal.raise_signal(signal.SIGTERM)
    assert ProcessStopped.underway is False

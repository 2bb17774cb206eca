"""One idempotency key, two `toolkernel call` processes on one ledger: the command runs
once. The second, while the first runs, is told to repeat later; repeated, it gets the
first one's result."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

CONFIG = """
[run]
state = "EDITING"
profile = "developer"
[[exposure]]
tools = ["*"]
"""
ARGS = json.dumps({"argv": ["sh", "-c", "echo ran >> log.txt; sleep 3; echo done"]})


def call(workspace: Path, run: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "toolkernel", "call", "shell.run", "--args", ARGS]
    argv += ["--idempotency-key", "deploy-1", "--approve", "--run", run]
    return subprocess.Popen(
        [*argv, "--workspace", str(workspace)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def answer(process: subprocess.Popen[str]) -> tuple[int, dict[str, object]]:
    with process:
        out, _ = process.communicate(timeout=60)
    return process.returncode, json.loads(out)


def test_a_key_running_in_another_process_runs_once(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "toolkernel.toml").write_text(CONFIG)
    first = call(workspace, "run-a")
    deadline = time.monotonic() + 30
    while not (workspace / "log.txt").exists():  # the first command is running
        assert first.poll() is None
        assert time.monotonic() < deadline
        time.sleep(0.05)
    code, busy = answer(call(workspace, "run-b"))
    assert (code, busy["status"], busy["errorCode"]) == (1, "DENIED", "IDEMPOTENCY_IN_PROGRESS")
    assert busy["retryable"] is True
    code, original = answer(first)
    assert (code, original["status"]) == (0, "SUCCEEDED")
    code, repeated = answer(call(workspace, "run-c"))
    assert (code, repeated["status"]) == (0, "SUCCEEDED")
    assert repeated["structuredOutput"] == original["structuredOutput"]
    assert (workspace / "log.txt").read_text() == "ran\n"

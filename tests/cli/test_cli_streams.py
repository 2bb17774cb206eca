"""The CLI with standard streams a shell closed or a reader that stops reading: the
command still ends with the exit code it decided, and what it prints stays parseable."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

TOOLKERNEL = [sys.executable, "-m", "toolkernel"]


def test_a_reader_that_leaves_does_not_turn_a_failure_into_success(workspace: Path):
    """`toolkernel ledger verify | head -3` of a broken ledger must still exit 1: the
    pipe's status is what CI and reviewers check."""
    argv = [*TOOLKERNEL, "call", "no.such.tool", "--args", "{}", "--workspace", str(workspace)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None
    process.stdout.close()  # the reader is gone before anything was written
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1  # DENIED/UNKNOWN_TOOL, as when read
    assert b"Traceback" not in err
    assert b"BrokenPipeError" not in err


def test_a_closed_stdin_is_read_as_empty(workspace: Path):
    command = " ".join([*TOOLKERNEL, "call", "memory.read", "--args", "'{}'", "--workspace"])
    done = subprocess.run(
        ["bash", "-c", f"{command} {workspace} <&-"], capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "SUCCEEDED"


def test_a_closed_stderr_keeps_warnings_out_of_the_json_on_stdout(workspace: Path):
    """`ledger show --format json` names a broken chain on stderr; with stderr closed
    that must not land in the JSON."""
    call = [*TOOLKERNEL, "call", "memory.read", "--args", "{}", "--workspace", str(workspace)]
    subprocess.run(call, capture_output=True, timeout=60, check=True)
    with sqlite3.connect(workspace / ".toolkernel" / "ledger.db") as db:
        db.execute("UPDATE events SET payload = replace(payload, 'memory', 'memorx')")
    show = " ".join([*TOOLKERNEL, "ledger", "show", "--format", "json", "--workspace"])
    done = subprocess.run(
        ["bash", "-c", f"{show} {workspace} 2>&-"], capture_output=True, timeout=60
    )
    assert done.returncode == 1  # the chain is broken
    assert isinstance(json.loads(done.stdout), list)


def test_a_closed_stdout_discards_the_output_and_keeps_the_exit_code(workspace: Path):
    """`toolkernel call … >&-`: the call runs and is recorded, and the exit code is the
    one it decided, with no traceback (stdout is None in Python then)."""
    ok = " ".join([*TOOLKERNEL, "call", "memory.read", "--args", "'{}'", "--workspace"])
    refused = " ".join([*TOOLKERNEL, "call", "no.such.tool", "--args", "'{}'", "--workspace"])
    for command, code in ((ok, 0), (refused, 1)):
        done = subprocess.run(
            ["bash", "-c", f"{command} {workspace} >&-"], capture_output=True, timeout=60
        )
        assert done.returncode == code, done.stderr
        assert done.stderr == b""
    verify = [*TOOLKERNEL, "ledger", "verify", "--workspace", str(workspace)]
    checked = subprocess.run(verify, capture_output=True, timeout=60, text=True)
    assert checked.returncode == 0
    assert "2 runs" in checked.stdout

"""``toolkernel replay FILE`` reads only a regular file: a device or a FIFO is refused
(exit 2) before anything is read from it."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

EXIT_INVALID_INPUT = 2
# Bounds for a regression: reading /dev/zero whole would run until memory ran out, and
# opening a FIFO with no writer would wait forever.
_TIMEOUT_S = 60
_MEMORY_LIMIT = 2 * 1024**3


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_LIMIT, _MEMORY_LIMIT))


def replay(path: Path, workspace: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolkernel", "replay", str(path), "--workspace", str(workspace)],
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        preexec_fn=_limit_memory,
        check=False,
    )


def test_a_device_is_refused(workspace: Path) -> None:
    done = replay(Path("/dev/zero"), workspace)

    assert done.returncode == EXIT_INVALID_INPUT
    assert done.stderr.startswith("ReplayInputError: /dev/zero: ")
    assert "regular file" in done.stderr
    assert done.stdout == ""


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path, workspace: Path) -> None:
    fifo = tmp_path / "calls.jsonl"
    os.mkfifo(fifo)

    done = replay(fifo, workspace)

    assert done.returncode == EXIT_INVALID_INPUT
    assert done.stderr.startswith(f"ReplayInputError: {fifo}: ")
    assert "regular file" in done.stderr


def test_a_directory_is_refused(tmp_path: Path, workspace: Path) -> None:
    done = replay(tmp_path, workspace)

    assert done.returncode == EXIT_INVALID_INPUT
    assert done.stderr.startswith(f"ReplayInputError: {tmp_path}: ")


@pytest.mark.parametrize("content", [b"", b"\n\n"])
def test_an_empty_regular_file_still_replays_nothing(
    tmp_path: Path, workspace: Path, content: bytes
) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_bytes(content)

    done = replay(path, workspace)

    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")

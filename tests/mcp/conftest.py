"""Fixtures of the MCP tests."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.bridge_support import FIXTURE_SERVER, recorded_pids, running


@pytest.fixture
def record(tmp_path: Path) -> Iterator[Path]:
    """A fixture server's ``--record`` file. The processes it recorded are killed after
    the test, so that a failing test leaves none of them running."""
    path = tmp_path / "record.txt"
    path.write_text("")
    yield path
    for pid in recorded_pids(path).values():
        if running(pid) and _started_by_fixture_server(pid):
            os.kill(pid, signal.SIGKILL)


def _started_by_fixture_server(pid: int) -> bool:
    """Not a process that took a recorded pid over after it ended."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(FIXTURE_SERVER).encode() in command or b"time.sleep(3600)" in command

"""What is at the ledger's path when nothing readable is: the ledger commands never call
it intact. A dangling link, a FIFO, a directory or an empty file is a LedgerError
(exit 2), and a FIFO is never waited on."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from toolkernel.cli import main

EXIT_OK, EXIT_USAGE = 0, 2
# A reader subprocess is bounded: importing and reading a tiny ledger takes ~1 s; a
# reader that waited for a FIFO's writer would wait forever.
_READER_TIMEOUT_S = 60


def _dangling(path: Path) -> str:
    path.symlink_to(path.parent / "moved-away.db")
    return "is a symbolic link to "


def _fifo(path: Path) -> str:
    os.mkfifo(path)
    return "is not a regular file"


def _directory(path: Path) -> str:
    path.mkdir()
    return "is not a regular file"


def _empty(path: Path) -> str:
    path.touch()
    return "is an empty file"


NOT_A_LEDGER: dict[str, Callable[[Path], str]] = {
    "dangling link": _dangling,
    "fifo": _fifo,
    "directory": _directory,
    "empty file": _empty,
}


def toolkernel(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolkernel", *argv],
        capture_output=True,
        text=True,
        timeout=_READER_TIMEOUT_S,
        check=False,
    )


def reader(workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return toolkernel("ledger", *args, "--workspace", str(workspace))


@pytest.mark.parametrize("what", sorted(NOT_A_LEDGER))
@pytest.mark.parametrize("command", [["verify"], ["show"], ["replay", "--run", "run-a"]])
def test_what_is_not_a_ledger_file_is_a_ledger_error(
    workspace: Path, what: str, command: list[str]
) -> None:
    path = workspace / ".toolkernel" / "ledger.db"
    path.parent.mkdir()
    why = NOT_A_LEDGER[what](path)

    done = reader(workspace, *command)

    assert done.returncode == EXIT_USAGE
    assert done.stdout == ""
    assert done.stderr.startswith(f"LedgerError: the ledger at {path} {why}")
    assert done.stderr.count("\n") == 1  # no traceback


@pytest.mark.parametrize("what", ["fifo", "dangling link"])
def test_a_call_whose_ledger_path_holds_no_file_says_what_is_there(
    workspace: Path, what: str
) -> None:
    path = workspace / ".toolkernel" / "ledger.db"
    path.parent.mkdir()
    why = NOT_A_LEDGER[what](path)

    done = toolkernel("call", "memory.read", "--args", "{}", "--workspace", str(workspace))

    assert done.returncode == EXIT_USAGE
    assert done.stdout == ""
    assert done.stderr.startswith(f"LedgerError: the ledger at {path} {why}")
    assert done.stderr.count("\n") == 1  # no traceback


def test_a_link_to_a_ledger_is_read_through(
    capsys: pytest.CaptureFixture[str], workspace: Path, tmp_path: Path
) -> None:
    argv = ["call", "memory.read", "--run", "run-a", "--workspace", str(workspace)]
    assert main(argv) == EXIT_OK
    state = workspace / ".toolkernel"
    (state / "ledger.db").rename(tmp_path / "archived.db")
    (state / "ledger.db").symlink_to(tmp_path / "archived.db")
    capsys.readouterr()

    assert main(["ledger", "verify", "--workspace", str(workspace)]) == EXIT_OK
    assert capsys.readouterr().out.rstrip().endswith("1 runs, 4 events: intact")

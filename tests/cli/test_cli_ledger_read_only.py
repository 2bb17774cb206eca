"""The ledger commands only read a SQLite ledger: a user who may not write it can
verify, show and replay it, and an archived copy is left exactly as it was."""

from __future__ import annotations

import os
import pwd
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolkernel.cli import main
from toolkernel.ledger import EventType, NewEvent, SqliteLedger

EXIT_OK, EXIT_USAGE = 0, 2
READERS = [["verify"], ["show"], ["replay", "--run", "run-a"]]
# A reader subprocess is bounded: importing and verifying a tiny ledger takes ~1 s.
_READER_TIMEOUT_S = 60


def _nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return 65534, 65534
    return entry.pw_uid, entry.pw_gid


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory another user may enter: under root, readers run as ``nobody``, who
    cannot enter pytest's private temporary directories."""
    directory = Path(tempfile.mkdtemp(prefix="toolkernel-read-only-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        for path in (directory, *directory.rglob("*")):
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)  # a non-root owner cannot delete from a read-only dir
        shutil.rmtree(directory)


def as_reader(workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``toolkernel ledger ARGS`` by a user who may read the workspace, not write it:
    ``nobody`` under root (root may write anything), the test's own user otherwise."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        uid, gid = _nobody()
        prefix = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    # A home of its own beside the workspace (nobody's is /nonexistent; a workspace
    # that is the home directory is refused).
    env = {**os.environ, "HOME": str(workspace.parent / "home")}
    argv = [*prefix, sys.executable, "-m", "toolkernel", "ledger", *args]
    return subprocess.run(
        [*argv, "--workspace", str(workspace)],
        capture_output=True,
        text=True,
        env=env,
        timeout=_READER_TIMEOUT_S,
        check=False,
    )


def make_workspace(shared: Path) -> Path:
    workspace = shared / "ws"
    workspace.mkdir()
    assert main(["call", "memory.read", "--run", "run-a", "--workspace", str(workspace)]) == 0
    return workspace


def make_read_only(*paths: Path) -> None:
    for path in paths:
        path.chmod(0o555 if path.is_dir() else 0o444)


@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
def test_a_ledger_in_a_directory_the_reader_may_not_write_can_be_read(
    capsys: pytest.CaptureFixture[str], shared: Path, command: list[str]
) -> None:
    # Closed cleanly, the WAL-mode file has no -wal or -shm beside it, and the reader
    # cannot create them.
    workspace = make_workspace(shared)
    state = workspace / ".toolkernel"
    assert sorted(p.name for p in state.iterdir() if "ledger" in p.name) == ["ledger.db"]
    make_read_only(state / "ledger.db", state, workspace)
    before = (state / "ledger.db").read_bytes()

    done = as_reader(workspace, *command)

    assert (done.returncode, done.stderr) == (EXIT_OK, "")
    if command == ["verify"]:
        assert done.stdout.rstrip().endswith("1 runs, 4 events: intact")
    else:
        assert "memory.read" in done.stdout
    assert (state / "ledger.db").read_bytes() == before


def test_a_ledger_file_the_reader_may_not_write_can_be_verified(shared: Path) -> None:
    workspace = make_workspace(shared)
    state = workspace / ".toolkernel"
    make_read_only(state / "ledger.db")
    if os.geteuid() == 0:  # the reader may write the directory, not the file
        os.chown(state, *_nobody())
    before = (state / "ledger.db").read_bytes()

    done = as_reader(workspace, "verify")

    assert (done.returncode, done.stderr) == (EXIT_OK, "")
    assert done.stdout.rstrip().endswith("1 runs, 4 events: intact")
    assert (state / "ledger.db").read_bytes() == before


def test_commits_left_in_a_log_the_reader_cannot_open_are_a_ledger_error(shared: Path) -> None:
    # A copy taken while a writer had the file open: the last commits are only in the
    # -wal, which cannot be read without creating a -shm. Reading the file alone would
    # verify an older ledger as if it were the whole one.
    workspace = shared / "ws"
    state = workspace / ".toolkernel"
    state.mkdir(parents=True)
    with SqliteLedger(shared / "live.db") as live:
        live.append("run-a", [NewEvent(EventType.TOOL_CALL_REQUEST, {"n": 1}, "c1")])
        shutil.copy(shared / "live.db", state / "ledger.db")
        shutil.copy(shared / "live.db-wal", state / "ledger.db-wal")
    make_read_only(state / "ledger.db", state / "ledger.db-wal", state, workspace)

    done = as_reader(workspace, "verify")

    assert done.returncode == EXIT_USAGE
    assert done.stderr.startswith("LedgerError: ")
    assert "ledger.db-wal" in done.stderr
    assert "intact" not in done.stdout


def test_verify_leaves_an_archived_copy_as_it_was(
    capsys: pytest.CaptureFixture[str], workspace: Path
) -> None:
    assert main(["call", "memory.read", "--run", "run-a", "--workspace", str(workspace)]) == 0
    path = workspace / ".toolkernel" / "ledger.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=DELETE")  # as an archive holds it
    conn.close()
    before = path.read_bytes()
    capsys.readouterr()

    assert main(["ledger", "verify", "--workspace", str(workspace)]) == EXIT_OK
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir() if "ledger" in p.name) == ["ledger.db"]


def test_verify_reports_a_dropped_events_table_without_recreating_it(
    capsys: pytest.CaptureFixture[str], workspace: Path
) -> None:
    assert main(["call", "memory.read", "--run", "run-a", "--workspace", str(workspace)]) == 0
    path = workspace / ".toolkernel" / "ledger.db"
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE events")
    conn.close()
    capsys.readouterr()

    assert main(["ledger", "verify", "--workspace", str(workspace)]) == EXIT_USAGE
    assert capsys.readouterr().err.startswith("LedgerError: ")
    conn = sqlite3.connect(path)
    try:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    finally:
        conn.close()
    assert "events" not in tables

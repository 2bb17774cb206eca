"""``toolkernel ledger verify`` on an edited SQLite ledger: each edit is a problem of
the run it is in (exit 1), the other runs are still verified, and nothing crashes.
``show`` names the same problems and shows the runs it can decode (exit 1)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from toolkernel.cli import main

EXIT_OK, EXIT_BROKEN, EXIT_USAGE = 0, 1, 2

# `call memory.read --run R` stores TOOLS_EXPOSED, REQUEST, STARTED and RESULT: seq 1-4.
MISSTORED = {
    "at as a blob": "UPDATE events SET at = CAST(at AS BLOB) WHERE {run} AND seq = 3",
    "tool_call_id as a blob": "UPDATE events SET tool_call_id = X'00ff' WHERE {run} AND seq = 3",
    "prev_hash as a blob": (
        "UPDATE events SET prev_hash = CAST(prev_hash AS BLOB) WHERE {run} AND seq = 3"
    ),
    "run_id as a blob": (
        "UPDATE events SET run_id = CAST(run_id AS BLOB) WHERE {run};"
        "UPDATE heads SET run_id = CAST(run_id AS BLOB) WHERE {run}"
    ),
    "seq as text": "UPDATE events SET seq = '3x' WHERE {run} AND seq = 3",
    "seq as a real": "UPDATE events SET seq = 3.5 WHERE {run} AND seq = 3",
    # Text that is not UTF-8, with a terminal escape that clears the screen.
    "payload as text that is not UTF-8": (
        "UPDATE events SET payload = CAST(X'1b5b324a464f52474544ff' AS TEXT) "
        "WHERE {run} AND seq = 3"
    ),
    "at as text that is not UTF-8": (
        "UPDATE events SET at = CAST(X'1b5b324aff' AS TEXT) WHERE {run} AND seq = 3"
    ),
}


def call(workspace: Path, run_id: str, *args: str) -> int:
    return main(["call", "memory.read", "--run", run_id, *args, "--workspace", str(workspace)])


def ledger(*args: str, workspace: Path) -> int:
    return main(["ledger", *args, "--workspace", str(workspace)])


def edit(workspace: Path, script: str) -> None:
    conn = sqlite3.connect(workspace / ".toolkernel" / "ledger.db")
    try:
        conn.executescript(script)
    finally:
        conn.close()


@pytest.fixture
def two_runs(capsys: pytest.CaptureFixture[str], workspace: Path) -> Path:
    assert call(workspace, "run-a") == EXIT_OK
    assert call(workspace, "run-b") == EXIT_OK
    capsys.readouterr()
    return workspace


@pytest.mark.parametrize("change", sorted(MISSTORED))
def test_verify_reports_a_field_stored_as_another_type_and_goes_on(
    capsys: pytest.CaptureFixture[str], two_runs: Path, change: str
) -> None:
    edit(two_runs, MISSTORED[change].format(run="run_id = 'run-a'"))

    assert ledger("verify", workspace=two_runs) == EXIT_BROKEN
    captured = capsys.readouterr()
    assert captured.err == ""
    problems = captured.out.splitlines()[:-1]
    assert any(": bad_payload: " in line and "run-a" in line for line in problems)
    assert not any(line.startswith("run-b ") for line in problems)
    assert captured.out.splitlines()[-1].startswith("2 runs, 8 events")
    assert "BROKEN" in captured.out


@pytest.mark.parametrize("change", sorted(MISSTORED))
def test_show_of_a_field_stored_as_another_type_names_it_and_shows_the_other_run(
    capsys: pytest.CaptureFixture[str], two_runs: Path, change: str
) -> None:
    edit(two_runs, MISSTORED[change].format(run="run_id = 'run-a'"))

    assert ledger("show", workspace=two_runs) == EXIT_BROKEN
    captured = capsys.readouterr()
    assert captured.err.startswith("warning: the ledger fails verification")
    assert ": bad_payload: " in captured.err
    assert "not shown: event " in captured.err
    assert "cannot be decoded" in captured.err
    assert [line.split()[0] for line in captured.out.splitlines()[1:]] == ["run-b"] * 4
    assert "\x1b" not in captured.out + captured.err


def test_text_that_is_not_utf8_is_a_bad_payload_at_its_event_and_never_printed_raw(
    capsys: pytest.CaptureFixture[str], two_runs: Path
) -> None:
    edit(two_runs, MISSTORED["payload as text that is not UTF-8"].format(run="run_id = 'run-a'"))

    assert ledger("verify", workspace=two_runs) == EXIT_BROKEN
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.splitlines() == [
        "run-a seq 3: bad_payload: payload is stored as text that is not UTF-8",
        "2 runs, 8 events: BROKEN (1 problems)",
    ]
    assert ledger("verify", "--run", "run-b", workspace=two_runs) == EXIT_OK
    capsys.readouterr()
    for command in (["replay"], ["replay", "--allow-broken"]):
        assert ledger(*command, "--run", "run-a", workspace=two_runs) == EXIT_BROKEN
        captured = capsys.readouterr()
        assert "run-a seq 3: bad_payload: " in captured.err
        assert "\x1b" not in captured.out + captured.err
    assert "replay stopped: event 3 of run 'run-a' cannot be decoded" in captured.err


def test_verify_reports_an_index_entry_moved_to_the_calls_request(
    capsys: pytest.CaptureFixture[str], workspace: Path
) -> None:
    assert call(workspace, "run-a", "--idempotency-key", "k1") == EXIT_OK
    edit(workspace, "UPDATE idempotency SET seq = 2")
    capsys.readouterr()

    assert ledger("verify", workspace=workspace) == EXIT_BROKEN
    assert "run-a seq 2: index_mismatch: " in capsys.readouterr().out


def test_verify_reports_a_deleted_index_entry(
    capsys: pytest.CaptureFixture[str], workspace: Path
) -> None:
    assert call(workspace, "run-a", "--idempotency-key", "k1") == EXIT_OK
    edit(workspace, "DELETE FROM idempotency")
    capsys.readouterr()

    assert ledger("verify", workspace=workspace) == EXIT_BROKEN
    assert "run-a seq 4: index_mismatch: " in capsys.readouterr().out


def test_a_key_used_again_in_another_run_verifies_intact(
    capsys: pytest.CaptureFixture[str], workspace: Path
) -> None:
    assert call(workspace, "run-a", "--idempotency-key", "k1") == EXIT_OK
    assert call(workspace, "run-b", "--idempotency-key", "k1") == EXIT_OK  # replayed
    capsys.readouterr()

    assert ledger("verify", workspace=workspace) == EXIT_OK
    assert capsys.readouterr().out.rstrip().endswith(": intact")

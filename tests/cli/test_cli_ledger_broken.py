"""``ledger show`` and ``ledger replay`` verify what they present: a run that fails
verification is named on stderr with its problems (exit 1); show marks its events,
replay rebuilds nothing unless ``--allow-broken``."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from toolkernel.cli import main

EXIT_OK, EXIT_BROKEN = 0, 1

# `call file.read --run R` stores TOOLS_EXPOSED, REQUEST, STARTED and RESULT: seq 1-4;
# a second call in the same run TOOLS_EXPOSED, REQUEST, STARTED and RESULT again: 5-8.
EDITS = {
    "edited payload": (
        "UPDATE events SET payload = replace(payload, 'a.txt', 'FORGED.txt') "
        "WHERE run_id = 'run-a' AND seq = 2",
        "run-a seq 2: hash_mismatch: ",
        2,
    ),
    "deleted middle event": (
        "DELETE FROM events WHERE run_id = 'run-a' AND seq = 4",
        "run-a seq 5: gap: expected seq 4, found seq 5",
        5,
    ),
}


def ledger(*args: str, workspace: Path) -> int:
    return main(["ledger", *args, "--workspace", str(workspace)])


@pytest.fixture
def two_runs(capsys: pytest.CaptureFixture[str], workspace: Path) -> Path:
    (workspace / "a.txt").write_text("one\ntwo\n")
    for run in ("run-a", "run-a", "run-b"):
        argv = ["call", "file.read", "--args", '{"path": "a.txt"}', "--run", run]
        assert main([*argv, "--workspace", str(workspace)]) == EXIT_OK
    capsys.readouterr()
    return workspace


def edit(workspace: Path, script: str) -> None:
    conn = sqlite3.connect(workspace / ".toolkernel" / "ledger.db")
    try:
        conn.executescript(script)
    finally:
        conn.close()


@pytest.mark.parametrize("change", sorted(EDITS))
def test_show_names_the_problems_marks_the_events_and_exits_1(
    capsys: pytest.CaptureFixture[str], two_runs: Path, change: str
) -> None:
    script, problem, seq = EDITS[change]
    edit(two_runs, script)

    assert ledger("show", workspace=two_runs) == EXIT_BROKEN
    captured = capsys.readouterr()
    assert captured.err.startswith("warning: the ledger fails verification (1 problem)")
    assert f"  {problem}" in captured.err
    header, *rows = [line.split(maxsplit=3) for line in captured.out.splitlines()]
    assert header[:3] == ["RUN", "SEQ", "CHECK"]
    marked = [row[:3] for row in rows if row[2] in ("hash_mismatch", "gap")]
    assert marked == [["run-a", str(seq), problem.split(": ")[1]]]

    assert ledger("show", "--format", "json", workspace=two_runs) == EXIT_BROKEN
    events = json.loads(capsys.readouterr().out)
    flagged = [(e["runId"], e["seq"], e["problems"][0]["kind"]) for e in events if "problems" in e]
    assert flagged == [("run-a", seq, problem.split(": ")[1])]


def test_show_of_an_intact_run_beside_a_broken_one_passes(
    capsys: pytest.CaptureFixture[str], two_runs: Path
) -> None:
    edit(two_runs, EDITS["edited payload"][0])

    assert ledger("show", "--run", "run-b", workspace=two_runs) == EXIT_OK
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.splitlines()[0].split() == ["SEQ", "EVENT", "TOOL", "SUMMARY"]


@pytest.mark.parametrize("change", sorted(EDITS))
def test_replay_refuses_a_broken_run_and_names_its_problems(
    capsys: pytest.CaptureFixture[str], two_runs: Path, change: str
) -> None:
    script, problem, _ = EDITS[change]
    edit(two_runs, script)

    assert ledger("replay", "--run", "run-a", workspace=two_runs) == EXIT_BROKEN
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"  {problem}" in captured.err
    assert "replay refused: run run-a fails verification" in captured.err
    assert "--allow-broken" in captured.err


@pytest.mark.parametrize("change", sorted(EDITS))
def test_replay_with_allow_broken_rebuilds_the_run_and_still_exits_1(
    capsys: pytest.CaptureFixture[str], two_runs: Path, change: str
) -> None:
    script, problem, _ = EDITS[change]
    edit(two_runs, script)

    assert ledger("replay", "--run", "run-a", "--allow-broken", workspace=two_runs) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("warning: the ledger fails verification")
    assert f"  {problem}" in captured.err
    assert "refused" not in captured.err
    rebuilt = [json.loads(line)["toolName"] for line in captured.out.splitlines()]
    assert rebuilt in (["file.read"], ["file.read", "file.read"])  # a deleted RESULT: one


def test_replay_of_an_intact_run_beside_a_broken_one_says_nothing_else(
    capsys: pytest.CaptureFixture[str], two_runs: Path
) -> None:
    edit(two_runs, EDITS["edited payload"][0])

    assert ledger("replay", "--run", "run-b", workspace=two_runs) == EXIT_OK
    captured = capsys.readouterr()
    assert captured.err == ""
    assert json.loads(captured.out)["arguments"] == {"path": "a.txt"}


@pytest.mark.parametrize("command", [["show"], ["show", "--format", "json"], ["replay"]])
def test_a_run_whose_events_were_all_deleted_is_named_broken_not_missing(
    capsys: pytest.CaptureFixture[str], two_runs: Path, command: list[str]
) -> None:
    # Its head row remains: it used to be "no run 'run-b'", exit 2, as a mistyped id.
    edit(two_runs, "DELETE FROM events WHERE run_id = 'run-b'")
    assert ledger(*command, "--run", "run-b", workspace=two_runs) == EXIT_BROKEN
    err = capsys.readouterr().err
    assert "run-b run: head_mismatch" in err
    assert "has no run" not in err
    assert ledger(*command, "--run", "run-zz", workspace=two_runs) == 2  # a mistyped id


def test_show_without_a_ledger_is_no_pass_either(
    capsys: pytest.CaptureFixture[str], workspace: Path
) -> None:
    assert ledger("show", workspace=workspace) == EXIT_BROKEN
    assert ledger("show", "--format", "json", workspace=workspace) == EXIT_BROKEN
    captured = capsys.readouterr()
    assert json.loads(captured.out) == []
    assert "no ledger at" in captured.err


@pytest.mark.parametrize("command", [["show", "--format", "json"], ["replay", "--run", "run-x"]])
def test_json_output_escapes_what_a_terminal_would_act_on(
    capsys: pytest.CaptureFixture[str], workspace: Path, command: list[str]
) -> None:
    # json.dumps(ensure_ascii=False) writes a C1 CSI (U+009B) or a bidi override raw.
    hostile = "a\u009b2J\u202egnp.txt\u2028"
    argv = ["call", "file.read", "--args", json.dumps({"path": hostile}), "--run", "run-x"]
    main([*argv, "--workspace", str(workspace)])
    capsys.readouterr()
    ledger(*command, workspace=workspace)
    out = capsys.readouterr().out
    for raw in ("\u009b", "\u202e", "\u2028"):
        assert raw not in out
    assert "\\u009b2J\\u202egnp.txt\\u2028" in out
    for line in out.splitlines():
        json.loads(line)  # still JSON

"""The ledger commands read the ledger the configuration names, and create nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkernel.cli import main

READERS = [["verify"], ["show"], ["replay", "--run", "run-x"]]


def forge(path: Path, run_id: str, seq: int, payload: dict) -> None:
    """Replace an event's payload as someone with write access would who also recomputes
    the hashes after it and the run's head: verify cannot tell."""
    import sqlite3

    from toolkernel.canonical import canonical_json
    from toolkernel.ledger.base import chained_hash

    db = sqlite3.connect(path)
    try:
        rows = db.execute(
            "SELECT seq, type, at, tool_call_id, payload, prev_hash FROM events "
            "WHERE run_id = ? ORDER BY seq",
            (run_id,),
        ).fetchall()
        prev = rows[seq - 1][5]
        for number, type_, at, call, text, _ in rows[seq - 1 :]:
            text = canonical_json(payload).decode() if number == seq else text
            digest = chained_hash(run_id, number, type_, at, call, text.encode(), prev)
            db.execute(
                "UPDATE events SET payload = ?, prev_hash = ?, hash = ? "
                "WHERE run_id = ? AND seq = ?",
                (text, prev, digest, run_id, number),
            )
            prev = digest
        db.execute("UPDATE heads SET hash = ? WHERE run_id = ?", (prev, run_id))
        db.commit()
    finally:
        db.close()


def ledger(*args: str, workspace: Path) -> int:
    return main(["ledger", *args, "--workspace", str(workspace)])


@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
def test_ledger_commands_refuse_a_missing_workspace(capsys, tmp_path, command):
    missing = tmp_path / "nowhere"
    assert ledger(*command, workspace=missing) == 2
    captured = capsys.readouterr()
    assert "intact" not in captured.out
    assert str(missing) in captured.err
    assert not missing.exists()


@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
def test_a_postgres_ledger_that_cannot_be_reached_is_a_ledger_error(capsys, workspace, command):
    (workspace / "toolkernel.toml").write_text(
        f'[ledger]\nbackend = "postgres"\ndsn = "host={workspace / "no-server"} dbname=x"\n'
    )
    assert ledger(*command, workspace=workspace) == 2
    captured = capsys.readouterr()
    assert "intact" not in captured.out
    assert captured.err.startswith("LedgerError: ")
    assert not (workspace / ".toolkernel").exists()  # not the local SQLite file instead


@pytest.mark.parametrize("command", ["verify", "replay"])
def test_an_unknown_run_is_a_usage_error(capsys, workspace, command):
    assert main(["call", "memory.read", "--run", "run-a", "--workspace", str(workspace)]) == 0
    capsys.readouterr()
    assert ledger(command, "--run", "nosuchrun", workspace=workspace) == 2
    captured = capsys.readouterr()
    assert "intact" not in captured.out
    assert "'nosuchrun'" in captured.err


def test_an_empty_ledger_file_is_an_error_and_is_left_as_it_was(capsys, workspace):
    # An emptied ledger is not an intact one.
    state = workspace / ".toolkernel"
    state.mkdir()
    (state / "ledger.db").touch()
    assert ledger("verify", workspace=workspace) == 2
    captured = capsys.readouterr()
    assert "intact" not in captured.out
    assert captured.err.startswith("LedgerError: ")
    assert "empty file" in captured.err
    assert ledger("verify", "--run", "nosuchrun", workspace=workspace) == 2
    assert [p.name for p in state.iterdir()] == ["ledger.db"]
    assert (state / "ledger.db").stat().st_size == 0


def test_verify_without_a_ledger_says_so_and_does_not_pass(capsys, workspace):
    # Nothing ran in the workspace yet, or the reviewer points at the wrong one: no pass.
    path = workspace / ".toolkernel" / "ledger.db"
    assert ledger("verify", workspace=workspace) == 1
    captured = capsys.readouterr()
    assert captured.out == f"no ledger at {path}: nothing recorded there yet, nothing verified\n"
    assert "intact" not in captured.out
    assert ledger("verify", "--run", "run-a", workspace=workspace) == 2
    assert f"no ledger at {path}, so no run 'run-a'" in capsys.readouterr().err


def test_a_ledger_that_holds_no_run_does_not_pass_either(capsys, workspace):
    """`toolkernel tools` (or a kernel opened and closed) makes the file and records
    nothing: that is no more a pass than no file."""
    from toolkernel.ledger import SqliteLedger

    path = workspace / ".toolkernel" / "ledger.db"
    path.parent.mkdir()
    SqliteLedger(path).close()
    assert ledger("verify", workspace=workspace) == 1
    out = capsys.readouterr().out
    assert out == f"no run in the ledger at {path}: nothing recorded there yet, nothing verified\n"
    assert ledger("show", "--format", "json", workspace=workspace) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == []
    assert "nothing recorded there yet" in captured.err


def test_reading_a_workspace_without_a_ledger_creates_none(capsys, workspace):
    assert ledger("show", workspace=workspace) == 1  # no pass, as verify
    assert "no ledger at " in capsys.readouterr().err
    assert ledger("verify", workspace=workspace) == 1
    assert ledger("replay", "--run", "run-a", workspace=workspace) == 2
    assert not (workspace / ".toolkernel").exists()


@pytest.mark.parametrize("command", [["ledger", "verify", "--workspace"], ["replay"]])
def test_error_messages_escape_control_characters(capsys, tmp_path, command):
    missing = tmp_path / "evil\x1b[2J\x07"
    assert main([*command, str(missing)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err
    assert "\x07" not in err
    assert "evil\\x1b[2J\\x07" in err


def test_ledger_show_escapes_control_characters(capsys, workspace):
    main(["call", "evil\x1b[2J\x07", "--workspace", str(workspace)])
    capsys.readouterr()
    assert ledger("show", workspace=workspace) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "\x07" not in out
    assert "evil\\x1b[2J\\x07" in out
    assert ledger("show", "--format", "json", workspace=workspace) == 0
    events = json.loads(capsys.readouterr().out)
    assert any(e["payload"].get("toolName") == "evil\x1b[2J\x07" for e in events)


def test_verify_names_calls_left_without_a_result(capsys, workspace):
    from toolkernel.ledger import EventType, NewEvent, SqliteLedger

    with SqliteLedger(workspace / ".toolkernel" / "ledger.db") as stored:
        stored.append(
            "run-cut", [NewEvent(EventType.TOOL_CALL_REQUEST, {"toolName": "x"}, "call_cut")]
        )
    assert ledger("verify", workspace=workspace) == 0  # not a broken chain
    out = capsys.readouterr().out
    assert "run-cut call_cut: unfinished" in out
    assert "1 runs, 1 events, 1 unfinished calls: intact" in out


def test_ledger_show_of_several_runs_says_which_run_each_event_is_in(capsys, workspace):
    for run in ("run-a", "run-b"):
        assert main(["call", "memory.read", "--run", run, "--workspace", str(workspace)]) == 0
    capsys.readouterr()
    assert ledger("show", workspace=workspace) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[:2] == ["RUN", "SEQ"]
    firsts = [row.split()[0] for row in rows if row.split()[1] == "1"]
    assert firsts == ["run-a", "run-b"]
    assert ledger("show", "--run", "run-b", workspace=workspace) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[0] == "SEQ"  # one run: nothing to tell apart
    assert all("run-a" not in row for row in rows)


@pytest.mark.parametrize("payload", ["[1,2]", '"text"', "null", "not json"])
@pytest.mark.parametrize("command", [["show"], ["replay", "--allow-broken"]], ids=lambda c: c[0])
def test_reading_an_event_whose_payload_is_not_an_object_names_it(
    capsys, workspace, command, payload
):
    import sqlite3

    assert main(["call", "memory.read", "--run", "run-a", "--workspace", str(workspace)]) == 0
    with sqlite3.connect(workspace / ".toolkernel" / "ledger.db") as db:
        db.execute("UPDATE events SET payload = ? WHERE type = 'TOOL_CALL_RESULT'", (payload,))
    db.close()
    capsys.readouterr()
    assert ledger(*command, "--run", "run-a", workspace=workspace) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("warning: the ledger fails verification")
    assert "run-a seq 4: bad_payload: " in captured.err
    assert "event 4 of run 'run-a' cannot be decoded" in captured.err
    assert ledger("verify", workspace=workspace) == 1
    assert "bad_payload" in capsys.readouterr().out


@pytest.mark.parametrize(
    "payload", ['{"result": 5}', '{"toolName": 3, "result": {"status": "NOPE"}}']
)
def test_an_object_payload_shaped_unlike_its_event_is_shown_and_replay_says_verify(
    capsys, workspace, payload
):
    # Only someone who also recomputed the hashes leaves such a payload: show lists it
    # with a note, replay refuses with the usual error, neither crashes.
    assert main(["call", "memory.read", "--run", "run-a", "--workspace", str(workspace)]) == 0
    forge(workspace / ".toolkernel" / "ledger.db", "run-a", 4, json.loads(payload))
    assert ledger("verify", workspace=workspace) == 0
    capsys.readouterr()
    assert ledger("show", "--run", "run-a", workspace=workspace) == 0
    assert "TOOL_CALL_RESULT" in capsys.readouterr().out
    assert ledger("replay", "--run", "run-a", workspace=workspace) == 2
    err = capsys.readouterr().err
    assert err.startswith("LedgerError: ")
    assert "verify the ledger" in err

"""The CLI contract: one JSON projection per call, exit codes, ledger commands."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from toolkernel.calls import PROJECTION_KEYS
from toolkernel.cli import main
from toolkernel.codes import ErrorCode


def call(capsys, workspace: Path, *args: str) -> tuple[int, dict]:
    code = main(["call", *args, "--workspace", str(workspace)])
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert len(lines) == 1, out  # exactly one JSON object on stdout
    return code, json.loads(lines[0])


def test_call_prints_exactly_the_projection_keys(capsys, workspace):
    code, projection = call(capsys, workspace, "memory.read")
    assert code == 0
    assert tuple(projection) == PROJECTION_KEYS
    assert projection["status"] == "SUCCEEDED"


def test_drill_1_extra_argument_through_the_cli(capsys, workspace):
    code, projection = call(
        capsys, workspace, "repo.search", "--args", '{"query": "LegacyClient", "sendSecrets": true}'
    )
    assert code == 1
    assert projection["status"] == "INVALID_ARGUMENTS"
    assert projection["errorCode"] == ErrorCode.UNKNOWN_PROPERTY
    assert "sendSecrets" in projection["safeMessage"]


def test_drill_2_path_outside_the_workspace_through_the_cli(capsys, workspace):
    code, projection = call(
        capsys, workspace, "file.read", "--args", '{"path": "../../../../etc/passwd"}'
    )
    assert code == 1
    assert projection["status"] == "INVALID_ARGUMENTS"
    assert projection["errorCode"] == ErrorCode.PATH_TRAVERSAL
    assert str(workspace) not in projection["safeMessage"]
    # The attempt is in the audit ledger.
    assert main(["ledger", "show", "--format", "json", "--workspace", str(workspace)]) == 0
    events = json.loads(capsys.readouterr().out)
    results = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert results[-1]["payload"]["result"]["errorCode"] == ErrorCode.PATH_TRAVERSAL
    assert "TOOL_CALL_STARTED" not in {e["type"] for e in events}


def test_unknown_tool_and_bad_json_are_results_not_crashes(capsys, workspace):
    code, projection = call(capsys, workspace, "repo.nope")
    assert (code, projection["errorCode"]) == (1, ErrorCode.UNKNOWN_TOOL)
    code, projection = call(capsys, workspace, "memory.read", "--args", "{not json")
    assert (code, projection["errorCode"]) == (1, ErrorCode.ARGUMENTS_NOT_JSON)


def test_broken_config_exits_2_naming_the_key(capsys, workspace):
    (workspace / "toolkernel.toml").write_text('[policy]\nnetwork = "sometimes"\n')
    code = main(["call", "memory.read", "--workspace", str(workspace)])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert captured.err.startswith("ConfigError: ")
    assert "policy.network" in captured.err
    assert "Traceback" not in captured.err


def test_unknown_config_key_and_bad_toml_are_named(capsys, workspace):
    (workspace / "toolkernel.toml").write_text("[ledger]\nlocation = 'x'\n")
    assert main(["config", "check", "--workspace", str(workspace)]) == 2
    assert "ledger.location" in capsys.readouterr().err
    (workspace / "toolkernel.toml").write_text("[ledger\n")
    assert main(["config", "check", "--workspace", str(workspace)]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_approval_via_flag(capsys, workspace):
    (workspace / "toolkernel.toml").write_text(
        '[[policy.rules]]\ntools = ["memory.read"]\naction = "ask"\n'
    )
    code, projection = call(capsys, workspace, "memory.read")
    assert (code, projection["errorCode"]) == (1, ErrorCode.APPROVAL_REQUIRED)
    assert "--approve" in projection["safeMessage"]
    code, projection = call(capsys, workspace, "memory.read", "--approve")
    assert (code, projection["status"]) == (0, "SUCCEEDED")


def test_tools_lists_the_exposed_tools(capsys, workspace):
    assert main(["tools", "--format", "json", "--workspace", str(workspace)]) == 0
    names = {t["name"] for t in json.loads(capsys.readouterr().out)}
    assert {"memory.read", "policy.explain"} <= names
    assert "file.patch" not in names  # writes are denied by default
    assert main(["tools", "--workspace", str(workspace), "--state", "editing"]) == 0
    assert "memory.read" in capsys.readouterr().out


def test_tools_says_how_many_are_hidden_and_all_says_why(capsys, workspace):
    # A user who added a tool and does not see it must learn which setting hides it.
    (workspace / "toolkernel.toml").write_text(
        "[run]\nprofile = 'developer'\n"
        "[[exposure]]\nstates = ['EDITING']\ntools = ['shell.*', 'file.*', 'memory.read']\n"
        "[[exposure]]\ntools = ['repo.search']\n"
    )
    assert main(["tools", "--workspace", str(workspace)]) == 0
    out, err = capsys.readouterr()
    assert "repo.search" in out
    assert "shell.run" not in out
    hidden = "artifact.read, file.patch, file.read, memory.read, policy.explain, shell.run"
    assert f"7 more tools are registered and not exposed now: {hidden}, verifier.run;" in err
    assert "toolkernel tools --all" in err

    assert main(["tools", "--all", "--workspace", str(workspace)]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["repo.search"].rstrip().endswith("yes")
    assert (
        rows["shell.run"]
        .rstrip()
        .endswith(
            "no: no [[exposure]] rule selects it now (state PLANNING, profile developer, "
            "verification UNKNOWN, approval NONE)"
        )
    )

    assert main(["tools", "--all", "--format", "json", "--workspace", str(workspace)]) == 0
    listed = {t["tool"]["name"]: t for t in json.loads(capsys.readouterr().out)}
    assert (listed["repo.search"]["exposed"], listed["repo.search"]["reason"]) == (True, None)
    assert listed["shell.run"]["exposed"] is False

    argv = ["tools", "--all", "--state", "editing", "--profile", "read-only", "--format", "json"]
    assert main([*argv, "--workspace", str(workspace)]) == 0
    listed = {t["tool"]["name"]: t for t in json.loads(capsys.readouterr().out)}
    assert listed["shell.run"]["reason"] == "profile read-only lacks writeWorkspace, executeCommand"
    assert listed["file.patch"]["reason"] == "profile read-only lacks writeWorkspace"
    assert listed["file.read"]["exposed"] is True


def test_tools_with_no_exposure_rules_says_the_default_shows_read_only_tools(capsys, workspace):
    (workspace / "toolkernel.toml").write_text("[run]\nprofile = 'developer'\n")
    argv = ["tools", "--all", "--format", "json", "--workspace", str(workspace)]
    assert main(argv) == 0
    listed = {t["tool"]["name"]: t for t in json.loads(capsys.readouterr().out)}
    assert listed["shell.run"]["reason"] == (
        "it is not read-only, and with no [[exposure]] rules configured only read-only "
        "tools are shown"
    )


def test_run_id_continues_one_chain_and_replay_rebuilds_it(capsys, workspace):
    for _ in range(2):
        call(capsys, workspace, "memory.read", "--run", "run-cli")
    assert main(["ledger", "replay", "--run", "run-cli", "--workspace", str(workspace)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert all(json.loads(line)["projection"]["status"] == "SUCCEEDED" for line in lines)
    assert main(["ledger", "verify", "--workspace", str(workspace)]) == 0
    assert "intact" in capsys.readouterr().out


@pytest.mark.parametrize("run_id", ["", " ", "-x"])
def test_a_run_id_that_is_no_run_id_is_a_usage_error_not_a_new_run(capsys, workspace, run_id):
    argv = ["call", "memory.read", "--args", "{}", "--workspace", str(workspace)]
    assert main([*argv, f"--run={run_id}"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("UsageError: a run id is 1-128 characters")
    assert not (workspace / ".toolkernel" / "ledger.db").exists()


def _ledger(workspace: Path) -> sqlite3.Connection:
    return sqlite3.connect(workspace / ".toolkernel" / "ledger.db", isolation_level=None)


@pytest.mark.parametrize(
    "tamper",
    [
        "UPDATE events SET payload = replace(payload, 'memory.read', 'memory.wipe') WHERE seq = 2",
        "DELETE FROM events WHERE seq = 3",
        "UPDATE events SET seq = -2 WHERE seq = 2; UPDATE events SET seq = 2 WHERE seq = 3; "
        "UPDATE events SET seq = 3 WHERE seq = -2",
        "DELETE FROM events WHERE seq = (SELECT MAX(seq) FROM events)",
    ],
    ids=["edited", "deleted", "reordered", "tail-deleted"],
)
def test_ledger_verify_detects_tampering(capsys, workspace, tamper):
    for _ in range(2):
        call(capsys, workspace, "memory.read", "--run", "run-t")
    with _ledger(workspace) as db:
        db.executescript(tamper)
    assert main(["ledger", "verify", "--workspace", str(workspace)]) == 1
    assert "BROKEN" in capsys.readouterr().out


def test_codes_lists_the_whole_taxonomy(capsys):
    assert main(["codes", "--format", "json"]) == 0
    listed = {entry["code"] for entry in json.loads(capsys.readouterr().out)}
    assert listed == {code.value for code in ErrorCode}


def test_the_installed_entry_point_runs(workspace):
    completed = subprocess.run(
        [sys.executable, "-m", "toolkernel", "call", "memory.read", "--workspace", str(workspace)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["status"] == "SUCCEEDED"


def test_a_call_the_ledger_cannot_record_prints_ledger_unavailable(capsys, workspace, monkeypatch):
    """Another process holds the ledger's write lock past the busy timeout: a passing
    condition, so the call's one JSON object (retryable), exit 1; why goes to stderr."""
    monkeypatch.setattr("toolkernel.ledger.sqlite._BUSY_TIMEOUT_S", 0.2)
    assert call(capsys, workspace, "memory.read")[0] == 0  # the ledger exists
    holder = _ledger(workspace)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        code = main(["call", "memory.read", "--workspace", str(workspace)])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    captured = capsys.readouterr()
    projection = json.loads(captured.out)
    assert code == 1
    assert set(projection) == set(PROJECTION_KEYS)
    assert projection["errorCode"] == ErrorCode.LEDGER_UNAVAILABLE
    assert projection["retryable"] is True
    assert str(workspace) not in captured.out
    assert "database is locked" in captured.err


def test_arguments_can_come_from_a_file_or_stdin(capsys, workspace, tmp_path, monkeypatch):
    """A command line holds at most 128 KiB per argument; a patch can be larger."""
    import io

    path = tmp_path / "args.json"
    path.write_text('{"key": "from-file"}')
    # No note has that key: the message names the key the arguments carried.
    code, projection = call(capsys, workspace, "memory.read", "--args", f"@{path}")
    assert (code, projection["errorCode"]) == (1, "NOT_FOUND")
    assert "'from-file'" in projection["safeMessage"]
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b'{"key": "from-stdin"}')))
    _, projection = call(capsys, workspace, "memory.read", "--args", "-")
    assert "'from-stdin'" in projection["safeMessage"]
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b'{"nope": 1}')))
    _, projection = call(capsys, workspace, "memory.read", "--args", "-")
    assert projection["errorCode"] == "UNKNOWN_PROPERTY"  # read, and judged as arguments


def test_an_arguments_file_that_cannot_be_read_is_a_usage_error(capsys, workspace, tmp_path):
    code = main(["call", "memory.read", "--args", f"@{tmp_path / 'missing.json'}"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert "--args" in captured.err
    assert "missing.json" in captured.err


def test_an_empty_idempotency_key_is_a_usage_error(capsys, workspace):
    code = main(["call", "memory.read", "--idempotency-key", "", "--workspace", str(workspace)])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert "idempotency key must not be empty" in captured.err

"""``run_replay`` on unusual and broken input: detection, --provider, and exit code 2."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from sdk_responses import anthropic_document, chat_document, responses_document
from toolkernel.codes import ErrorCode
from toolkernel.errors import ConfigError
from toolkernel.replay_cli import EXIT_INVALID_INPUT, EXIT_OK, run_replay

CHAT = chat_document(("call_chat", "file__read", '{"path": "notes.md"}'))
RESPONSES = responses_document(
    {
        "type": "function_call",
        "call_id": "call_resp",
        "name": "file__read",
        "arguments": '{"path": "notes.md"}',
    }
)
ANTHROPIC = anthropic_document(
    {"type": "tool_use", "id": "toolu_1", "name": "file__read", "input": {"path": "notes.md"}}
)
FINAL = {**ANTHROPIC, "content": [{"type": "text", "text": "Done."}], "stop_reason": "end_turn"}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.md").write_text("notes\n")
    return root


def write(path: Path, *lines: Any) -> Path:
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def write_config(folder: Path) -> Path:
    config = folder / "toolkernel.toml"
    config.write_text(
        '[run]\nstate = "EDITING"\nprofile = "developer"\n\n[[exposure]]\ntools = ["*"]\n'
    )
    return config


def replay(path: Path, workspace: Path, **options: Any) -> tuple[int, list[dict[str, Any]], str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_replay(path, workspace=workspace, out=out, err=err, **options)
    return code, [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


def test_each_providers_responses_are_detected_in_one_file(tmp_path, workspace):
    path = write(tmp_path / "mixed.jsonl", CHAT, "", RESPONSES, ANTHROPIC, FINAL)

    code, rows, _ = replay(path, workspace)

    assert code == EXIT_OK
    assert [(r["line"], r["providerCallId"], r["status"]) for r in rows] == [
        (1, "call_chat", "SUCCEEDED"),
        (3, "call_resp", "SUCCEEDED"),
        (4, "toolu_1", "SUCCEEDED"),
    ]
    assert rows[0]["structuredOutput"]["content"] == "notes\n"


def test_provider_openai_accepts_both_openai_shapes(tmp_path, workspace):
    path = write(tmp_path / "openai.jsonl", CHAT, RESPONSES)

    code, rows, _ = replay(path, workspace, provider="openai", dry_run=True)

    assert code == EXIT_OK
    assert [r["verdict"] for r in rows] == ["ALLOWED", "ALLOWED"]


@pytest.mark.parametrize(
    ("provider", "lines", "bad_line"),
    [("anthropic", (ANTHROPIC, CHAT), 2), ("openai", (CHAT, RESPONSES, ANTHROPIC), 3)],
)
def test_a_response_of_another_provider_is_refused_naming_its_line(
    tmp_path, workspace, provider, lines, bad_line
):
    path = write(tmp_path / "session.jsonl", *lines)

    code, rows, err = replay(path, workspace, provider=provider)

    assert (code, rows) == (EXIT_INVALID_INPUT, [])
    assert err.startswith("ReplayInputError: ")
    assert f"line {bad_line}: " in err
    assert f"--provider is {provider}" in err
    detected = "openai-chat" if provider == "anthropic" else "anthropic"
    assert f"line {bad_line}: the response is {detected}, but" in err


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"id": "chatcmpl-1", "choices": [', "not a JSON object"),
        ("[1, 2, 3]", "not a JSON object"),
        ('{"hello": "world"}', "not a provider response"),
        ('{"object": "chat.completion", "choices": [{"message": 3}]}', "has no message"),
        ('{"type": "message", "role": "assistant", "content": "hi"}', "no 'content' list"),
    ],
)
def test_a_bad_line_stops_the_replay_before_anything_runs(tmp_path, workspace, line, problem):
    patch = {
        **ANTHROPIC,
        "content": [
            {
                "type": "tool_use",
                "id": "toolu_w",
                "name": "file__patch",
                "input": {"path": "new.md", "edits": [{"search": "", "replace": "x"}]},
            }
        ],
    }
    config = write_config(tmp_path)
    path = write(tmp_path / "session.jsonl", patch, ANTHROPIC, line)

    code, rows, err = replay(path, workspace, config_path=config)

    assert (code, rows) == (EXIT_INVALID_INPUT, [])
    assert "session.jsonl: line 3: " in err
    assert problem in err
    assert not (workspace / "new.md").exists()
    # Without the bad line the same file does write it.
    write(path, patch, ANTHROPIC)
    assert replay(path, workspace, config_path=config)[0] == EXIT_OK
    assert (workspace / "new.md").read_text() == "x"


def test_text_that_is_not_utf8_is_refused_naming_its_line(tmp_path, workspace):
    path = tmp_path / "session.jsonl"
    path.write_bytes(json.dumps(CHAT).encode() + b'\n{"x": "\xff\xfe"}\n')

    code, _, err = replay(path, workspace)

    assert code == EXIT_INVALID_INPUT
    assert "line 2: not UTF-8 text" in err


def test_a_missing_file_is_refused(tmp_path, workspace):
    code, _, err = replay(tmp_path / "absent.jsonl", workspace)

    assert code == EXIT_INVALID_INPUT
    assert "absent.jsonl: cannot read the file" in err
    assert not (workspace / ".toolkernel").exists()  # no kernel, no ledger was opened


def test_an_empty_file_replays_nothing(tmp_path, workspace):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")

    assert replay(path, workspace) == (EXIT_OK, [], "")


def test_calls_without_provider_ids_get_line_based_ids_in_a_dry_run(tmp_path, workspace):
    nameless = json.loads(json.dumps(CHAT))
    del nameless["choices"][0]["message"]["tool_calls"][0]["id"]
    path = write(tmp_path / "session.jsonl", nameless)

    _, rows, _ = replay(path, workspace, dry_run=True)

    assert (rows[0]["providerCallId"], rows[0]["toolCallId"]) == (None, "line1-0")


def test_a_dry_run_with_an_approver_does_not_warn_about_a_missing_one(tmp_path, workspace):
    push = json.loads(json.dumps(ANTHROPIC))
    push["content"][0].update(name="shell__run", input={"argv": ["git", "push"]})
    path = write(tmp_path / "session.jsonl", push)
    config = write_config(tmp_path)

    def approve(request: Any) -> Any:
        raise AssertionError("a dry run asks nobody")

    _, alone, _ = replay(path, workspace, dry_run=True, config_path=config)
    _, helped, _ = replay(path, workspace, dry_run=True, config_path=config, approver=approve)

    assert alone[0]["verdict"] == helped[0]["verdict"] == "NEEDS_APPROVAL"
    assert "No approver" in alone[0]["safeMessage"]
    assert "No approver" not in helped[0]["safeMessage"]


def test_a_bad_configuration_is_a_config_error_for_the_cli_to_report(tmp_path, workspace):
    config = tmp_path / "toolkernel.toml"
    config.write_text("[run\n")
    path = write(tmp_path / "session.jsonl", CHAT)

    with pytest.raises(ConfigError):
        run_replay(path, workspace=workspace, config_path=config, out=io.StringIO())


def test_a_dry_run_refuses_an_id_repeated_in_a_turn_as_a_real_run_does(tmp_path, workspace):
    turn = json.loads(json.dumps(CHAT))
    calls = turn["choices"][0]["message"]["tool_calls"]
    search = {"name": "repo__search", "arguments": '{"query": "notes"}'}
    calls.append({**calls[0], "function": search})  # the same id as the first call
    calls.append({**calls[0], "id": "call_other"})
    path = write(tmp_path / "session.jsonl", turn)

    _, judged, _ = replay(path, workspace, dry_run=True)
    _, ran, _ = replay(path, workspace)

    assert [row["verdict"] for row in judged] == ["ALLOWED", "INVALID_ARGUMENTS", "ALLOWED"]
    assert judged[1]["errorCode"] == ErrorCode.DUPLICATE_CALL_ID
    assert {key: value for key, value in judged[1].items() if key != "verdict"} == ran[1]


def test_a_dry_run_masks_a_refusal_as_a_real_run_does(tmp_path, workspace):
    """An unknown tool's name is echoed in the refusal: a token in it is masked."""
    turn = json.loads(json.dumps(CHAT))
    calls = turn["choices"][0]["message"]["tool_calls"]
    token = "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
    calls[:] = [{**calls[0], "function": {"name": f"x {token}", "arguments": "{}"}}]
    path = write(tmp_path / "session.jsonl", turn)

    _, judged, _ = replay(path, workspace, dry_run=True)
    _, ran, _ = replay(path, workspace)

    assert judged[0]["errorCode"] == ran[0]["errorCode"]
    assert token not in judged[0]["safeMessage"]
    assert judged[0]["safeMessage"] == ran[0]["safeMessage"]


@pytest.mark.parametrize("dry_run", [True, False])
def test_calls_of_bridged_tools_are_judged_and_run_as_serve_would(tmp_path, workspace, dry_run):
    """A recorded call of a bridged tool (fx__echo) is judged with the configured MCP
    servers connected, not refused as an unknown tool."""
    import sys

    fixture = Path(__file__).resolve().parents[1] / "mcp" / "fixtures" / "fixture_server.py"
    (workspace / "toolkernel.toml").write_text(
        f"""
[run]
profile = "full"
state = "EDITING"
[policy]
network = "allow"
approval = {{ external = "allow", mutating = "allow" }}
[[mcp.servers]]
name = "fx"
command = [{json.dumps(sys.executable)}, {json.dumps(str(fixture))}]
tools = ["echo"]
[[exposure]]
tools = ["*"]
"""
    )
    call = {"id": "call_1", "type": "function"}
    call["function"] = {"name": "fx__echo", "arguments": json.dumps({"message": "hi"})}
    response = {**CHAT, "choices": [{**CHAT["choices"][0]}]}
    response["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [call]}
    path = tmp_path / "conversation.jsonl"
    path.write_text(json.dumps(response) + "\n")
    code, rows, err = replay(path, workspace, dry_run=dry_run)
    assert code == EXIT_OK, err
    [row] = rows
    assert row["toolName"] == "fx.echo"
    if dry_run:
        assert row["verdict"] == "ALLOWED"
    else:
        assert row["status"] == "SUCCEEDED"

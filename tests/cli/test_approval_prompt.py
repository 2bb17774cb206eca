"""The terminal approval prompt: the human approves what they read."""

from __future__ import annotations

import io

import anyio

from toolkernel.approval import ApprovalRequest, TerminalApprover

# What a terminal acts on (U+009B is a CSI: "\x9b2J" clears the screen) or what hides
# or reorders text (U+202E turns "new\u202etxt.exe" into "newexe.txt" on screen).
HOSTILE = "\u202e\x9b\u2028\x1b"


def test_the_prompt_escapes_what_a_terminal_would_act_on_or_reorder() -> None:
    held = ApprovalRequest(
        run_id="run_1",
        tool_call_id="call_1",
        tool_name=f"fx.patch{HOSTILE}",
        tool_version=f"1.0{HOSTILE}",
        arguments={"path": "new\u202etxt.exe", "edits": [{"replace": "x\x9b2J"}]},
        reasons=(f"the server says{HOSTILE}",),
    )
    shown = io.StringIO()
    approver = TerminalApprover(stdin=io.StringIO("n\n"), stderr=shown)

    decision = anyio.run(approver, held)

    prompt = shown.getvalue()
    assert not set(HOSTILE) & set(prompt)
    assert '"path": "new\\u202etxt.exe"' in prompt
    assert '"replace": "x\\u009b2J"' in prompt
    assert "fx.patch\\u202e\\x9b" in prompt
    assert decision.approved is False

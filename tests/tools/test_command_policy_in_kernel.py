"""shell.run's command policy acts before dispatch: deny in validation, ask in approval."""

from __future__ import annotations

from pathlib import Path

from toolkernel.codes import ErrorCode, Status
from toolkernel.ledger import EventType
from toolkernel.testing import RecordingApprover, event_types, make_kernel

CONFIG = """
[run]
profile = "developer"
state = "EDITING"

[[exposure]]
tools = ["*"]

[[sandbox.commands]]
prefix = ["pytest"]
action = "allow"

[[sandbox.commands]]
prefix = ["make", "deploy"]
action = "ask"
reason = "it deploys"
"""


def test_denied_command_is_invalid_and_never_started(tmp_path: Path):
    with make_kernel(tmp_path / "ws", CONFIG) as kernel:
        run = kernel.start_run()
        result = kernel.call_sync(run, "shell.run", {"argv": ["curl", "https://example.org"]})
        assert result.status is Status.INVALID_ARGUMENTS
        assert result.error_code is ErrorCode.COMMAND_NOT_ALLOWED
        assert "curl" in result.safe_message
        types = event_types(kernel.ledger.events(run.id), result.tool_call_id)
        assert EventType.TOOL_CALL_STARTED not in types


def test_wrapped_and_scripted_denials_are_caught(tmp_path: Path):
    with make_kernel(tmp_path / "ws", CONFIG) as kernel:
        run = kernel.start_run()
        for argv in (["env", "A=1", "/usr/bin/curl", "x"], ["sh", "-c", "echo hi && wget x"]):
            result = kernel.call_sync(run, "shell.run", {"argv": argv})
            assert result.error_code is ErrorCode.COMMAND_NOT_ALLOWED, argv


def test_asked_command_shows_the_full_command_to_the_approver(tmp_path: Path):
    approver = RecordingApprover(approve=False)
    with make_kernel(tmp_path / "ws", CONFIG, approver=approver) as kernel:
        run = kernel.start_run()
        result = kernel.call_sync(run, "shell.run", {"argv": ["make", "deploy", "--prod"]})
        assert result.error_code is ErrorCode.APPROVAL_REJECTED
        (held,) = approver.requests
        assert held.arguments["argv"] == ["make", "deploy", "--prod"]
        assert any(
            "make deploy --prod" in reason and "it deploys" in reason for reason in held.reasons
        )


def test_asked_command_without_an_approver_is_denied(tmp_path: Path):
    with make_kernel(tmp_path / "ws", CONFIG) as kernel:
        run = kernel.start_run()
        result = kernel.call_sync(run, "shell.run", {"argv": ["git", "push", "origin"]})
        assert result.error_code is ErrorCode.APPROVAL_REQUIRED


def test_approved_command_runs(tmp_path: Path):
    approver = RecordingApprover(approve=True)
    with make_kernel(tmp_path / "ws", CONFIG, approver=approver) as kernel:
        run = kernel.start_run()
        result = kernel.call_sync(run, "shell.run", {"argv": ["make", "deploy"]})
        # make runs (and fails: there is no Makefile) — the point is that it ran.
        assert result.status is Status.FAILED
        assert result.error_code is ErrorCode.PROCESS_EXIT_NONZERO

"""Arguments the schema cannot judge alone are refused in validation: no STARTED event."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolkernel.codes import ErrorCode, Status
from toolkernel.ledger import EventType
from toolkernel.testing import event_types, make_kernel

CONFIG = """
[run]
profile = "developer"
state = "EDITING"

[[exposure]]
tools = ["*"]
"""
NO_ARTIFACT = "sha256:" + "0" * 64
OTHER_FILE_DIFF = "--- a/other.txt\n+++ b/other.txt\n@@ -1 +1 @@\n-a\n+b\n"


@pytest.mark.parametrize(
    ("tool", "arguments", "code", "prop"),
    [
        ("shell.run", {"argv": [""]}, ErrorCode.COMMAND_NOT_ALLOWED, "argv"),
        ("shell.run", {"argv": ["", "-c", "true"]}, ErrorCode.COMMAND_NOT_ALLOWED, "argv"),
        (
            "file.patch",
            {"path": "b.txt", "diff": "x", "edits": []},
            ErrorCode.SCHEMA_VIOLATION,
            "diff",
        ),
        ("file.patch", {"path": "b.txt"}, ErrorCode.SCHEMA_VIOLATION, "diff"),
        (
            "file.patch",
            {"path": "a.txt", "baseHash": "md5:abc", "edits": []},
            ErrorCode.SCHEMA_VIOLATION,
            "baseHash",
        ),
        (
            "file.patch",
            {"path": "a.txt", "baseHash": "sha256:" + "0" * 64, "diff": OTHER_FILE_DIFF},
            ErrorCode.SCHEMA_VIOLATION,
            "diff",
        ),
        ("file.patch", {"path": "a.txt", "diff": "no hunk"}, ErrorCode.SCHEMA_VIOLATION, "diff"),
        (
            "file.patch",
            {"path": "a.txt", "diff": "@@ -" + "9" * 5000 + " +1 @@\n+x\n"},
            ErrorCode.SCHEMA_VIOLATION,
            "diff",
        ),
        (
            "file.read",
            {"path": "a.txt", "startLine": 5, "endLine": 2},
            ErrorCode.OUT_OF_BOUNDS,
            "endLine",
        ),
        (
            "artifact.read",
            {"artifactId": NO_ARTIFACT, "startByte": 5, "endByte": 1},
            ErrorCode.OUT_OF_BOUNDS,
            "endByte",
        ),
        (
            "artifact.read",
            {"artifactId": NO_ARTIFACT, "startByte": 5, "endByte": 5},
            ErrorCode.OUT_OF_BOUNDS,
            "endByte",
        ),
        (
            "artifact.read",
            {"artifactId": NO_ARTIFACT, "startLine": 5, "endLine": 4},
            ErrorCode.OUT_OF_BOUNDS,
            "endLine",
        ),
        (
            "artifact.read",
            {"artifactId": NO_ARTIFACT, "startByte": 0, "endLine": 4},
            ErrorCode.SCHEMA_VIOLATION,
            "startLine",
        ),
    ],
)
def test_an_argument_the_tool_cannot_take_is_refused_before_the_call_starts(
    tmp_path: Path, tool: str, arguments: dict[str, Any], code: ErrorCode, prop: str
):
    with make_kernel(tmp_path / "ws", CONFIG) as kernel:
        (tmp_path / "ws" / "a.txt").write_text("a\n")
        run = kernel.start_run()
        result = kernel.call_sync(run, tool, arguments)
        assert (result.status, result.error_code) == (Status.INVALID_ARGUMENTS, code)
        assert f"'{prop}'" in result.safe_message
        assert tool in result.safe_message
        types = event_types(kernel.ledger.events(run.id), result.tool_call_id)
        assert EventType.TOOL_CALL_STARTED not in types
        assert types[-1] is EventType.TOOL_CALL_RESULT

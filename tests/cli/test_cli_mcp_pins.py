"""mcp diff / mcp approve explain a tool that was rejected rather than held."""

from __future__ import annotations

from toolkernel.cli import main
from toolkernel.ledger import EventType, NewEvent, SqliteLedger
from toolkernel.mcp.bridge import ADMISSION_RUN_ID


def test_a_rejected_tool_is_explained_instead_of_not_found(capsys, workspace):
    with SqliteLedger(workspace / ".toolkernel" / "ledger.db") as ledger:
        rejected = {
            "server": "fx",
            "tool": "echo",
            "name": "fx.echo",
            "reasons": [
                {
                    "rule": "P101",
                    "message": "instructions aimed at the model",
                    "pointer": "/description",
                }
            ],
        }
        ledger.append(ADMISSION_RUN_ID, [NewEvent(EventType.REMOTE_TOOL_REJECTED, rejected)])
    for command in ("diff", "approve"):
        assert main(["mcp", command, "fx", "echo", "--workspace", str(workspace)]) == 2
        err = capsys.readouterr().err
        assert "awaits approval" in err
        assert "rejected its definition" in err
        assert "P101: instructions aimed at the model at /description" in err


def test_without_a_rejection_the_plain_message_stays(capsys, workspace):
    assert main(["mcp", "diff", "fx", "other", "--workspace", str(workspace)]) == 2
    err = capsys.readouterr().err
    assert "awaits approval" in err
    assert "rejected" not in err

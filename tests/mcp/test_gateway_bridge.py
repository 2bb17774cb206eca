"""The gateway serves bridged tools too: a real PyPI server (mcp-server-time) behind it."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent / "gateway_fixtures"))

from gateway_harness import PYTHON, ledger_events, make_workspace, stdio_client

from toolkernel.codes import ErrorCode
from toolkernel.ledger import EventType
from toolkernel.mcp.gateway_render import PROJECTION_META, RUN_META

# mcp-server-time is a dev dependency: make test installs it, so it is never skipped.

CONFIG = f"""\
[run]
profile = "full"

[policy]
network = "allow"

[[policy.rules]]
tools = ["time.*"]
action = "allow"

[[exposure]]
tools = ["*"]

[[mcp.servers]]
name = "time"
command = ["{PYTHON}", "-m", "mcp_server_time", "--local-timezone", "UTC"]
trust = "trusted"
"""


def test_a_bridged_tool_is_listed_called_and_governed_through_the_gateway(
    tmp_path: Path,
) -> None:
    workspace = make_workspace(tmp_path / "ws", config=CONFIG)

    async def main() -> None:
        async with stdio_client(workspace, mode="legacy") as client:
            listed = await client.list_tools()
            ok = await client.call_tool("time.get_current_time", {"timezone": "Europe/Paris"})
            bad = await client.call_tool("time.get_current_time", {"timezone": "UTC", "x": 1})
        names = {tool.name for tool in listed.tools}
        assert {"time.get_current_time", "time.convert_time", "repo.search"} <= names
        assert ok.is_error is False
        assert ok.structured_content is not None
        assert ok.structured_content["timezone"] == "Europe/Paris"
        assert bad.is_error is True
        assert bad.meta is not None
        assert bad.meta[PROJECTION_META]["errorCode"] == ErrorCode.UNKNOWN_PROPERTY
        assert listed.meta is not None
        assert ok.meta is not None
        call_id = ok.meta[PROJECTION_META]["toolCallId"]
        started = [
            e
            for e in ledger_events(workspace, listed.meta[RUN_META])
            if e.tool_call_id == call_id and e.type is EventType.TOOL_CALL_STARTED
        ]
        assert started[0].payload["executionMode"] == "REMOTE_MCP"

    anyio.run(main)

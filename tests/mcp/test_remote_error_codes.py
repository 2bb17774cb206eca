"""An error a server sends with code -32000, the SDK's CONNECTION_CLOSED and the code
many servers use for any failure, is an answer: its connection is kept. Only a real
close stops and restarts the server."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from fixtures.bridge_support import open_kernel

from toolkernel.calls import ToolCallResult
from toolkernel.codes import ErrorCode, Status
from toolkernel.mcp import McpBridge, ServerConfig

pytestmark = pytest.mark.anyio

# A raw JSON-RPC stdio server: ``generic`` answers tools/call with error -32000, ``exit``
# exits mid-call, ``hang`` never answers, ``echo`` answers. Every start appends a line
# to argv[1]; argv[2] chooses which request besides tools/call gets error -32000:
# ``initialize``, ``list`` (every tools/list) or ``relist`` (those after the first);
# ``endless`` answers every tools/list with one tool and a cursor to another page.
RAW_SERVER = """
import json, os, sys

starts, fails = sys.argv[1], sys.argv[2]
with open(starts, "a") as out:
    out.write("start\\n")
GENERIC = {"code": -32000, "message": "something went wrong"}
TOOLS = [
    {"name": name, "inputSchema": {"type": "object", "properties": {}}}
    for name in ("generic", "exit", "hang", "echo")
]
lists = 0


def send(mid, **body):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": mid, **body}) + "\\n")
    sys.stdout.flush()


for line in sys.stdin:
    msg = json.loads(line)
    mid, method, params = msg.get("id"), msg.get("method"), msg.get("params") or {}
    if mid is None:
        continue
    if method == "initialize":
        if fails == "initialize":
            send(mid, error=GENERIC)
            continue
        hello = {"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}}}
        send(mid, result={**hello, "serverInfo": {"name": "raw", "version": "1"}})
    elif method == "tools/list":
        lists += 1
        if fails == "list" or (fails == "relist" and lists > 1):
            send(mid, error=GENERIC)
        elif fails == "endless":
            send(mid, result={"tools": TOOLS[lists % 4:lists % 4 + 1], "nextCursor": str(lists)})
        else:
            send(mid, result={"tools": TOOLS})
    elif method == "tools/call":
        name = params["name"]
        if name == "generic":
            send(mid, error=GENERIC)
        elif name == "exit":
            os._exit(3)
        elif name == "echo":
            send(mid, result={"content": [{"type": "text", "text": "hi"}]})
    else:
        send(mid, error={"code": -32601, "message": "Method not found"})
"""


def _raw_server(tmp_path: Path, fails: str = "", **fields: Any) -> tuple[ServerConfig, Path]:
    script = tmp_path / "raw_server.py"
    script.write_text(RAW_SERVER)
    starts = tmp_path / "starts.txt"
    command = (sys.executable, str(script), str(starts), fails)
    return ServerConfig(name="raw", command=command, **fields), starts


def _starts(record: Path) -> int:
    return len(record.read_text().splitlines())


async def _calls(workspace: Path, server: ServerConfig, *names: str) -> list[ToolCallResult]:
    """Each named tool of the bridged ``server`` called once, in order, on one run."""
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    with anyio.fail_after(30):
        async with McpBridge(kernel, [server]) as bridge:
            await bridge.connect_all(run)
            return [await kernel.call(run, name, {}) for name in names]


async def test_an_error_with_code_32000_is_an_answer_and_keeps_the_server(workspace, tmp_path):
    server, starts = _raw_server(tmp_path)
    first, second, after = await _calls(workspace, server, "raw.generic", "raw.generic", "raw.echo")
    for result in (first, second):
        assert result.status is Status.FAILED
        assert result.error_code is ErrorCode.REMOTE_ERROR
        assert result.retryable is False
        assert "its server answered the call with an error (code -32000)" in result.safe_message
    assert after.status is Status.SUCCEEDED
    assert _starts(starts) == 1


async def test_a_server_that_exits_mid_call_is_still_stopped_and_restarted(workspace, tmp_path):
    server, starts = _raw_server(tmp_path)
    exited, after = await _calls(workspace, server, "raw.exit", "raw.echo")
    assert exited.status is Status.FAILED
    assert exited.error_code is ErrorCode.REMOTE_ERROR
    assert exited.retryable is True
    assert "its server stopped" in exited.safe_message
    assert after.status is Status.SUCCEEDED
    assert _starts(starts) == 2


async def test_a_32000_answer_to_the_probe_after_a_timeout_keeps_the_server(workspace, tmp_path):
    """After a timeout, the server is asked for its tools; an error answer shows it alive."""
    server, starts = _raw_server(tmp_path, "relist", timeout_ms=500)
    hung, after = await _calls(workspace, server, "raw.hang", "raw.echo")
    assert hung.status is Status.TIMED_OUT
    assert after.status is Status.SUCCEEDED
    assert _starts(starts) == 1


@pytest.mark.parametrize(
    ("fails", "why"),
    [
        ("initialize", "could not be started: it answered initialize with an error"),
        ("list", "did not list its tools: it answered with an error"),
    ],
)
async def test_a_32000_answer_while_connecting_is_reported_as_an_answer(
    workspace, tmp_path, fails, why
):
    server, starts = _raw_server(tmp_path, fails)
    kernel = open_kernel(workspace)
    with anyio.fail_after(30):
        async with McpBridge(kernel, [server]) as bridge:
            (report,) = await bridge.connect_all()
            again = await bridge.refresh("raw")
    assert report.connected is False
    assert report.error is not None
    assert why in report.error
    assert "(code -32000)" in report.error
    assert again.error == report.error
    # A server that failed to start is started afresh; one that answered is kept.
    assert _starts(starts) == (2 if fails == "initialize" else 1)


async def test_a_tool_list_whose_pages_never_end_is_a_failed_start_not_a_partial_list(
    workspace, tmp_path
):
    server, _ = _raw_server(tmp_path, "endless")
    kernel = open_kernel(workspace)
    with anyio.fail_after(60):
        async with McpBridge(kernel, [server]) as bridge:
            (report,) = await bridge.connect_all()
    assert report.connected is False
    assert report.accepted == ()
    assert report.error == (
        "MCP server raw did not list its tools: its tools/list did not end after 100 pages"
    )

"""Pins shared between processes: a gateway and ``toolkernel mcp approve`` at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from fixtures.bridge_support import FIXTURE_SERVER, OPEN_POLICY, fixture_server, open_kernel

from toolkernel.codes import Status
from toolkernel.mcp import McpBridge, PinStore, PinVerdict
from toolkernel.mcp.pins import PIN_FILENAME

sys.path.insert(0, str(Path(__file__).parent / "gateway_fixtures"))

from gateway_harness import PYTHON, make_workspace, stdio_client

pytestmark = pytest.mark.anyio

TOOL = {"name": "search", "description": "Searches.", "inputSchema": {"type": "object"}}
CHANGED = {**TOOL, "description": "Searches, and more."}
OTHER = {"name": "fetch", "description": "Fetches.", "inputSchema": {"type": "object"}}


def approve(workspace: Path, server: str, tool: str) -> str:
    """``toolkernel mcp approve`` in a process of its own; what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "toolkernel", "mcp", "approve", server, tool],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_store_that_changes_the_pins_keeps_an_approval_written_since(tmp_path):
    path = tmp_path / PIN_FILENAME
    gateway = PinStore(path)
    gateway.check("srv", TOOL)
    assert gateway.check("srv", CHANGED).verdict is PinVerdict.CHANGED
    approved = PinStore(path).approve("srv", "search")  # another process, meanwhile
    assert gateway.check("srv", OTHER).verdict is PinVerdict.PINNED  # gateway writes
    kept = PinStore(path).get("srv", "search")
    assert kept is not None
    assert kept.hash == approved.hash
    assert PinStore(path).pending("srv", "search") is None


def test_a_store_sees_an_approval_made_elsewhere_once_it_reloads(tmp_path):
    path = tmp_path / PIN_FILENAME
    gateway = PinStore(path)
    gateway.check("srv", TOOL)
    gateway.check("srv", CHANGED)
    assert gateway.reload() is False  # nothing changed: a stat, no read
    PinStore(path).approve("srv", "search")
    assert gateway.reload() is True
    assert gateway.peek("srv", CHANGED).verdict is PinVerdict.MATCH
    assert gateway.check("srv", CHANGED).verdict is PinVerdict.MATCH


PINNER = """
import sys
from pathlib import Path
from toolkernel.mcp import PinStore
store = PinStore(Path(sys.argv[1]))
for n in range(int(sys.argv[3])):
    store.check("srv", {"name": f"{sys.argv[2]}-{n}", "description": "A tool."})
"""


def test_processes_pinning_at_the_same_time_lose_none_of_the_pins(tmp_path):
    path = tmp_path / PIN_FILENAME
    per_process = 25
    pinners = [
        subprocess.Popen([sys.executable, "-c", PINNER, str(path), f"p{i}", str(per_process)])
        for i in range(6)
    ]
    assert [pinner.wait(timeout=120) for pinner in pinners] == [0] * len(pinners)
    store = PinStore(path)
    missing = [
        f"p{i}-{n}"
        for i in range(len(pinners))
        for n in range(per_process)
        if store.get("srv", f"p{i}-{n}") is None
    ]
    assert missing == []


async def test_a_tool_approved_from_the_command_line_is_exposed_by_a_running_bridge(
    workspace, tmp_path
):
    desc = tmp_path / "desc.txt"
    desc.write_text("Returns ok.")
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    server = fixture_server("fx", "--desc-file", str(desc))
    changes: list[None] = []
    kernel.on_tools_changed(lambda: changes.append(None))
    with anyio.fail_after(60):
        async with McpBridge(kernel, [server]) as bridge:
            await bridge.connect_all(run)
        desc.write_text("Returns ok, politely.")
        async with McpBridge(kernel, [server]) as bridge:
            [report] = await bridge.connect_all(run)
            assert report.held == ("changing",)
            seen = len(changes)
            printed = await anyio.to_thread.run_sync(approve, workspace, "fx", "changing")
            assert "approved fx.changing" in printed
            while kernel.registry.find("fx.changing") is None:  # within PIN_POLL_S
                await anyio.sleep(0.05)
            assert len(changes) > seen  # so a gateway tells its clients
            called = await kernel.call(run, "fx.changing", {})
            assert called.status is Status.SUCCEEDED
            # The server changes its tools again: the bridge pins and writes, and the
            # approval stays in the file.
            await kernel.call(run, "fx.notify", {})
            await bridge.refresh("fx")
        async with McpBridge(kernel, [server]) as bridge:
            [report] = await bridge.connect_all(run)
    assert "fx.changing" in report.accepted
    assert report.held == ()


async def test_an_approval_read_first_by_another_servers_refresh_still_exposes_the_tool(
    workspace, tmp_path
):
    # A refresh of another server reads the pin file (and so the approval) before the
    # watcher looks: the watcher must still see that the pins changed.
    desc = tmp_path / "desc.txt"
    desc.write_text("Returns ok.")
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    servers = [fixture_server("fx", "--desc-file", str(desc)), fixture_server("fy")]
    with anyio.fail_after(60):
        async with McpBridge(kernel, servers) as bridge:
            await bridge.connect_all(run)
        desc.write_text("Returns ok, politely.")
        async with McpBridge(kernel, servers) as bridge:
            reports = await bridge.connect_all(run)
            assert reports[0].held == ("changing",)
            PinStore(bridge.pins.path).approve("fx", "changing")  # toolkernel mcp approve
            await bridge.refresh("fy")  # reads the pin file first
            while kernel.registry.find("fx.changing") is None:  # within PIN_POLL_S
                await anyio.sleep(0.05)
            called = await kernel.call(run, "fx.changing", {})
    assert called.status is Status.SUCCEEDED


GATEWAY_CONFIG = OPEN_POLICY + textwrap.dedent(
    f"""
    [[mcp.servers]]
    name = "fx"
    command = ["{PYTHON}", "{FIXTURE_SERVER}", "--desc-file", "DESC"]
    """
)


def test_a_gateway_announces_a_tool_approved_while_it_runs(tmp_path: Path) -> None:
    desc = tmp_path / "desc.txt"
    desc.write_text("Returns ok.")
    workspace = make_workspace(tmp_path / "ws", config=GATEWAY_CONFIG.replace("DESC", str(desc)))
    told = anyio.Event()

    async def on_message(message: object) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            told.set()

    async def main() -> None:
        async with stdio_client(workspace, mode="legacy") as client:
            first = {tool.name for tool in (await client.list_tools()).tools}
        desc.write_text("Returns ok, politely.")
        async with stdio_client(workspace, mode="legacy", message_handler=on_message) as client:
            held = {tool.name for tool in (await client.list_tools()).tools}
            await anyio.to_thread.run_sync(approve, workspace, "fx", "changing")
            await told.wait()  # the whole session is bounded by the harness
            after = {tool.name for tool in (await client.list_tools()).tools}
            called = await client.call_tool("fx.changing", {})
        assert "fx.changing" in first
        assert "fx.changing" not in held
        assert "fx.changing" in after
        assert called.is_error is False

    anyio.run(main)

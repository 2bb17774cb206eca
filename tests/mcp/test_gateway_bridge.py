"""The gateway serves bridged tools too: a real PyPI server (mcp-server-time) behind it."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

sys.path.insert(0, str(Path(__file__).parent / "gateway_fixtures"))

from fixtures.bridge_support import FIXTURE_SERVER, OPEN_POLICY
from gateway_harness import PYTHON, ledger_events, make_workspace, stdio_client

from toolkernel.codes import ErrorCode
from toolkernel.context import ToolContext
from toolkernel.errors import LedgerError
from toolkernel.functions import tool
from toolkernel.ledger import EventType, SqliteLedger
from toolkernel.mcp import ADMISSION_RUN_ID
from toolkernel.mcp.gateway import Gateway, bridged, build_server
from toolkernel.mcp.gateway_render import PROJECTION_META, RUN_META
from toolkernel.testing import RecordingApprover, make_kernel

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


CHANGING_SERVER = f"""
[[mcp.servers]]
name = "fx"
command = ["{PYTHON}", "{FIXTURE_SERVER}", "--desc-file", "DESC"]
"""


def _list_changed_listener() -> tuple[anyio.Event, Callable[[object], Awaitable[None]]]:
    """An event set when the client is told ``notifications/tools/list_changed``, and
    the message handler that sets it."""
    told = anyio.Event()

    async def on_message(message: object) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            told.set()

    return told, on_message


def test_clients_are_told_when_a_bridged_server_changes_its_tools(tmp_path: Path) -> None:
    desc = tmp_path / "desc.txt"
    desc.write_text("Returns ok.")
    config = OPEN_POLICY + CHANGING_SERVER.replace("DESC", str(desc))
    workspace = make_workspace(tmp_path / "ws", config=config)
    told, on_message = _list_changed_listener()

    async def main() -> None:
        async with stdio_client(workspace, mode="legacy", message_handler=on_message) as client:
            capabilities = client.server_capabilities
            before = {tool.name for tool in (await client.list_tools()).tools}
            desc.write_text("Returns ok, politely.")  # a new definition: held until approved
            notified = await client.call_tool("fx.notify", {})
            await told.wait()  # the whole session is bounded by the harness
            after = {tool.name for tool in (await client.list_tools()).tools}
        assert capabilities is not None
        assert capabilities.tools is not None
        assert capabilities.tools.list_changed is True
        assert notified.is_error is False
        assert {"fx.changing", "fx.echo"} <= before
        assert "fx.changing" not in after
        assert "fx.echo" in after

    anyio.run(main)


START_TIMEOUT_MS = 8000
HANGING_SERVER = f"""
[[mcp.servers]]
name = "NAME"
command = ["{PYTHON}", "-c", "import time; time.sleep(60)"]
start_timeout_ms = {START_TIMEOUT_MS}
"""
HEALTHY_SERVER = f"""
[[mcp.servers]]
name = "fx"
command = ["{PYTHON}", "{FIXTURE_SERVER}"]
"""


def test_servers_that_hang_at_start_delay_the_gateway_by_one_start_timeout_not_the_sum(
    tmp_path: Path,
) -> None:
    hanging = [HANGING_SERVER.replace("NAME", name) for name in ("stuck1", "stuck2")]
    config = OPEN_POLICY + hanging[0] + HEALTHY_SERVER + hanging[1]
    workspace = make_workspace(tmp_path / "ws", config=config)

    async def main() -> tuple[float, set[str]]:
        began = time.monotonic()
        async with stdio_client(workspace, mode="legacy") as client:
            listed = await client.list_tools()
            took = time.monotonic() - began
            echoed = await client.call_tool("fx.echo", {"message": "still served"})
        assert echoed.is_error is False
        return took, {tool.name for tool in listed.tools}

    took, names = anyio.run(main)
    # One after the other, each hanging server costs its whole start timeout (and the
    # grace its process gets to exit): never less than the sum. Together they cost one
    # timeout and one grace. A generous bound, not a measure of speed.
    assert took < 2 * START_TIMEOUT_MS / 1000
    assert "fx.echo" in names
    assert not any(name.startswith("stuck") for name in names)


def test_list_changed_is_advertised_only_when_someone_announces(tmp_path: Path) -> None:
    kernel = make_kernel(make_workspace(tmp_path / "ws"), workspace_tools=False)

    async def capabilities(server: Any) -> Any:
        async with Client(server, mode="legacy") as client:
            return client.server_capabilities

    try:
        alone = anyio.run(capabilities, build_server(kernel))
        announced = anyio.run(capabilities, build_server(kernel, Gateway(kernel)))
    finally:
        kernel.close()
    assert alone.tools is not None
    assert not alone.tools.list_changed
    assert announced.tools is not None
    assert announced.tools.list_changed is True


def test_a_kernel_with_its_own_approver_keeps_it_over_elicitation(tmp_path: Path) -> None:
    from gateway_tools import erase

    approver = RecordingApprover(approve=True, name="operator")
    config = '[run]\nprofile = "full"\n\n[[exposure]]\ntools = ["*"]\n'
    kernel = make_kernel(tmp_path, config, approver=approver, workspace_tools=False)
    kernel.register(erase)
    asked: list[Any] = []

    async def elicit(_context: Any, params: Any) -> Any:
        asked.append(params)
        raise AssertionError("the client's user must not be asked")

    async def main() -> Any:
        server = build_server(kernel)
        async with Client(server, mode="legacy", elicitation_callback=elicit) as client:
            return await client.call_tool("fixture.erase", {"target": "build"})

    try:
        result = anyio.run(main)
    finally:
        kernel.close()
    assert result.is_error is False
    assert asked == []
    assert [r.tool_name for r in approver.requests] == ["fixture.erase"]


class _FailingLedger(SqliteLedger):
    """Stores until ``broken``; then every append fails, as a database that went away."""

    broken = False

    def append_batch(self, batches: Any) -> None:
        if self.broken:
            raise LedgerError("could not append a batch: server closed the connection")
        super().append_batch(batches)


def test_a_call_the_ledger_cannot_record_is_a_tool_error_not_a_protocol_error(
    tmp_path: Path, caplog: Any
) -> None:
    # It reached the client as MCPError "unhandled errors in a TaskGroup" before.
    ledger = _FailingLedger(tmp_path / "ledger.db")
    kernel = make_kernel(tmp_path / "ws", OPEN_POLICY, ledger=ledger, workspace_tools=False)

    async def main() -> Any:
        async with Client(build_server(kernel, Gateway(kernel)), mode="legacy") as client:
            ledger.broken = True
            unknown = await client.call_tool("x\x1b[2Jfake", {})
            assert unknown.is_error is True
            return await client.call_tool("memory.read", {})

    try:
        result = anyio.run(main)
    finally:
        ledger.broken = False
        kernel.close()
    assert result.is_error is True
    projection = result.meta[PROJECTION_META]
    assert projection["errorCode"] == ErrorCode.LEDGER_UNAVAILABLE
    assert projection["retryable"] is True
    assert "audit ledger" in result.content[0].text
    logged = [r.getMessage() for r in caplog.records if "could not be recorded" in r.getMessage()]
    assert len(logged) == 2
    assert not any("\x1b" in line for line in logged)  # a client's tool name, escaped


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_tool_listing_the_ledger_cannot_record_fails_without_naming_the_ledger(
    tmp_path: Path, caplog: Any, mode: Any
) -> None:
    """tools/list records TOOLS_EXPOSED: when it cannot, the client got the LedgerError's
    text as the error message, the ledger's host path in it. Now a safe message and
    the code; the operator's log has the reason."""
    path = tmp_path / "ledger.db"
    kernel = make_kernel(
        tmp_path / "ws", OPEN_POLICY, ledger=SqliteLedger(path), workspace_tools=False
    )

    async def main() -> tuple[Any, MCPError]:
        with anyio.fail_after(30):
            async with Client(build_server(kernel, Gateway(kernel)), mode=mode) as client:
                before = await client.list_tools()
                for file in tmp_path.glob("ledger.db*"):
                    file.unlink()
                with pytest.raises(MCPError) as raised:
                    await client.list_tools()
                return before, raised.value

    try:
        before, error = anyio.run(main)
    finally:
        kernel.close()
    assert before.tools
    assert error.code == types.INTERNAL_ERROR
    assert error.data == {"errorCode": ErrorCode.LEDGER_UNAVAILABLE, "retryable": True}
    assert str(tmp_path) not in error.message
    assert "audit ledger" in error.message
    logged = [r.getMessage() for r in caplog.records if r.name == "toolkernel.serve"]
    assert any("tools/list" in line and str(path) in line for line in logged)


def test_a_ledger_file_deleted_while_serving_fails_calls_instead_of_losing_them(
    tmp_path: Path,
) -> None:
    """SQLite goes on writing to an unlinked file: the calls after a deletion succeeded
    and were recorded nowhere. Now each is answered LEDGER_UNAVAILABLE."""
    path = tmp_path / "ledger.db"
    kernel = make_kernel(
        tmp_path / "ws", OPEN_POLICY, ledger=SqliteLedger(path), workspace_tools=False
    )

    async def main() -> tuple[Any, Any]:
        async with Client(build_server(kernel, Gateway(kernel)), mode="legacy") as client:
            before = await client.call_tool("memory.read", {})
            for file in tmp_path.glob("ledger.db*"):
                file.unlink()
            return before, await client.call_tool("memory.read", {})

    try:
        before, after = anyio.run(main)
    finally:
        kernel.close()
    assert before.is_error is False
    assert after.is_error is True
    assert after.meta[PROJECTION_META]["errorCode"] == ErrorCode.LEDGER_UNAVAILABLE


def test_progress_that_does_not_increase_is_not_passed_to_the_client(tmp_path: Path) -> None:
    """MCP: each progress notification must increase; a tool's step back is dropped for
    the client (the ledger keeps every report)."""

    @tool("job.wobbly")
    async def wobbly(ctx: ToolContext) -> str:
        """Report progress that goes back and forth."""
        for step in (1, 3, 2, 3, 4, -1, 5):
            ctx.progress(step, 5, f"at {step}")
        return "done"

    kernel = make_kernel(tmp_path / "ws", OPEN_POLICY, workspace_tools=False)
    kernel.register(wobbly)
    updates: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append(progress)

    async def main() -> Any:
        async with Client(build_server(kernel, Gateway(kernel)), mode="legacy") as client:
            return await client.call_tool("job.wobbly", {}, progress_callback=on_progress)

    try:
        result = anyio.run(main)
        recorded = [
            e.payload["progress"]
            for e in kernel.ledger.events(result.meta[RUN_META])
            if e.type is EventType.TOOL_CALL_PROGRESS
        ]
    finally:
        kernel.close()
    assert result.is_error is False
    assert updates == [1, 3, 4, 5]
    assert recorded == [1, 3, 2, 3, 4, -1, 5]


TOKEN = "ghp_" + "R8kT3mZq9XwL2vN7pB4sY6dF1hJ0cE5aG8uK"


def test_a_bridged_tool_named_with_a_secret_is_rejected_not_listed(tmp_path: Path) -> None:
    """Its name reached the client in clear (its description was masked)."""
    config = OPEN_POLICY + (
        f'[[mcp.servers]]\nname = "fx"\n'
        f'command = ["{PYTHON}", "{FIXTURE_SERVER}", "--named", "{TOKEN}"]\n'
    )
    workspace = make_workspace(tmp_path / "ws", config=config)

    async def main() -> types.ListToolsResult:
        async with stdio_client(workspace, mode="legacy") as client:
            return await client.list_tools()

    listed = anyio.run(main)
    assert "fx.echo" in {tool.name for tool in listed.tools}
    assert TOKEN not in listed.model_dump_json()
    [rejected] = [
        event
        for event in ledger_events(workspace, ADMISSION_RUN_ID)
        if event.type is EventType.REMOTE_TOOL_REJECTED
    ]
    assert rejected.payload["tool"] == TOKEN
    assert [(r["rule"], r["pointer"]) for r in rejected.payload["reasons"]] == [("SECRET", "/name")]


def test_a_server_down_when_serve_starts_is_served_once_it_is_up(tmp_path: Path) -> None:
    up = tmp_path / "up"
    late = (
        f'\n[[mcp.servers]]\nname = "late"\n'
        f"command = [\"sh\", \"-c\", \"test -f '{up}' && exec '{PYTHON}' '{FIXTURE_SERVER}'\"]\n"
    )
    workspace = make_workspace(tmp_path / "ws", config=OPEN_POLICY + late)
    told, on_message = _list_changed_listener()

    async def main() -> None:
        async with stdio_client(workspace, mode="legacy", message_handler=on_message) as client:
            before = {tool.name for tool in (await client.list_tools()).tools}
            up.touch()
            await told.wait()  # the whole session is bounded by the harness
            after = {tool.name for tool in (await client.list_tools()).tools}
            echoed = await client.call_tool("late.echo", {"message": "up now"})
        assert "late.echo" not in before
        assert "late.echo" in after
        assert echoed.is_error is False

    anyio.run(main)


def test_serve_names_the_bridged_tools_its_clients_are_not_shown_and_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Untrusted tools need the network permission, which the default profile lacks.
    config = (
        f"[[mcp.servers]]\nname = 'fx'\ncommand = ['{PYTHON}', '{FIXTURE_SERVER}']\n"
        "tools = ['echo', 'fail']\n"
    )
    kernel = make_kernel(tmp_path / "ws", config, workspace_tools=False)

    async def main() -> None:
        async with bridged(kernel):
            pass

    with kernel, caplog.at_level(logging.INFO, logger="toolkernel.serve"):
        anyio.run(main)
    notes = [r.getMessage() for r in caplog.records if r.name == "toolkernel.serve"]
    assert notes == [
        "bridged fx: connected; 2 tools accepted, 6 rejected, 0 held",
        "bridged fx: clients are not shown fx.echo, fx.fail (profile read-only lacks network)",
    ]

"""Stopping the bridge: nothing an unsandboxed server started outlives it, and a
shutdown does not take a server for stuck.

The fixture server's ``--children`` start helpers the way servers do (a language
server, a browser): one in the server's process group, one in a session of its own.
"""

from __future__ import annotations

import logging

import anyio
import pytest
from fixtures.bridge_support import (
    fixture_server,
    open_kernel,
    recorded_pids,
    running,
    wait_for_line,
)

from toolkernel.codes import ErrorCode, Status
from toolkernel.mcp import McpBridge

pytestmark = pytest.mark.anyio


async def test_closing_the_bridge_stops_what_an_unsandboxed_server_started(workspace, record):
    kernel = open_kernel(workspace)
    server = fixture_server("fx", "--record", str(record), "--children")
    with anyio.fail_after(30):
        async with McpBridge(kernel, [server]) as bridge:
            [report] = await bridge.connect_all()
            assert report.connected
            helpers = recorded_pids(record)
            assert sorted(helpers) == ["child", "daemon"]
            assert all(running(pid) for pid in helpers.values())
    # The server exits when its stdin closes; its helpers are stopped with it, the one
    # that left its session (setsid) too.
    assert {name: pid for name, pid in helpers.items() if running(pid)} == {}


async def test_kill_servers_kills_a_server_that_ignores_sigterm_and_its_helpers(workspace, record):
    kernel = open_kernel(workspace)
    server = fixture_server("fx", "--record", str(record), "--children", "--stubborn")
    with anyio.fail_after(30):
        async with McpBridge(kernel, [server]) as bridge:
            await bridge.connect_all()
            processes = recorded_pids(record)
            assert sorted(processes) == ["child", "daemon", "server"]
            bridge.kill_servers()
            while any(running(pid) for pid in processes.values()):
                await anyio.sleep(0.01)  # SIGKILLed: only reaping is left


async def test_closing_the_kernel_mid_call_does_not_report_the_server_stuck(
    workspace, record, caplog
):
    """Kernel.close() cancels the call RUNTIME_STOPPED: the server is not pinged to see
    whether it is stuck (nothing is restarted on a closed kernel), so the warning that it
    is restarted is not logged."""
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    server = fixture_server("fx", "--record", str(record), "--stuck")
    outcome = {}

    async def call() -> None:
        outcome["result"] = await kernel.call(run, "fx.stuck", {})

    with caplog.at_level(logging.WARNING, logger="toolkernel.mcp.bridge"):
        with anyio.fail_after(30):
            async with McpBridge(kernel, [server]) as bridge:
                await bridge.connect_all(run)
                async with anyio.create_task_group() as group:
                    group.start_soon(call)
                    await wait_for_line(record, "stuck")  # its whole server is blocked
                    kernel.close()
    result = outcome["result"]
    assert (result.status, result.error_code) == (Status.CANCELLED, ErrorCode.RUNTIME_STOPPED)
    assert [r.getMessage() for r in caplog.records if "not answering" in r.getMessage()] == []

"""REMOTE_ERROR messages advise a retry only when the failure is retryable."""

from __future__ import annotations

import sys

import anyio
import pytest
from fixtures.bridge_support import HERE, fixture_server, open_kernel

from toolkernel.codes import ErrorCode, Status
from toolkernel.mcp import McpBridge, ServerConfig

pytestmark = pytest.mark.anyio

RETRY_ADVICE = "It may work if called again."


async def test_an_error_answer_is_not_retryable_and_does_not_invite_a_retry(workspace):
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    rough = ServerConfig(name="rough", command=(sys.executable, str(HERE / "rough_server.py")))
    with anyio.fail_after(30):
        async with McpBridge(kernel, [rough]) as bridge:
            await bridge.connect_all(run)
            raised = await kernel.call(run, "rough.raise", {})
    assert raised.status is Status.FAILED
    assert raised.error_code is ErrorCode.REMOTE_ERROR
    assert raised.retryable is False
    assert RETRY_ADVICE not in raised.safe_message
    assert "again" in raised.safe_message  # it says that calling again will not help
    assert "error 0" not in raised.safe_message  # a code that says nothing is left out


async def test_a_lost_connection_is_retryable_and_says_so(workspace):
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    with anyio.fail_after(30):
        async with McpBridge(kernel, [fixture_server()]) as bridge:
            await bridge.connect_all(run)
            crashed = await kernel.call(run, "fx.crash", {})
    assert crashed.error_code is ErrorCode.REMOTE_ERROR
    assert crashed.retryable is True
    assert RETRY_ADVICE in crashed.safe_message

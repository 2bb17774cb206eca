"""What the kernel stores under idempotency keys verifies intact: the call that ran, a
duplicate that shared its result, a later call replayed from it, a conflicting reuse."""

from __future__ import annotations

import anyio
import pytest

from toolkernel.codes import ErrorCode, Status
from toolkernel.run import ToolCall

DEVELOPER = """
[run]
profile = "developer"
state = "EDITING"
[[exposure]]
tools = ["*"]
"""


@pytest.mark.anyio
async def test_every_use_of_a_key_the_kernel_records_verifies_intact(kernel_factory) -> None:
    kernel = kernel_factory(DEVELOPER)
    run = kernel.start_run()
    same = ToolCall("memory.read", {}, idempotency_key="k1")

    with anyio.fail_after(10):
        first, shared = await kernel.call_many(run, [same, same])
        replayed = await kernel.call(run, "memory.read", {}, idempotency_key="k1")
        other = await kernel.call(run, "memory.read", {"key": "x"}, idempotency_key="k1")

    assert [first.status, shared.status, replayed.status] == [Status.SUCCEEDED] * 3
    assert other.error_code is ErrorCode.IDEMPOTENCY_CONFLICT
    payloads = [e.payload for e in kernel.ledger.events(run.id)]
    assert any("sharedWith" in p for p in payloads)
    assert any("replayedFrom" in p for p in payloads)
    assert kernel.ledger.verify().problems == []

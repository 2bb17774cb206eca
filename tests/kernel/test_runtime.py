"""Section 24 runtime cases: timeouts, cancellation, retries, idempotency, output."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import hashlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import anyio
import pytest
from annotated_types import Ge

from toolkernel import dispatch as dispatch_module
from toolkernel.approval import ApprovalDecision, ApprovalRequest
from toolkernel.calls import ToolCallResult
from toolkernel.canonical import canonical_json
from toolkernel.codes import ErrorCode, Status
from toolkernel.context import ToolContext
from toolkernel.definition import ExecutionMode, RetryPolicy
from toolkernel.dispatch import NativeAdapter, Outcome
from toolkernel.errors import LedgerError, ToolFailed, UsageError
from toolkernel.functions import FunctionTool, tool
from toolkernel.kernel import Kernel
from toolkernel.ledger import EventType, SqliteLedger
from toolkernel.normalize import DEFAULT_CHAIN, Finishing
from toolkernel.run import Run, ToolCall
from toolkernel.testing import event_types

pytestmark = pytest.mark.anyio


async def test_async_tool_timeout_gives_timed_out_and_retryable(kernel_factory):
    kernel = kernel_factory()
    run = kernel.start_run()
    with anyio.fail_after(5):
        result = await kernel.call(run, "slow.wait", {"seconds": 30})
    assert result.status is Status.TIMED_OUT
    assert result.error_code is ErrorCode.TIMEOUT
    assert result.retryable is True
    assert "0.1 s" in result.safe_message


async def test_sync_tool_timeout_is_reported_and_its_token_is_cancelled(kernel_factory):
    kernel = kernel_factory()
    run = kernel.start_run()
    with anyio.fail_after(5):
        result = await kernel.call(run, "slow.block", {"seconds": 30})
    assert result.status is Status.TIMED_OUT


async def test_cancelling_a_call_stops_it_with_the_reason(kernel_factory):
    kernel = kernel_factory()

    @tool("slow.forever", idempotent=True, timeout_ms=60_000)
    async def forever() -> str:
        """Never finish."""
        await anyio.sleep(3600)
        return "never"

    kernel.register(forever)
    run = kernel.start_run()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            results = []

            async def call() -> None:
                results.append(await kernel.call(run, "slow.forever", {}, tool_call_id="c1"))

            group.start_soon(call)
            while not run.cancel_call("c1", ErrorCode.SUPERSEDED):
                await anyio.sleep(0.005)
    (result,) = results
    assert result.status is Status.CANCELLED
    assert result.error_code is ErrorCode.SUPERSEDED


async def test_after_the_run_is_cancelled_no_call_starts(kernel_factory, calls):
    kernel = kernel_factory()
    run = kernel.start_run()
    run.cancel(ErrorCode.BUDGET_EXHAUSTED)
    result = await kernel.call(run, "repo.lookup", {"query": "q"})
    assert (result.status, result.error_code) == (
        Status.CANCELLED,
        ErrorCode.BUDGET_EXHAUSTED,
    )
    assert calls.count == {}  # a sync tool would otherwise have run in its thread
    types = event_types(kernel.ledger.events(run.id), result.tool_call_id)
    assert EventType.TOOL_CALL_STARTED not in types


async def test_run_cancellation_reaches_sync_tools_through_the_token(kernel_factory):
    kernel = kernel_factory()
    started = threading.Event()

    @tool("slow.cooperative", timeout_ms=60_000)
    def cooperative(ctx: ToolContext) -> str:
        """Wait for cancellation."""
        started.set()
        ctx.token.wait(30)
        ctx.token.raise_if_cancelled()
        return "finished"

    kernel.register(cooperative)
    run = kernel.start_run()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            results = []

            async def call() -> None:
                results.append(await kernel.call(run, "slow.cooperative", {}))

            group.start_soon(call)
            await anyio.to_thread.run_sync(started.wait, 5)
            run.cancel(ErrorCode.BUDGET_EXHAUSTED)
    assert results[0].status is Status.CANCELLED
    assert results[0].error_code is ErrorCode.BUDGET_EXHAUSTED


async def test_tool_exception_is_failed_with_traceback_only_in_the_ledger(kernel_factory):
    kernel = kernel_factory()
    run = kernel.start_run()
    result = await kernel.call(run, "tool.crash", {})
    assert result.status is Status.FAILED
    assert result.error_code is ErrorCode.TOOL_ERROR
    projected = json.dumps(result.projection())
    assert "Traceback" not in projected
    assert "secret internal detail" not in projected
    assert "RuntimeError" in result.safe_message
    final = kernel.ledger.events(run.id)[-1]
    assert "secret internal detail" in final.payload["internal"]["traceback"]


async def test_tool_failed_signal_keeps_its_safe_message(kernel_factory):
    kernel = kernel_factory()
    run = kernel.start_run()
    result = await kernel.call(run, "tool.fail", {})
    assert (result.status, result.error_code) == (Status.FAILED, ErrorCode.TOOL_ERROR)
    assert result.safe_message == "The thing is not there."


async def test_large_output_becomes_an_artifact_and_a_partial_projection(kernel_factory):
    kernel = kernel_factory()
    run = kernel.start_run()
    result = await kernel.call(run, "data.big", {"lines": 500})
    assert result.status is Status.PARTIAL
    assert result.error_code is ErrorCode.OUTPUT_TRUNCATED
    (ref,) = result.artifacts
    assert ref.id in result.safe_message
    assert len(canonical_json(result.structured_output)) <= 1024
    full = json.loads(kernel.artifacts.read(ref.id))
    assert len(full) == 500
    assert full[499].startswith("line 499")
    small = await kernel.call(run, "data.big", {"lines": 2})
    assert small.status is Status.SUCCEEDED
    assert small.artifacts == ()


async def test_output_that_breaks_its_contract_is_not_kept_as_an_artifact(kernel_factory):
    kernel = kernel_factory()

    strings = {"type": "array", "items": {"type": "string"}}

    @tool("data.liar", idempotent=True, max_output_bytes=1024, output_schema=strings)
    def liar() -> list[int]:
        """Promise strings, return numbers, far over the output budget."""
        return [123456789] * 2000

    kernel.register(liar)
    run = kernel.start_run()
    result = await kernel.call(run, "data.liar", {})
    assert (result.status, result.error_code) == (
        Status.FAILED,
        ErrorCode.OUTPUT_CONTRACT_VIOLATION,
    )
    assert result.structured_output is None
    assert result.artifacts == ()


async def test_a_known_secret_in_a_tools_traceback_is_masked_in_the_ledger(kernel_factory):
    """The traceback is kept for audit, with the text of the tool's exception; a value
    the runtime knows to be secret is masked there as everywhere the ledger keeps."""
    secret = "zq9-Internal-Db-Pass-77x"
    kernel = kernel_factory(secrets=[secret])

    @tool("db.connect")
    def connect() -> str:
        """Connect."""
        raise ConnectionError(f"auth failed for password {secret}")

    kernel.register(connect)
    run = kernel.start_run()
    result = await kernel.call(run, "db.connect", {})
    assert result.error_code is ErrorCode.TOOL_ERROR
    stored = kernel.ledger.events(run.id)[-1].payload
    assert secret not in json.dumps(stored)
    assert "auth failed for password" in json.dumps(stored["internal"])  # kept, masked


async def test_known_secret_and_host_paths_never_reach_the_projection(kernel_factory, workspace):
    secret = "ghp_" + "Z" * 36
    kernel = kernel_factory(secrets=[secret])

    @tool("env.show", idempotent=True)
    def show() -> dict[str, str]:
        """Show things."""
        return {
            "token": f"Authorization: Bearer {secret}",
            "where": f"{workspace}/src/app.py",
            "home": "/home/alice/.config/tool/settings.json",
        }

    kernel.register(show)
    run = kernel.start_run()
    result = await kernel.call(run, "env.show", {})
    projected = json.dumps(result.projection())
    assert secret not in projected
    assert str(workspace) not in projected
    assert "/home/alice" not in projected
    assert result.structured_output["where"] == "src/app.py"
    kinds = {notice.kind for notice in result.redactions}
    assert {"known-secret", "workspace-path", "host-path"} <= kinds
    # The projection says that something was withheld, and what kind.
    assert "[Redacted from this result:" in result.safe_message
    assert "known-secret" in result.safe_message
    final = kernel.ledger.events(run.id)[-1].payload["result"]
    assert {r["kind"] for r in final["redactions"]} == kinds


async def test_idempotent_tool_is_retried_on_retryable_failure(kernel_factory):
    attempts = []

    @tool("net.flaky", idempotent=True, retry=RetryPolicy(attempts=3, backoff_ms=1))
    def flaky() -> str:
        """Fail twice, then work."""
        attempts.append(1)
        if len(attempts) < 3:
            raise ToolFailed("busy", code=ErrorCode.REMOTE_ERROR)
        return "ok"

    kernel = kernel_factory()
    kernel.register(flaky)
    run = kernel.start_run()
    result = await kernel.call(run, "net.flaky", {})
    assert result.status is Status.SUCCEEDED
    assert result.usage.attempts == 3


async def test_non_idempotent_tool_is_retried_only_on_listed_codes(kernel_factory):
    attempts = []

    @tool(
        "job.submit",
        mutating=True,
        retry=RetryPolicy(attempts=3, backoff_ms=1, on=frozenset({ErrorCode.RATE_LIMITED})),
    )
    def submit() -> str:
        """Submit a job."""
        attempts.append(1)
        raise ToolFailed("remote said no", code=ErrorCode.REMOTE_ERROR)

    kernel = kernel_factory(
        """
        [run]
        profile = "workspace-write"
        [[exposure]]
        tools = ["*"]
        """
    )
    kernel.register(submit)
    run = kernel.start_run()
    result = await kernel.call(run, "job.submit", {})
    assert result.error_code is ErrorCode.REMOTE_ERROR
    assert len(attempts) == 1


@pytest.mark.parametrize(
    ("stop", "reason"),
    [
        (lambda run: run.cancel_call("slow-1", ErrorCode.SUPERSEDED), ErrorCode.SUPERSEDED),
        (lambda run: run.cancel(ErrorCode.BUDGET_EXHAUSTED), ErrorCode.BUDGET_EXHAUSTED),
    ],
)
async def test_a_call_stopped_while_it_waits_to_retry_ends_cancelled_not_failed(
    kernel_factory, stop, reason
):
    """Its last attempt timed out, which is retryable: ending with that would tell the
    model to try again a call the user cancelled or the budget stopped."""
    stopped_attempts = []

    @tool(
        "net.slow", idempotent=True, timeout_ms=100, retry=RetryPolicy(attempts=5, backoff_ms=5_000)
    )
    async def slow() -> str:
        """Answer late."""
        try:
            await anyio.sleep(30)
        finally:
            stopped_attempts.append(1)
        return "late"

    kernel = kernel_factory()
    kernel.register(slow)
    run = kernel.start_run()
    results: list[ToolCallResult] = []

    async def call() -> None:
        results.append(await kernel.call(run, "net.slow", {}, tool_call_id="slow-1"))

    async with anyio.create_task_group() as group:
        group.start_soon(call)
        while not stopped_attempts:  # the first attempt has timed out: the wait begins
            await anyio.sleep(0.01)
        stop(run)

    [result] = results
    assert (result.status, result.error_code) == (Status.CANCELLED, reason)
    assert not result.retryable
    assert result.usage.attempts == 1
    recorded = kernel.ledger.events(run.id)[-1].payload
    assert recorded["result"]["errorCode"] == str(reason)
    assert recorded["internal"]["attemptCodes"] == ["TIMEOUT"]


WRITER = """
[run]
profile = "workspace-write"
[[exposure]]
tools = ["*"]
"""


async def test_repeated_idempotency_key_returns_the_recorded_result(kernel_factory, calls):
    kernel = kernel_factory(WRITER)
    run = kernel.start_run()
    args = {"path": "src/a.py", "text": "x"}
    first = await kernel.call(run, "file.write", args, idempotency_key="k1")
    second = await kernel.call(run, "file.write", args, idempotency_key="k1")
    assert calls.count == {"file.write": 1}
    assert second.status is Status.SUCCEEDED
    assert second.structured_output == first.structured_output
    assert second.tool_call_id != first.tool_call_id
    types = event_types(kernel.ledger.events(run.id), second.tool_call_id)
    assert types == [EventType.TOOL_CALL_REQUEST, EventType.TOOL_CALL_RESULT]


async def _recorded_then_asked_again(kernel_factory, key: str, config: str = WRITER):
    """A file.write recorded under ``key`` by one kernel, then proposed again with the
    same key to a new kernel on the same ledger (with ``config``): its result."""
    args = {"path": "src/a.py", "text": "x"}
    first = kernel_factory(WRITER)
    await first.call(first.start_run(), "file.write", args, idempotency_key=key)
    first.close()
    second = kernel_factory(config)
    return await second.call(second.start_run(), "file.write", args, idempotency_key=key)


async def test_idempotency_key_survives_a_new_kernel_on_the_same_ledger(
    kernel_factory, calls, workspace
):
    result = await _recorded_then_asked_again(kernel_factory, "k2")
    assert result.status is Status.SUCCEEDED
    assert calls.count == {"file.write": 1}


@pytest.mark.parametrize(
    "now",
    [
        '[[policy.rules]]\ntools = ["file.write"]\naction = "deny"\nreason = "frozen"',
        '[policy]\npath_deny = ["src/**"]',
        "[budget]\nmax_calls = 0",
    ],
    ids=["deny rule", "path deny", "budget spent"],
)
async def test_a_recorded_result_is_served_only_to_a_call_the_policy_allows_now(
    kernel_factory, calls, now
):
    # A key is no pass: the policy changed since the result was recorded, and what it
    # denies now (the content, the action) is not handed out under the old key.
    result = await _recorded_then_asked_again(kernel_factory, "k9", WRITER + now)
    assert result.status is Status.DENIED
    assert result.structured_output is None
    assert calls.count == {"file.write": 1}


@pytest.mark.parametrize(
    "tamper",
    [
        # the index entry points at the call's REQUEST
        "UPDATE idempotency SET seq = :request",
        # the index entry points at an event that is gone (a deleted tail)
        "DELETE FROM events WHERE run_id = :run AND seq = :result",
        # the recorded result cannot be decoded
        "UPDATE events SET payload = CAST(payload AS BLOB) WHERE run_id = :run AND seq = :result",
    ],
    ids=["entry points at a request", "entry points at no event", "result stored as a blob"],
)
async def test_a_recorded_result_the_ledger_cannot_vouch_for_fails_the_call_without_running_it(
    kernel_factory, calls, workspace, tamper
):
    # Someone edited the ledger: the recorded result cannot be read, and running the
    # tool again could do twice what the key was there to do once.
    import sqlite3

    args = {"path": "src/a.py", "text": "x"}
    kernel = kernel_factory(WRITER)
    run = kernel.start_run()
    first = await kernel.call(run, "file.write", args, idempotency_key="k5")
    seqs = {
        e.type: e.seq for e in kernel.ledger.events(run.id) if e.tool_call_id == first.tool_call_id
    }
    with sqlite3.connect(kernel.config.ledger_path) as db:
        db.execute(
            tamper,
            {
                "run": run.id,
                "request": seqs[EventType.TOOL_CALL_REQUEST],
                "result": seqs[EventType.TOOL_CALL_RESULT],
            },
        )
    for _ in range(2):  # every repeat, not only the first
        again_run = kernel.start_run()
        again = await kernel.call(again_run, "file.write", args, idempotency_key="k5")
        assert (again.status, again.error_code) == (Status.FAILED, ErrorCode.INTERNAL_ERROR)
        types = event_types(kernel.ledger.events(again_run.id), again.tool_call_id)
        assert types == [EventType.TOOL_CALL_REQUEST, EventType.TOOL_CALL_RESULT]
    assert calls.count == {"file.write": 1}


async def test_a_key_whose_index_entry_was_deleted_runs_again_and_verify_says_so(
    kernel_factory, calls, workspace
):
    # Nothing but a scan of every event could find the result once its entry is gone,
    # so the call runs again; the ledger must then not verify intact, or the deletion
    # would leave no trace.
    import sqlite3

    args = {"path": "src/a.py", "text": "x"}
    kernel = kernel_factory(WRITER)
    run = kernel.start_run()
    await kernel.call(run, "file.write", args, idempotency_key="k6")
    with sqlite3.connect(kernel.config.ledger_path) as db:
        db.execute("DELETE FROM idempotency WHERE key = 'k6'")
    await kernel.call(kernel.start_run(), "file.write", args, idempotency_key="k6")
    assert calls.count == {"file.write": 2}
    problems = kernel.ledger.verify().problems
    assert [p.kind for p in problems] == ["index_mismatch"]
    assert "ran twice" in problems[0].detail


@contextlib.contextmanager
def two_processes(workspace: Path, job: FunctionTool) -> Iterator[tuple[Kernel, Kernel]]:
    """Two kernels on one ledger file stand for two processes: neither knows the
    other's running calls, only the ledger tells them apart."""
    from toolkernel.testing import make_kernel

    first, second = make_kernel(workspace, WRITER), make_kernel(workspace, WRITER)
    try:
        for kernel in (first, second):
            kernel.register(job)
        yield first, second
    finally:
        first.close()
        second.close()


async def test_a_key_running_in_another_process_is_refused_then_its_result_shared(workspace):
    # Two kernels on one ledger file stand for two processes: neither knows the other's
    # running calls, only the ledger's claim tells them apart.
    started, finish = anyio.Event(), anyio.Event()
    ran: list[str] = []

    @tool("job.deploy", mutating=True)
    async def deploy() -> str:
        """Deploy, slowly."""
        ran.append("deploy")
        started.set()
        await finish.wait()
        return "deployed"

    with two_processes(workspace, deploy) as (first, second):
        run_a, run_b = first.start_run(), second.start_run()
        results: list[ToolCallResult] = []

        async def original() -> None:
            results.append(await first.call(run_a, "job.deploy", {}, idempotency_key="d1"))

        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(original)
                await started.wait()
                busy = await second.call(run_b, "job.deploy", {}, idempotency_key="d1")
                finish.set()
            later = await second.call(run_b, "job.deploy", {}, idempotency_key="d1")
        assert (busy.status, busy.error_code, busy.retryable) == (
            Status.DENIED,
            ErrorCode.IDEMPOTENCY_IN_PROGRESS,
            True,
        )
        assert [r.structured_output for r in (*results, later)] == ["deployed", "deployed"]
        assert ran == ["deploy"]
        assert first.ledger.verify().ok


async def test_a_claim_is_renewed_while_its_call_runs_longer_than_the_lease(workspace, monkeypatch):
    # A slow call (or a slow batch, or a human approving) outlives the lease: the
    # kernel renews it, so another process still finds the key taken.
    from toolkernel import claims

    monkeypatch.setattr(claims, "LEASE_S", 0.3)
    monkeypatch.setattr(claims, "RENEW_S", 0.05)
    finish = anyio.Event()
    ran: list[str] = []

    @tool("job.migrate", mutating=True)
    async def migrate() -> str:
        """Migrate, slowly."""
        ran.append("migrate")
        await finish.wait()
        return "migrated"

    with two_processes(workspace, migrate) as (first, second):
        run_a, run_b = first.start_run(), second.start_run()

        async def original() -> None:
            await first.call(run_a, "job.migrate", {}, idempotency_key="m1")

        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(original)
                while not ran:
                    await anyio.sleep(0.01)
                await anyio.sleep(1.0)  # three leases and more
                busy = await second.call(run_b, "job.migrate", {}, idempotency_key="m1")
                finish.set()
        assert busy.error_code is ErrorCode.IDEMPOTENCY_IN_PROGRESS
        assert ran == ["migrate"]


async def test_reused_key_with_other_arguments_is_a_conflict(kernel_factory, calls):
    kernel = kernel_factory(WRITER)
    run = kernel.start_run()
    await kernel.call(run, "file.write", {"path": "src/a.py", "text": "x"}, idempotency_key="k")
    other = await kernel.call(
        run, "file.write", {"path": "src/a.py", "text": "y"}, idempotency_key="k"
    )
    assert other.error_code is ErrorCode.IDEMPOTENCY_CONFLICT
    assert calls.count == {"file.write": 1}


async def test_duplicates_arriving_at_the_same_moment_run_the_tool_once(kernel_factory):
    ran = []
    gate = anyio.Event()

    @tool("job.once", mutating=True)
    async def once() -> str:
        """Mutate once."""
        ran.append(1)
        await gate.wait()
        return "done"

    kernel = kernel_factory(WRITER)
    kernel.register(once)
    run_a, run_b = kernel.start_run(), kernel.start_run()
    results = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            for run in (run_a, run_b, run_a):

                async def call(run=run) -> None:
                    results.append(await kernel.call(run, "job.once", {}, idempotency_key="same"))

                group.start_soon(call)
            while not ran:
                await anyio.sleep(0.001)
            await anyio.sleep(0.01)
            gate.set()
    assert ran == [1]
    assert [r.status for r in results] == [Status.SUCCEEDED] * 3
    assert len({r.tool_call_id for r in results}) == 3


@pytest.mark.parametrize("how", ["call", "run"])
async def test_a_duplicate_waiting_for_its_original_can_be_cancelled(kernel_factory, how):
    """It stops waiting at once, CANCELLED; the original runs on and succeeds."""
    gate = anyio.Event()

    @tool("job.slow", mutating=True)
    async def slow() -> str:
        """Mutate slowly."""
        await gate.wait()
        return "done"

    kernel = kernel_factory(WRITER)
    kernel.register(slow)
    run_a, run_b = kernel.start_run(), kernel.start_run()
    results: dict[str, Any] = {}

    async def call(run: Any, call_id: str) -> None:
        results[call_id] = await kernel.call(
            run, "job.slow", {}, tool_call_id=call_id, idempotency_key="same"
        )

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(call, run_a, "orig")
            await anyio.sleep(0.05)
            group.start_soon(call, run_b, "dup")
            await anyio.sleep(0.05)
            if how == "call":
                assert run_b.cancel_call("dup")
            else:
                run_b.cancel()
            while "dup" not in results:
                await anyio.sleep(0.01)
            assert "orig" not in results  # the duplicate did not wait for it
            gate.set()
    assert results["orig"].status is Status.SUCCEEDED
    assert results["dup"].status is Status.CANCELLED
    assert results["dup"].error_code is ErrorCode.USER_CANCELLED
    [final] = [e for e in kernel.ledger.events(run_b.id) if e.type is EventType.TOOL_CALL_RESULT]
    assert final.payload["result"]["status"] == "CANCELLED"
    assert "sharedWith" not in final.payload


async def test_a_duplicate_in_the_batch_of_its_original_can_be_cancelled(kernel_factory):
    gate = anyio.Event()

    @tool("job.read", idempotent=True)
    async def read(q: str) -> dict[str, str]:
        """Read slowly."""
        await gate.wait()
        return {"q": q}

    kernel = kernel_factory()
    kernel.register(read)
    run = kernel.start_run()
    calls = [
        ToolCall("job.read", {"q": "x"}, tool_call_id=f"c{i}", idempotency_key="k")
        for i in range(2)
    ]
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:

            async def turn() -> None:
                results.extend(await kernel.call_many(run, calls))

            results: list[Any] = []
            group.start_soon(turn)
            await anyio.sleep(0.05)
            assert run.cancel_call("c1")
            gate.set()
    assert [r.status for r in results] == [Status.SUCCEEDED, Status.CANCELLED]


async def test_a_refused_call_can_no_longer_be_cancelled(kernel_factory):
    """cancel_call says False for a call already refused, while its turn goes on."""
    gate = anyio.Event()

    @tool("job.wait", idempotent=True)
    async def wait() -> str:
        """Wait."""
        await gate.wait()
        return "done"

    kernel = kernel_factory()
    kernel.register(wait)
    run = kernel.start_run()
    calls = [
        ToolCall("job.wait", {}, tool_call_id="c1"),
        ToolCall("no.such", {}, tool_call_id="c2"),
    ]
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:

            async def turn() -> None:
                results.extend(await kernel.call_many(run, calls))

            results: list[Any] = []
            group.start_soon(turn)
            await anyio.sleep(0.05)
            assert not run.cancel_call("c2")
            assert run.cancel_call("c1")
            gate.set()
    assert [r.error_code for r in results] == [ErrorCode.USER_CANCELLED, ErrorCode.UNKNOWN_TOOL]


async def test_duplicates_in_one_parallel_batch_share_the_first_result(kernel_factory):
    ran = []

    @tool("job.read", idempotent=True)
    async def read(q: str) -> dict[str, str]:
        """Read once."""
        ran.append(q)
        return {"q": q}

    kernel = kernel_factory()
    kernel.register(read)
    run = kernel.start_run()
    calls = [
        ToolCall("job.read", {"q": "x"}, tool_call_id=f"c{i}", idempotency_key="k")
        for i in range(3)
    ]
    with anyio.fail_after(5):  # waiting for an original in its own batch never returned
        results = await kernel.call_many(run, calls)
    assert ran == ["x"]
    assert [r.status for r in results] == [Status.SUCCEEDED] * 3
    assert [r.structured_output for r in results] == [{"q": "x"}] * 3
    shared = [e.payload.get("sharedWith") for e in kernel.ledger.events(run.id)]
    assert shared.count("c0") == 2
    assert kernel.ledger.verify().ok


def test_duplicates_from_runs_on_two_threads_run_the_tool_once(kernel_factory):
    # call_sync in threads: each thread has its own event loop, and the duplicate must
    # be woken from the other one.
    ran = []
    started = threading.Event()

    @tool("job.slow", mutating=True)
    def slow(text: str) -> dict[str, str]:
        """Mutate slowly."""
        ran.append(text)
        started.set()
        time.sleep(0.3)
        return {"echo": text}

    kernel = kernel_factory(WRITER)
    kernel.register(slow)
    results: dict[int, ToolCallResult] = {}

    def worker(index: int) -> None:
        run = kernel.start_run()
        results[index] = kernel.call_sync(run, "job.slow", {"text": "same"}, idempotency_key="k")

    first = threading.Thread(target=worker, args=(0,), daemon=True)
    second = threading.Thread(target=worker, args=(1,), daemon=True)
    first.start()
    assert started.wait(5)
    second.start()
    first.join(10)
    second.join(10)
    assert not second.is_alive(), "the duplicate on the other thread never woke"
    assert ran == ["same"]
    assert [results[i].status for i in (0, 1)] == [Status.SUCCEEDED] * 2
    assert results[1].structured_output == {"echo": "same"}


async def test_parallel_read_only_calls_overlap_and_the_ledger_keeps_model_order(kernel_factory):
    running = 0
    peak = 0

    @tool("read.slow", idempotent=True)
    async def slow_read(n: int) -> int:
        """Read slowly; later calls finish first."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.05 - n * 0.01)
        running -= 1
        return n

    kernel = kernel_factory()
    kernel.register(slow_read)
    run = kernel.start_run()
    calls = [ToolCall("read.slow", {"n": n}, tool_call_id=f"c{n}") for n in range(4)]
    with anyio.fail_after(5):
        results = await kernel.call_many(run, calls)
    assert [r.structured_output for r in results] == [0, 1, 2, 3]
    assert peak > 1
    finals = [
        e.tool_call_id for e in kernel.ledger.events(run.id) if e.type is EventType.TOOL_CALL_RESULT
    ]
    assert finals == ["c0", "c1", "c2", "c3"]


async def test_mutations_run_one_at_a_time_per_run(kernel_factory):
    running = 0
    peak = 0

    @tool("file.touch", mutating=True)
    async def touch(n: int) -> int:
        """Mutate slowly."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.01)
        running -= 1
        return n

    kernel = kernel_factory(WRITER)
    kernel.register(touch)
    run = kernel.start_run()
    calls = [ToolCall("file.touch", {"n": n}) for n in range(3)]
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(kernel.call_many, run, calls)
            group.start_soon(kernel.call_many, run, calls)
    assert peak == 1


def parallel_reads(limit: int) -> str:
    """A config with every tool shown and at most ``limit`` READ_ONLY calls at once."""
    return f"""
[concurrency]
max_parallel_reads = {limit}
[[exposure]]
tools = ["*"]
"""


async def test_concurrent_reads_are_bounded_by_configuration(kernel_factory):
    running = 0
    peak = 0

    @tool("read.wide", idempotent=True)
    async def wide(n: int) -> int:
        """Read."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.01)
        running -= 1
        return n

    kernel = kernel_factory(parallel_reads(2))
    kernel.register(wide)
    run = kernel.start_run()
    with anyio.fail_after(5):
        await kernel.call_many(run, [ToolCall("read.wide", {"n": n}) for n in range(6)])
    assert peak == 2


class _OneReadSlot:
    """A kernel with one parallel-read slot and a read, ``read.held``, whose call
    labelled "first" holds the slot until ``release`` is set. Each call is a
    ``kernel.call`` of its own, as a gateway's clients make them."""

    def __init__(self, kernel_factory: Any) -> None:
        self.release = anyio.Event()
        self.ran: list[str] = []
        self.results: dict[str, ToolCallResult] = {}

        @tool("read.held", idempotent=True)
        async def held(label: str) -> str:
            """Read; the first until released."""
            self.ran.append(label)
            if label == "first":
                await self.release.wait()
            return label

        self.kernel = kernel_factory(parallel_reads(1))
        self.kernel.register(held)
        self.run = self.kernel.start_run()

    async def call(self, label: str) -> None:
        arguments = {"label": label}
        self.results[label] = await self.kernel.call(
            self.run, "read.held", arguments, tool_call_id=label
        )

    async def start_both(self, group: Any, wait_s: float) -> None:
        """Start "first"; once it holds the slot, "second", admitted to wait for it for
        ``wait_s`` at least."""
        group.start_soon(self.call, "first")
        while self.ran != ["first"]:
            await anyio.sleep(0.01)
        group.start_soon(self.call, "second")
        await anyio.sleep(wait_s)


async def test_a_read_waiting_for_a_parallel_slot_is_cancelled_at_once_and_never_starts(
    kernel_factory,
):
    """The second read waits for the only slot. Cancelled, it ends now, not when the
    first read frees the slot, and it has no STARTED: it never started."""
    slot = _OneReadSlot(kernel_factory)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            await slot.start_both(group, 0.1)
            assert slot.run.cancel_call("second", ErrorCode.SUPERSEDED)
            while "second" not in slot.results:  # ends while the first holds the slot
                await anyio.sleep(0.01)
            slot.release.set()

    results = slot.results
    assert slot.ran == ["first"]
    assert (results["second"].status, results["second"].error_code) == (
        Status.CANCELLED,
        ErrorCode.SUPERSEDED,
    )
    assert results["second"].started_at is None
    assert results["first"].status is Status.SUCCEEDED
    events = slot.kernel.ledger.events(slot.run.id)
    kinds = [e.type for e in events if e.tool_call_id == "second"]
    assert kinds == [EventType.TOOL_CALL_REQUEST, EventType.TOOL_CALL_RESULT]
    assert slot.kernel.ledger.verify(slot.run.id).ok


async def test_a_read_that_waited_for_a_slot_is_recorded_as_started_when_it_got_one(
    kernel_factory,
):
    slot = _OneReadSlot(kernel_factory)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            await slot.start_both(group, 0.2)
            slot.release.set()

    started = {
        e.tool_call_id: e.payload["startedAt"]
        for e in slot.kernel.ledger.events(slot.run.id)
        if e.type is EventType.TOOL_CALL_STARTED
    }
    second = slot.results["second"]
    assert second.status is Status.SUCCEEDED
    assert started["second"] == second.started_at
    assert started["second"] >= slot.results["first"].finished_at  # not its admission
    assert slot.kernel.ledger.verify(slot.run.id).ok


def test_sync_api_works_without_an_event_loop(kernel_factory):
    kernel = kernel_factory()
    run = kernel.start_run()
    result = kernel.call_sync(run, "repo.lookup", '{"query": "x"}')
    assert result.status is Status.SUCCEEDED
    assert result.structured_output == {"query": "x", "limit": 10}


async def test_a_call_abandoned_while_it_waits_its_turn_is_forgotten(kernel_factory):
    kernel = kernel_factory()
    release = anyio.Event()

    @tool("slow.hold", mutating=True, timeout_ms=10_000)
    async def hold() -> str:
        """Hold the run's write turn until released."""
        await release.wait()
        return "done"

    kernel.register(hold)
    run = kernel.start_run()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(kernel.call, run, "slow.hold", {})
            await anyio.wait_all_tasks_blocked()
            with anyio.CancelScope() as waiting:
                waiting.cancel()  # it gives up at the run's gate, before admission
                await kernel.call(run, "slow.hold", {}, tool_call_id="w")
            assert waiting.cancelled_caught
            assert run.cancel_call("w") is False  # nothing of it was kept
            release.set()


async def test_a_call_of_a_later_segment_of_the_turn_can_be_cancelled_while_it_waits(
    kernel_factory,
):
    ran: list[str] = []

    @tool("slow.read", idempotent=True)
    async def read() -> str:
        """A read that takes a while."""
        await anyio.sleep(0.3)
        ran.append("read")
        return "read"

    @tool("job.write", mutating=True)
    async def write() -> str:
        """A write, which waits for the read before it."""
        ran.append("write")
        return "written"

    kernel = kernel_factory()
    kernel.register(read)
    kernel.register(write)
    run = kernel.start_run(profile="full")
    verdicts = []

    async def cancel_the_write() -> None:
        await anyio.sleep(0.1)  # the read runs, the write waits for its segment
        verdicts.append((run.has_call("W"), run.cancel_call("W")))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(cancel_the_write)
            results = await kernel.call_many(
                run,
                [
                    ToolCall("slow.read", {}, tool_call_id="R"),
                    ToolCall("job.write", {}, tool_call_id="W"),
                ],
            )
    assert verdicts == [(True, True)]
    assert [(r.status, r.error_code) for r in results] == [
        (Status.SUCCEEDED, None),
        (Status.CANCELLED, ErrorCode.USER_CANCELLED),
    ]
    assert ran == ["read"]
    assert not run.has_call("W")  # over: the id is free again
    again = await kernel.call(run, "job.write", {}, tool_call_id="W")
    assert again.status is Status.SUCCEEDED


async def test_an_id_open_in_another_turn_is_refused_in_every_segment(kernel_factory):
    kernel = kernel_factory()
    release = anyio.Event()

    @tool("slow.hold", idempotent=True)
    async def hold() -> str:
        """Hold until released."""
        await release.wait()
        return "held"

    kernel.register(hold)
    run = kernel.start_run(profile="full")
    results: list[ToolCallResult] = []

    async def turn() -> None:
        calls = [
            ToolCall("repo.reset", {}, tool_call_id="Y"),  # waits for the held read
            ToolCall("repo.lookup", {"query": "q"}, tool_call_id="X"),
        ]
        results.extend(await kernel.call_many(run, calls))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(partial(kernel.call, run, "slow.hold", {}, tool_call_id="X"))
            await anyio.wait_all_tasks_blocked()
            group.start_soon(turn)
            await anyio.wait_all_tasks_blocked()
            release.set()  # X's first call ends before the turn's second segment starts
    assert results[1].error_code is ErrorCode.DUPLICATE_CALL_ID


async def test_a_call_whose_caller_is_cancelled_still_gets_its_result_recorded(kernel_factory):
    """The ledger never ends mid-call: a cancelled caller's call is CANCELLED."""
    kernel = kernel_factory()
    run = kernel.start_run()
    with anyio.move_on_after(0.05):
        await kernel.call(run, "slow.wait", {"seconds": 5}, tool_call_id="call_cut")
    events = [e for e in kernel.ledger.events(run.id) if e.tool_call_id == "call_cut"]
    assert [e.type for e in events] == [
        EventType.TOOL_CALL_REQUEST,
        EventType.TOOL_CALL_STARTED,
        EventType.TOOL_CALL_RESULT,
    ]
    result = events[-1].payload["result"]
    assert (result["status"], result["errorCode"]) == ("CANCELLED", "USER_CANCELLED")
    assert events[-1].payload["internal"] == {"interrupted": "CancelledError"}
    report = kernel.ledger.verify()
    assert report.ok
    assert report.unfinished == []


async def test_only_whole_numbers_for_integer_only_parameters_become_int(kernel_factory):
    @tool("kinds.show")
    def show(n: int, either: Annotated[int, Ge(1)] | float = 1, maybe: int | None = None) -> str:
        """Show the argument types.

        Args:
            n: an integer.
            either: an integer or a float.
            maybe: an integer or nothing.
        """
        return f"{n!r} {either!r} {maybe!r}"

    kernel = kernel_factory()
    kernel.register(show)
    run = kernel.start_run()
    result = await kernel.call(run, "kinds.show", {"n": 3.0, "either": 2.5, "maybe": 4.0})
    assert result.structured_output == "3 2.5 4"


async def test_an_idempotency_key_held_by_an_interrupted_call_is_released(kernel_factory):
    """A duplicate waiting on a cut-short call must not wait forever."""
    kernel = kernel_factory()
    run = kernel.start_run()
    with anyio.move_on_after(0.05):
        await kernel.call(run, "slow.wait", {"seconds": 5}, idempotency_key="k1")
    with anyio.fail_after(5):
        again = await kernel.call(run, "slow.wait", {"seconds": 0.01}, idempotency_key="k1")
    assert again.status is Status.SUCCEEDED


async def test_a_failed_durable_write_is_retried_with_the_interrupted_result(
    kernel_factory, workspace
):
    """The REQUEST of a mutating call is not dropped when its write-ahead store fails;
    it is stored later with the call's RESULT, and no STARTED: the call never started
    (replay would call it dispatched)."""
    from toolkernel.errors import LedgerError
    from toolkernel.ledger import SqliteLedger

    class FailingOnce(SqliteLedger):
        failed = False

        def append_durable(self, batches):  # type: ignore[no-untyped-def]
            if not self.failed:
                self.failed = True
                raise LedgerError("disk full")
            super().append_durable(batches)

    ledger = FailingOnce(workspace / "flaky.db")
    config = '[run]\nprofile = "full"\nstate = "EDITING"\n[[exposure]]\ntools = ["*"]\n'
    kernel = kernel_factory(config, ledger=ledger)
    run = kernel.start_run()
    arguments = {"path": "notes.txt", "text": "x"}
    refused = await kernel.call(run, "file.write", arguments, tool_call_id="call_flaky")
    assert (refused.error_code, refused.retryable) == (ErrorCode.LEDGER_UNAVAILABLE, True)
    assert not (workspace / "notes.txt").exists()  # not stored: not run
    events = [e for e in ledger.events(run.id) if e.tool_call_id == "call_flaky"]
    assert [e.type for e in events] == [EventType.TOOL_CALL_REQUEST, EventType.TOOL_CALL_RESULT]
    assert events[-1].payload["result"]["errorCode"] == "LEDGER_UNAVAILABLE"
    report = ledger.verify()
    assert report.ok
    assert report.unfinished == []


class Unwritable(SqliteLedger):
    """A ledger that takes no events while ``locked``, as SQLite says it then: naming
    its host path."""

    locked = False

    def _refuse(self) -> None:
        if self.locked:
            raise LedgerError(f"could not append to {self._path}: database is locked")

    def append_batch(self, batches):  # type: ignore[no-untyped-def]
        self._refuse()
        super().append_batch(batches)

    def append_durable(self, batches):  # type: ignore[no-untyped-def]
        self._refuse()
        super().append_durable(batches)


async def test_a_call_the_ledger_cannot_record_is_ledger_unavailable_not_an_exception(
    kernel_factory, workspace, caplog
):
    """The result the error taxonomy promises, retryable, with nothing of the ledger's
    host path; the operator finds why in the log. The run goes on once it can store."""
    ledger = Unwritable(workspace / "locked.db")
    kernel = kernel_factory(ledger=ledger)
    run = kernel.start_run()
    ledger.locked = True

    result = await kernel.call(run, "repo.lookup", {"query": "a"}, tool_call_id="call_locked")
    [first, second] = await kernel.call_many(
        run, [ToolCall("repo.lookup", {"query": "b"}), ToolCall("repo.lookup", {"query": "c"})]
    )

    for refused in (result, first, second):
        assert refused.status is Status.FAILED
        assert (refused.error_code, refused.retryable) == (ErrorCode.LEDGER_UNAVAILABLE, True)
        assert "repo.lookup" in refused.safe_message
        assert str(workspace) not in json.dumps(refused.projection())
    assert result.tool_call_id == "call_locked"
    assert first.tool_call_id != second.tool_call_id
    assert "database is locked" in caplog.text
    ledger.locked = False
    again = await kernel.call(run, "repo.lookup", {"query": "d"})
    assert again.status is Status.SUCCEEDED


@pytest.mark.parametrize(
    ("tool_name", "arguments", "failing"),
    [
        ("file.write", {"path": "notes.txt", "text": "x"}, "append_durable"),
        ("repo.lookup", {"query": "a"}, "append_batch"),
    ],
)
async def test_results_stored_on_the_second_try_are_returned_not_an_error(
    kernel_factory, workspace, tool_name, arguments, failing
):
    """A lock another process held while the results were stored: once the retry
    stores them, the caller gets them (an error would have the call repeated, and a
    mutation done twice)."""
    from toolkernel.errors import LedgerError
    from toolkernel.ledger import SqliteLedger

    class BusyOnceAtTheResult(SqliteLedger):
        busy = False

        def _fail_once_at_the_result(self, batches) -> None:  # type: ignore[no-untyped-def]
            results = [e for _, events in batches for e in events]
            if not self.busy and results[-1].type is EventType.TOOL_CALL_RESULT:
                self.busy = True
                raise LedgerError("database is locked")

        def append_durable(self, batches):  # type: ignore[no-untyped-def]
            if failing == "append_durable":
                self._fail_once_at_the_result(batches)
            super().append_durable(batches)

        def append_batch(self, batches):  # type: ignore[no-untyped-def]
            if failing == "append_batch":
                self._fail_once_at_the_result(batches)
            super().append_batch(batches)

    ledger = BusyOnceAtTheResult(workspace / "busy.db")
    config = '[run]\nprofile = "full"\nstate = "EDITING"\n[[exposure]]\ntools = ["*"]\n'
    kernel = kernel_factory(config, ledger=ledger)
    run = kernel.start_run()

    result = await kernel.call(run, tool_name, arguments, tool_call_id="call_busy")

    assert ledger.busy
    assert result.status is Status.SUCCEEDED
    [stored] = [e for e in ledger.events(run.id) if e.type is EventType.TOOL_CALL_RESULT]
    assert stored.payload["result"]["status"] == "SUCCEEDED"
    assert ledger.verify().ok


async def test_calls_an_interrupted_turn_never_started_are_recorded_cancelled(
    kernel_factory, calls
):
    """Every proposal is recorded: the caller cancelled during the turn's first
    segment, the later segments never ran, and their calls still have a REQUEST and a
    CANCELLED RESULT (they were missing from the ledger)."""
    kernel = kernel_factory('[run]\nprofile = "workspace-write"\n[[exposure]]\ntools = ["*"]\n')
    run = kernel.start_run()
    turn = [
        ToolCall("slow.wait", {"seconds": 0.09}, tool_call_id="call_a"),
        ToolCall("repo.reset", {}, tool_call_id="call_b"),
        ToolCall("repo.lookup", {"query": "x"}, tool_call_id="call_c"),
    ]
    with anyio.move_on_after(0.03):
        await kernel.call_many(run, turn)

    events = kernel.ledger.events(run.id)
    for call_id in ("call_b", "call_c"):
        kinds = [e.type for e in events if e.tool_call_id == call_id]
        assert kinds == [EventType.TOOL_CALL_REQUEST, EventType.TOOL_CALL_RESULT], call_id
        [result] = [
            e for e in events if e.tool_call_id == call_id and e.type is EventType.TOOL_CALL_RESULT
        ]
        assert result.payload["result"]["errorCode"] == "USER_CANCELLED"
    assert calls.count.get("repo.reset") is None
    report = kernel.ledger.verify(run.id)
    assert report.ok
    assert report.unfinished == []


async def test_a_call_cancelled_while_it_waits_for_the_runs_gate_is_recorded(kernel_factory):
    kernel = kernel_factory('[run]\nprofile = "workspace-write"\n[[exposure]]\ntools = ["*"]\n')

    @tool("slow.mutate", mutating=True)
    async def mutate() -> str:
        """Hold the run's gate a while."""
        await anyio.sleep(0.5)
        return "done"

    kernel.register(mutate)
    run = kernel.start_run()
    async with anyio.create_task_group() as group:
        group.start_soon(kernel.call, run, "slow.mutate", {})
        await anyio.sleep(0.1)  # the mutation holds the gate
        with anyio.move_on_after(0.1):
            await kernel.call(run, "repo.lookup", {"query": "x"}, tool_call_id="call_waiting")

    kinds = [e.type for e in kernel.ledger.events(run.id) if e.tool_call_id == "call_waiting"]
    assert kinds == [EventType.TOOL_CALL_REQUEST, EventType.TOOL_CALL_RESULT]
    assert kernel.ledger.verify(run.id).unfinished == []


class _Weird(BaseException):
    """Not an Exception: what some libraries raise to unwind."""


async def test_a_tool_raising_systemexit_or_a_baseexception_fails_alone(kernel_factory):
    """argparse or click in a tool raise SystemExit on arguments they dislike; the
    runtime (an MCP server process) must not exit or lose its task group over it."""

    @tool("odd.exit")
    def exits() -> str:
        """Exit."""
        raise SystemExit(2)

    @tool("odd.weird")
    async def weird() -> str:
        """Raise something that is not an Exception."""
        raise _Weird

    kernel = kernel_factory()
    kernel.register(exits)
    kernel.register(weird)
    run = kernel.start_run()
    for name in ("odd.exit", "odd.weird"):
        result = await kernel.call(run, name, {})
        assert (result.status, result.error_code) == (Status.FAILED, ErrorCode.TOOL_ERROR)
    after = await kernel.call(run, "repo.lookup", {"query": "still here"})
    assert after.status is Status.SUCCEEDED


@pytest.mark.parametrize("raised", [KeyboardInterrupt, StopIteration, GeneratorExit])
async def test_an_interrupt_a_sync_tool_raises_in_its_thread_fails_that_call_alone(
    kernel_factory, raised
):
    """A Ctrl-C never lands in a worker thread: this one is the tool's, and must not
    stop the caller's event loop (a gateway serving other calls) nor be recorded as a
    user's cancel. A StopIteration would leave the awaiting task asleep for ever."""

    @tool("odd.interrupt")
    def interrupt() -> str:
        """Raise something that is not an Exception."""
        raise raised

    kernel = kernel_factory()
    kernel.register(interrupt)
    run = kernel.start_run()
    result = await kernel.call(run, "odd.interrupt", {})
    assert (result.status, result.error_code) == (Status.FAILED, ErrorCode.TOOL_ERROR)
    assert f"raised {raised.__name__}" in result.safe_message
    recorded = kernel.ledger.events(run.id)[-1].payload
    assert raised.__name__ in recorded["internal"]["traceback"]
    after = await kernel.call(run, "repo.lookup", {"query": "still here"})
    assert after.status is Status.SUCCEEDED


async def test_a_cancelled_error_the_tool_raises_itself_is_a_tool_error(kernel_factory):
    # A library cancelled a future under the tool; nobody cancelled the call. The call
    # fails on its own, and its siblings and the caller are untouched.
    @tool("net.fetch")
    async def fetch() -> str:
        """Await a future that gets cancelled."""
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.cancel)
        await future
        return "never"

    @tool("net.sync")
    def sync() -> str:
        """Raise CancelledError in a worker thread."""
        raise asyncio.CancelledError

    kernel = kernel_factory()
    kernel.register(fetch)
    kernel.register(sync)
    run = kernel.start_run()
    results = await kernel.call_many(
        run,
        [
            ToolCall("repo.lookup", {"query": "a"}),
            ToolCall("net.fetch", {}),
            ToolCall("net.sync", {}),
        ],
    )
    assert [(r.status, r.error_code) for r in results] == [
        (Status.SUCCEEDED, None),
        (Status.FAILED, ErrorCode.TOOL_ERROR),
        (Status.FAILED, ErrorCode.TOOL_ERROR),
    ]
    assert "CancelledError" in results[1].safe_message
    assert asyncio.current_task().cancelling() == 0
    tracebacks = [
        e.payload["internal"]["traceback"]
        for e in kernel.ledger.events(run.id)
        if e.type is EventType.TOOL_CALL_RESULT and "internal" in e.payload
    ]
    assert len(tracebacks) == 2
    assert all("CancelledError" in t for t in tracebacks)


# An async tool's deadline and token are armed at its first wait (until then nothing
# could stop it): the deadline still counts from the start, a cancel made before the
# first wait still stops it there, and what the task throws in reaches the tool.


async def test_an_async_tools_deadline_counts_from_its_start_not_its_first_wait(kernel_factory):
    @tool("slow.late", timeout_ms=300)
    async def late() -> str:
        """Block the loop, then wait."""
        time.sleep(0.25)  # no await yet: the deadline cannot fire during this
        await asyncio.sleep(0.2)  # 0.45 s from the start: past the 0.3 s deadline
        return "done"

    kernel = kernel_factory()
    kernel.register(late)
    run = kernel.start_run()
    with anyio.fail_after(5):
        result = await kernel.call(run, "slow.late", {})
    assert (result.status, result.error_code) == (Status.TIMED_OUT, ErrorCode.TIMEOUT)


async def test_a_call_cancelled_before_its_tools_first_wait_is_stopped_at_that_wait(
    kernel_factory,
):
    reached: list[str] = []

    @tool("self.cancel", timeout_ms=60_000)
    async def cancel_itself(ctx: ToolContext) -> str:
        """Cancel this very call, then wait."""
        assert ctx.run is not None
        assert ctx.run.cancel_call(ctx.tool_call_id)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            reached.append("cancelled at its first wait")
            raise
        return "never"

    kernel = kernel_factory()
    kernel.register(cancel_itself)
    run = kernel.start_run()
    with anyio.fail_after(5):
        result = await kernel.call(run, "self.cancel", {})
    assert (result.status, result.error_code) == (Status.CANCELLED, ErrorCode.USER_CANCELLED)
    assert reached == ["cancelled at its first wait"]
    assert asyncio.current_task().cancelling() == 0


async def test_a_tool_that_cleans_up_after_its_timeout_gets_to_await_while_it_does(
    kernel_factory,
):
    cleaned: list[str] = []

    @tool("slow.tidy", timeout_ms=100)
    async def tidy() -> str:
        """Wait past the deadline, then tidy up with awaits of its own."""
        await asyncio.sleep(0)  # a first wait that ends at once
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0)
            cleaned.append("tidied")
        return "never"

    kernel = kernel_factory()
    kernel.register(tidy)
    run = kernel.start_run()
    with anyio.fail_after(5):
        result = await kernel.call(run, "slow.tidy", {})
    assert (result.status, result.error_code) == (Status.TIMED_OUT, ErrorCode.TIMEOUT)
    assert cleaned == ["tidied"]
    assert asyncio.current_task().cancelling() == 0


async def test_a_tool_that_gives_up_after_its_timeout_fails_cleanly(kernel_factory):
    # It catches the deadline's CancelledError and raises an error of its own. What it
    # runs after its except block handles nothing, its error is not chained to the
    # cancellation, and the caller's task keeps no cancellation request of the kernel's.
    seen: list[object] = []

    @tool("slow.gives_up", timeout_ms=50)
    async def gives_up() -> str:
        """Wait past the deadline, then fail."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
        seen.append(sys.exc_info()[1])
        raise RuntimeError("gave up")

    kernel = kernel_factory()
    kernel.register(gives_up)
    run = kernel.start_run()
    with anyio.fail_after(5):
        result = await kernel.call(run, "slow.gives_up", {})
    assert (result.status, result.error_code) == (Status.FAILED, ErrorCode.TOOL_ERROR)
    assert seen == ["cancelled", None]
    assert asyncio.current_task().cancelling() == 0
    traceback = next(
        e.payload["internal"]["traceback"]
        for e in kernel.ledger.events(run.id)
        if e.type is EventType.TOOL_CALL_RESULT
    )
    assert "gave up" in traceback
    assert "CancelledError" not in traceback
    with pytest.raises(TimeoutError):  # the caller's own timeout still reads as one
        async with asyncio.timeout(0.01):
            await asyncio.sleep(5)


async def test_a_tool_that_raises_before_its_first_wait_fails_alone(kernel_factory):
    @tool("eager.fail")
    async def eager() -> str:
        """Fail before awaiting anything."""
        raise RuntimeError("no")

    @tool("eager.cancel")
    async def eager_cancel() -> str:
        """Raise CancelledError before awaiting anything."""
        raise asyncio.CancelledError

    kernel = kernel_factory()
    kernel.register(eager)
    kernel.register(eager_cancel)
    run = kernel.start_run()
    results = await kernel.call_many(
        run, [ToolCall("eager.fail", {}), ToolCall("eager.cancel", {})]
    )
    assert [(r.status, r.error_code) for r in results] == [
        (Status.FAILED, ErrorCode.TOOL_ERROR),
        (Status.FAILED, ErrorCode.TOOL_ERROR),
    ]
    assert asyncio.current_task().cancelling() == 0


def test_a_key_stays_claimed_until_its_result_is_stored(kernel_factory):
    # The key's result is known before the batch stores it (a sibling is still being
    # finished): a duplicate arriving then on another thread shares it, it does not
    # find the key free with nothing recorded and run the tool again.
    ran = []
    paid = threading.Event()

    @tool("pay.read", idempotent=True)
    def pay(amount: int) -> str:
        """Pay (counted)."""
        ran.append(amount)
        return "paid"

    @tool("other.read", idempotent=True)
    def other() -> str:
        """Something else."""
        return "other"

    def slow_sibling(outcome: Outcome, finishing: Finishing) -> Outcome:
        if finishing.tool.name == "pay.read":
            paid.set()
        elif finishing.tool.name == "other.read":
            time.sleep(0.3)
        return outcome

    kernel = kernel_factory(processors=(*DEFAULT_CHAIN, slow_sibling))
    kernel.register(pay)
    kernel.register(other)
    turn = [ToolCall("pay.read", {"amount": 5}, idempotency_key="K"), ToolCall("other.read", {})]
    batch = threading.Thread(
        target=lambda: anyio.run(kernel.call_many, kernel.start_run(), turn), daemon=True
    )
    batch.start()
    assert paid.wait(5)
    late = kernel.call_sync(kernel.start_run(), "pay.read", {"amount": 5}, idempotency_key="K")
    batch.join(5)
    assert late.status is Status.SUCCEEDED
    assert late.structured_output == "paid"
    assert ran == [5]


async def test_batches_holding_each_others_keys_do_not_wait_for_each_other(kernel_factory):
    # Run 1 holds K1 and waits for a human before K2; run 2 holds K2 and repeats K1.
    # Each call's result goes to the duplicates as soon as it is there, not when its
    # whole batch ends, so neither batch waits for the other.
    release = anyio.Event()

    async def human(request: ApprovalRequest) -> ApprovalDecision:
        await release.wait()
        return ApprovalDecision(True, "human")

    @tool("a.read", idempotent=True)
    async def read_a(q: str) -> str:
        """A."""
        return "a" + q

    @tool("b.read", idempotent=True)
    async def read_b(q: str) -> str:
        """B."""
        return "b" + q

    kernel = kernel_factory(
        '[run]\nprofile = "full"\n[policy]\nnetwork = "ask"\n[[exposure]]\ntools = ["*"]\n',
        approver=human,
    )
    kernel.register(read_a)
    kernel.register(read_b)
    first, second = kernel.start_run(), kernel.start_run()
    out = {}

    async def one() -> None:
        out[1] = await kernel.call_many(
            first,
            [
                ToolCall("a.read", {"q": "x"}, idempotency_key="K1"),
                ToolCall("web.fetch", {"url": "https://example.org"}),
                ToolCall("b.read", {"q": "x"}, idempotency_key="K2"),
            ],
        )

    async def two() -> None:
        await anyio.sleep(0.05)  # run 1 waits for the human, holding K1
        out[2] = await kernel.call_many(
            second,
            [
                ToolCall("b.read", {"q": "x"}, idempotency_key="K2"),
                ToolCall("a.read", {"q": "x"}, idempotency_key="K1"),
            ],
        )

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(one)
            group.start_soon(two)
            await anyio.sleep(0.2)
            release.set()
    assert [r.structured_output for r in out[2]] == ["bx", "ax"]
    assert [r.status for r in out[1]] == [Status.SUCCEEDED] * 3


CALLER_VALUE: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="unset")


async def test_a_tool_calling_the_kernel_on_its_own_run_fails_instead_of_waiting(
    kernel_factory,
):
    # Its batch holds the run: the nested call would wait for itself forever. A nested
    # call on a run of its own works, and sync tools see the caller's context.
    @tool("job.nested_async", mutating=True)
    async def nested_async(ctx: ToolContext) -> str:
        """Call the kernel on the same run."""
        result = await ctx.kernel.call(ctx.run, "repo.lookup", {"query": "x"})
        return str(result.status)

    @tool("job.nested_sync", mutating=True)
    def nested_sync(ctx: ToolContext) -> str:
        """Call the kernel on the same run from a worker thread."""
        return str(ctx.kernel.call_sync(ctx.run, "repo.lookup", {"query": "x"}).status)

    @tool("job.own_run", mutating=True)
    def own_run(ctx: ToolContext) -> str:
        """Call the kernel on a run of its own."""
        inner = ctx.kernel.start_run()
        looked = ctx.kernel.call_sync(inner, "repo.lookup", {"query": "x"})
        return f"{looked.status} {CALLER_VALUE.get()}"

    kernel = kernel_factory(WRITER)
    for nested in (nested_async, nested_sync, own_run):
        kernel.register(nested)
    run = kernel.start_run()
    CALLER_VALUE.set("from the caller")
    with anyio.fail_after(10):
        results = [
            await kernel.call(run, name, {})
            for name in ("job.nested_async", "job.nested_sync", "job.own_run")
        ]
    assert [r.error_code for r in results[:2]] == [ErrorCode.TOOL_ERROR] * 2
    assert results[2].structured_output == "SUCCEEDED from the caller"
    tracebacks = [
        e.payload["internal"]["traceback"]
        for e in kernel.ledger.events(run.id)
        if e.type is EventType.TOOL_CALL_RESULT and "internal" in e.payload
    ]
    assert all(
        "UsageError: a tool called the kernel on a run it is running in" in t for t in tracebacks
    )
    assert len(tracebacks) == 2


async def test_a_call_back_to_an_outer_run_fails_instead_of_waiting(kernel_factory):
    # run A's tool calls the kernel on run B, whose tool calls back on run A: A's batch
    # holds A, so that call would wait for itself as surely as a direct one.
    runs: dict[str, Run] = {}

    @tool("job.back_to_a")
    async def back_to_a(ctx: ToolContext) -> str:
        """Call the kernel on run A."""
        return str((await ctx.kernel.call(runs["A"], "repo.lookup", {"query": "x"})).status)

    @tool("job.via_b", mutating=True)
    async def via_b(ctx: ToolContext) -> str:
        """Call job.back_to_a on run B."""
        inner = await ctx.kernel.call(runs["B"], "job.back_to_a", {})
        return f"{inner.status} {inner.error_code}"

    kernel = kernel_factory(WRITER)
    kernel.register(back_to_a)
    kernel.register(via_b)
    runs["A"], runs["B"] = kernel.start_run(), kernel.start_run()
    with anyio.fail_after(10):
        result = await kernel.call(runs["A"], "job.via_b", {})
    assert result.status is Status.SUCCEEDED
    assert result.structured_output == "FAILED TOOL_ERROR"
    (inner,) = [
        e for e in kernel.ledger.events(runs["B"].id) if e.type is EventType.TOOL_CALL_RESULT
    ]
    assert "UsageError" in inner.payload["internal"]["traceback"]


async def test_processing_that_fails_for_one_call_spares_the_others_of_its_turn(
    kernel_factory,
):
    # The artifact store is full: the call with large output cannot keep it. That call
    # is FAILED/INTERNAL_ERROR; the call beside it keeps its result, and nothing raises.
    @tool("job.small")
    async def small() -> dict[str, int]:
        """Small output."""
        return {"ok": 1}

    @tool("job.large")
    async def large() -> dict[str, str]:
        """Output large enough to become an artifact."""
        await anyio.sleep(0.01)
        return {"data": "x" * 100_000}

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    kernel = kernel_factory()
    kernel.register(small)
    kernel.register(large)
    kernel.artifacts.put = full_disk  # type: ignore[method-assign]
    run = kernel.start_run()
    results = await kernel.call_many(
        run,
        [
            ToolCall("job.small", {}, tool_call_id="c1"),
            ToolCall("job.large", {}, tool_call_id="c2"),
        ],
    )
    assert [(r.status, r.error_code) for r in results] == [
        (Status.SUCCEEDED, None),
        (Status.FAILED, ErrorCode.INTERNAL_ERROR),
    ]
    assert "No space left" not in results[1].safe_message
    stored = {
        e.tool_call_id: e.payload
        for e in kernel.ledger.events(run.id)
        if e.type is EventType.TOOL_CALL_RESULT
    }
    assert stored["c1"]["result"]["status"] == "SUCCEEDED"
    assert "No space left on device" in stored["c2"]["internal"]["finishing"]
    assert kernel.ledger.verify().ok


async def test_a_task_a_tool_started_may_use_the_run_once_the_call_is_over(kernel_factory):
    # The nested-call guard is for the call's lifetime only: nothing waits for a task
    # that outlives it.
    later: list[ToolCallResult] = []
    done = anyio.Event()

    @tool("job.spawn")
    async def spawn(ctx: ToolContext) -> str:
        """Start background work that calls the kernel after this call."""

        async def background() -> None:
            await anyio.sleep(0.05)
            later.append(await ctx.kernel.call(ctx.run, "repo.lookup", {"query": "x"}))
            done.set()

        asyncio.get_running_loop().create_task(background())
        return "started"

    kernel = kernel_factory()
    kernel.register(spawn)
    run = kernel.start_run()
    assert (await kernel.call(run, "job.spawn", {})).status is Status.SUCCEEDED
    with anyio.fail_after(5):
        await done.wait()
    assert [r.status for r in later] == [Status.SUCCEEDED]


async def test_a_tool_that_changes_its_arguments_changes_only_its_own_copy(kernel_factory):
    seen = []

    @tool("job.mutate", idempotent=True, retry=RetryPolicy(attempts=2, backoff_ms=1))
    def mutate(terms: list[str], options: dict[str, list[str]]) -> str:
        """Change the arguments in place, fail once."""
        seen.append((list(terms), dict(options)))
        terms.append("added")
        options["extra"] = ["x"]
        if len(seen) == 1:
            raise ToolFailed("try again", code=ErrorCode.REMOTE_ERROR, retryable=True)
        return "ok"

    kernel = kernel_factory()
    kernel.register(mutate)
    run = kernel.start_run()
    args = {"terms": ["a"], "options": {"k": ["v"]}}
    result = await kernel.call(run, "job.mutate", args)
    assert result.status is Status.SUCCEEDED
    assert seen == [(["a"], {"k": ["v"]})] * 2  # the retry got the arguments as proposed
    (request,) = [
        e.payload for e in kernel.ledger.events(run.id) if e.type is EventType.TOOL_CALL_REQUEST
    ]
    assert request["arguments"] == {"terms": ["a"], "options": {"k": ["v"]}}
    assert request["argumentsHash"] == "sha256:" + hashlib.sha256(canonical_json(args)).hexdigest()


def _worker_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("toolkernel-worker-")}


def _hanging_and_writing(
    kernel_factory: Any, max_threads: int, release: threading.Event, ran: list[str]
) -> tuple[Kernel, Run]:
    """A kernel whose ``job.hang`` times out after 50 ms and holds its thread until
    ``release``, and whose ``job.write`` appends its tag to ``ran``."""

    @tool("job.hang", timeout_ms=50)
    def hang() -> str:
        """Hang until released."""
        release.wait(10)
        return "late"

    @tool("job.write", timeout_ms=5000, mutating=True)
    def write(tag: str) -> str:
        """Record a side effect."""
        ran.append(tag)
        return "written"

    kernel = kernel_factory(adapters={ExecutionMode.NATIVE: NativeAdapter(max_threads=max_threads)})
    kernel.register(hang)
    kernel.register(write)
    return kernel, kernel.start_run(profile="full")


async def test_sync_tools_still_run_after_many_hung_ones_were_abandoned(kernel_factory):
    # Each hung tool keeps its thread; once as many hung as the pool holds, every later
    # sync call used to time out without starting, and then run anyway.
    release = threading.Event()
    ran: list[str] = []
    kernel, run = _hanging_and_writing(kernel_factory, 2, release, ran)
    try:
        for _ in range(4):
            hung = await kernel.call(run, "job.hang", {})
            assert hung.status is Status.TIMED_OUT
        result = await kernel.call(run, "job.write", {"tag": "w1"})
        assert result.status is Status.SUCCEEDED
        assert ran == ["w1"]
    finally:
        release.set()


async def test_a_sync_call_with_every_thread_held_by_hung_tools_fails_at_once(
    kernel_factory, monkeypatch
):
    # Once the pool and its allowance for abandoned threads are all held by tools that
    # never returned, a queued call could only wait out its timeout and be reported
    # TIMED_OUT, as if the tool had run too long: it never started.
    monkeypatch.setattr(dispatch_module, "_MAX_ABANDONED", 2)
    release = threading.Event()
    ran: list[str] = []
    kernel, run = _hanging_and_writing(kernel_factory, 1, release, ran)
    try:
        for _ in range(3):  # the one thread, then the two kept past it
            hung = await kernel.call(run, "job.hang", {})
            assert hung.status is Status.TIMED_OUT
        started = time.monotonic()
        refused = await kernel.call(run, "job.write", {"tag": "w1"})
        assert time.monotonic() - started < 4  # not after its 5 s timeout
        assert refused.status is Status.FAILED
        assert refused.error_code is ErrorCode.INTERNAL_ERROR
        assert refused.retryable
        assert "worker thread" in refused.safe_message
        assert "did not return" in refused.safe_message
    finally:
        release.set()
    await anyio.sleep(0.3)  # the hung tools return: their threads are free again
    result = await kernel.call(run, "job.write", {"tag": "w2"})
    assert result.status is Status.SUCCEEDED
    assert ran == ["w2"]


async def test_a_queued_sync_call_fails_once_the_last_live_thread_is_abandoned(
    kernel_factory, monkeypatch
):
    # Queued while one thread still ran a tool, the call would wait out its own timeout
    # after that tool was abandoned too, and be reported TIMED_OUT without having run.
    monkeypatch.setattr(dispatch_module, "_MAX_ABANDONED", 1)
    release = threading.Event()
    ran: list[str] = []
    kernel, run = _hanging_and_writing(kernel_factory, 1, release, ran)

    @tool("job.hang_long", timeout_ms=1000)
    def hang_long() -> str:
        """Hang until released, with a longer timeout."""
        release.wait(10)
        return "late"

    kernel.register(hang_long)
    try:
        hung = await kernel.call(run, "job.hang", {})  # the first thread, abandoned
        assert hung.status is Status.TIMED_OUT
        results: dict[str, Any] = {}

        async def call(name: str, arguments: dict[str, Any]) -> None:
            results[name] = await kernel.call(kernel.start_run(profile="full"), name, arguments)

        started = time.monotonic()
        async with anyio.create_task_group() as group:
            group.start_soon(call, "job.hang_long", {})  # the last thread that may start
            await anyio.sleep(0.2)
            group.start_soon(call, "job.write", {"tag": "queued"})  # 5 s timeout
        assert time.monotonic() - started < 4
        assert results["job.hang_long"].status is Status.TIMED_OUT
        queued = results["job.write"]
        assert (queued.status, queued.error_code) == (Status.FAILED, ErrorCode.INTERNAL_ERROR)
        assert queued.retryable
        assert "worker thread" in queued.safe_message
        assert ran == []
    finally:
        release.set()


async def test_a_sync_call_that_timed_out_while_queued_never_runs(kernel_factory):
    release = threading.Event()
    ran: list[str] = []

    @tool("job.busy", timeout_ms=5000)
    def busy() -> str:
        """Hold the only worker thread."""
        release.wait(10)
        return "done"

    @tool("job.queued", timeout_ms=100)
    def queued() -> str:
        """Record that it ran."""
        ran.append("queued")
        return "ran"

    kernel = kernel_factory(adapters={ExecutionMode.NATIVE: NativeAdapter(max_threads=1)})
    kernel.register(busy)
    kernel.register(queued)
    run = kernel.start_run()

    async def free_the_thread_later() -> None:
        await anyio.sleep(0.5)  # well after job.queued timed out waiting in the queue
        release.set()

    async with anyio.create_task_group() as group:
        group.start_soon(free_the_thread_later)
        results = await kernel.call_many(
            run, [ToolCall("job.busy", {}), ToolCall("job.queued", {})]
        )
    assert [r.status for r in results] == [Status.SUCCEEDED, Status.TIMED_OUT]
    await anyio.sleep(0.2)  # time for the freed thread to take the queued job
    assert ran == []  # the model was told it was stopped: it must not run afterwards


async def test_closing_a_kernel_ends_its_idle_worker_threads(kernel_factory):
    before = _worker_threads()
    kernel = kernel_factory()
    run = kernel.start_run()
    results = await kernel.call_many(
        run, [ToolCall("repo.lookup", {"query": str(i)}) for i in range(3)]
    )
    assert all(r.status is Status.SUCCEEDED for r in results)
    assert _worker_threads() - before  # the sync tool ran on the kernel's workers
    kernel.close()
    deadline = time.monotonic() + 5
    while _worker_threads() - before and time.monotonic() < deadline:
        await anyio.sleep(0.01)
    assert not _worker_threads() - before


async def test_a_turn_does_not_free_an_id_another_turn_took_after_its_segment(kernel_factory):
    # call_many used to finish every id of its turn at the end, also one that its first
    # segment had freed and another turn had taken since: that call became uncancellable.
    kernel = kernel_factory()
    first_done, release_a, release_b = anyio.Event(), anyio.Event(), anyio.Event()

    @tool("a.write", mutating=True)
    async def a_write() -> str:
        """A fast write."""
        first_done.set()
        return "w"

    @tool("a.read", idempotent=True)
    async def a_read() -> str:
        """A slow read in the turn's second segment."""
        await release_a.wait()
        return "r"

    @tool("b.read", idempotent=True)
    async def b_read() -> str:
        """Another turn's long read."""
        await release_b.wait()
        return "b"

    for each in (a_write, a_read, b_read):
        kernel.register(each)
    run = kernel.start_run(profile="full")
    out: dict[str, Any] = {}

    async def turn_a() -> None:
        calls = [
            ToolCall("a.write", {}, tool_call_id="X"),
            ToolCall("a.read", {}, tool_call_id="Y"),
        ]
        out["a"] = await kernel.call_many(run, calls)

    async def turn_b() -> None:
        out["b"] = await kernel.call(run, "b.read", {}, tool_call_id="X")

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(turn_a)
            await first_done.wait()
            await anyio.wait_all_tasks_blocked()
            group.start_soon(turn_b)  # X is free again: the other turn takes it
            await anyio.wait_all_tasks_blocked()
            release_a.set()  # the first turn ends
            await anyio.wait_all_tasks_blocked()
            assert run.has_call("X")
            assert run.cancel_call("X") is True
            release_b.set()
    assert (out["b"].status, out["b"].error_code) == (Status.CANCELLED, ErrorCode.USER_CANCELLED)


async def test_the_pool_never_runs_more_sync_tools_than_max_threads_once_they_return(
    kernel_factory,
):
    release = threading.Event()
    running = 0
    most = 0
    lock = threading.Lock()

    @tool("job.hang", timeout_ms=50)
    def hang() -> str:
        """Hang until released."""
        release.wait(10)
        return "late"

    @tool("job.count", idempotent=True)
    def count() -> str:
        """Count how many run at once."""
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return "counted"

    kernel = kernel_factory(adapters={ExecutionMode.NATIVE: NativeAdapter(max_threads=1)})
    kernel.register(hang)
    kernel.register(count)
    run = kernel.start_run()
    assert (await kernel.call(run, "job.hang", {})).status is Status.TIMED_OUT
    assert (await kernel.call(run, "job.count", {})).status is Status.SUCCEEDED  # on a new thread
    release.set()  # the abandoned tool returns: its thread is one too many now
    await anyio.sleep(0.2)
    most = 0
    results = await kernel.call_many(run, [ToolCall("job.count", {}) for _ in range(4)])
    assert all(r.status is Status.SUCCEEDED for r in results)
    assert most == 1


def slow_tool(name: str, started: anyio.Event, **options: Any) -> FunctionTool:
    """An async tool that sets ``started`` and then sleeps: in flight when the kernel
    is closed under it."""

    @tool(name, **options)
    async def slowly() -> str:
        """Work slowly."""
        started.set()
        await anyio.sleep(30)
        return "late"

    return slowly


async def test_closing_the_kernel_stops_calls_in_flight_and_records_them(kernel_factory):
    """close() returned at once and closed the ledger under running calls: they raised
    LedgerError, a READ_ONLY call left no events, a mutating one no RESULT."""
    started = anyio.Event()
    slow_read = slow_tool("job.slow_read", started)

    @tool("job.slow_write", mutating=True)
    def slow_write(ctx: ToolContext) -> str:
        """Write slowly, watching the token."""
        ctx.token.wait(30)
        return "late"

    kernel = kernel_factory()
    kernel.register(slow_read)
    kernel.register(slow_write)
    reading, writing = kernel.start_run(), kernel.start_run(profile="full")
    results: dict[str, ToolCallResult] = {}

    async def call(run: Run, name: str) -> None:
        results[name] = await kernel.call(run, name, {})

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(call, reading, "job.slow_read")
            group.start_soon(call, writing, "job.slow_write")
            await started.wait()
            await anyio.sleep(0.1)
            kernel.close()
    for name, result in results.items():
        assert (result.status, result.error_code) == (
            Status.CANCELLED,
            ErrorCode.RUNTIME_STOPPED,
        ), name
    with pytest.raises(UsageError, match="closed"):
        await kernel.call(reading, "job.slow_read", {})
    reopened = kernel_factory()  # the same workspace and ledger file
    for run in (reading, writing):
        types = event_types(reopened.ledger.events(run.id))
        assert types[-1] is EventType.TOOL_CALL_RESULT
        assert types.count(EventType.TOOL_CALL_REQUEST) == 1
    assert reopened.ledger.verify().ok


def test_a_run_used_from_two_threads_at_once_is_a_usage_error_not_a_hang(kernel_factory):
    """Its gate belongs to the event loop of the first thread: the second waited on it
    forever (both threads stuck). Documented as unsupported; now it says so."""
    entered, release = threading.Event(), threading.Event()

    @tool("job.hold")
    def hold() -> str:
        """Hold until released."""
        entered.set()
        release.wait(10)
        return "held"

    kernel = kernel_factory()
    kernel.register(hold)
    run = kernel.start_run()
    outcome: list[object] = []
    first = threading.Thread(target=lambda: outcome.append(kernel.call_sync(run, "job.hold")))
    first.start()
    try:
        assert entered.wait(10)
        with pytest.raises(UsageError, match="another thread"):
            kernel.call_sync(run, "job.hold")
    finally:
        release.set()
        first.join(10)
    assert not first.is_alive()
    [result] = outcome
    assert isinstance(result, ToolCallResult)
    assert result.status is Status.SUCCEEDED
    # One thread after the other is fine, as it always was.
    assert kernel.call_sync(run, "job.hold").status is Status.SUCCEEDED


async def test_closing_during_a_turn_stops_its_later_segments_too(kernel_factory):
    """call_many of two mutating calls runs them one segment at a time: the second
    segment found the ledger closed, the turn raised, and the second call left no
    record (a review found it)."""
    started = anyio.Event()
    write_slowly = slow_tool("job.write_slowly", started, mutating=True)

    kernel = kernel_factory()
    kernel.register(write_slowly)
    run = kernel.start_run(profile="full")
    turn = [ToolCall("job.write_slowly", {}, tool_call_id=f"c{n}") for n in (1, 2)]
    outcome: list[ToolCallResult] = []

    async def take_turn() -> None:
        outcome.extend(await kernel.call_many(run, turn))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(take_turn)
            await started.wait()
            kernel.close()
    assert [(r.tool_call_id, r.status, r.error_code) for r in outcome] == [
        ("c1", Status.CANCELLED, ErrorCode.RUNTIME_STOPPED),
        ("c2", Status.CANCELLED, ErrorCode.RUNTIME_STOPPED),
    ]
    reopened = kernel_factory()
    recorded = [(e.tool_call_id, e.type) for e in reopened.ledger.events(run.id)]
    assert ("c2", EventType.TOOL_CALL_RESULT) in recorded
    assert reopened.ledger.verify().ok


async def test_a_failure_closing_the_ledger_does_not_replace_a_recorded_result(
    kernel_factory, caplog
):
    started = anyio.Event()
    read_slowly = slow_tool("job.read_slowly", started)

    kernel = kernel_factory()
    kernel.register(read_slowly)
    run = kernel.start_run()
    close_ledger = kernel.ledger.close

    def broken_close() -> None:
        close_ledger()
        raise OSError("the disk went away")

    kernel.ledger.close = broken_close  # type: ignore[method-assign]
    outcome: list[ToolCallResult] = []

    async def call() -> None:
        outcome.append(await kernel.call(run, "job.read_slowly", {}))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(call)
            await started.wait()
            kernel.close()
    [result] = outcome
    assert (result.status, result.error_code) == (Status.CANCELLED, ErrorCode.RUNTIME_STOPPED)
    assert any("closing the kernel" in r.getMessage() for r in caplog.records)


async def test_a_tool_name_longer_than_any_tool_has_is_recorded_cut_and_unknown(kernel_factory):
    """A client cannot grow the ledger by megabytes a call with a name (it was stored
    whole in the REQUEST and the RESULT)."""
    kernel = kernel_factory()
    run = kernel.start_run()
    name = "x" * 3_000_000

    result = await kernel.call(run, name, {})

    assert (result.status, result.error_code) == (Status.DENIED, ErrorCode.UNKNOWN_TOOL)
    stored = kernel.ledger.events(run.id)
    assert [e.type for e in stored] == [EventType.TOOL_CALL_REQUEST, EventType.TOOL_CALL_RESULT]
    assert stored[0].payload["toolName"] == "x" * 128 + "…"
    assert sum(len(json.dumps(e.payload)) for e in stored) < 10_000


class LockedLedger(SqliteLedger):
    """A ledger another process keeps locked for a while: key claims fail as often as
    asked."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.failing_claims = 0

    def claim_key(self, tool_name: str, key: str, owner: str, lease_s: float) -> bool:
        if self.failing_claims:
            self.failing_claims -= 1
            raise LedgerError("database is locked")
        return super().claim_key(tool_name, key, owner, lease_s)


async def test_a_call_whose_key_claim_failed_is_recorded_as_never_started(
    kernel_factory, calls, tmp_path
):
    """Its REQUEST is kept and concluded (FAILED/LEDGER_UNAVAILABLE) once the ledger can
    store, and no STARTED says it ran: it did not."""
    ledger = LockedLedger(tmp_path / "ledger.db")
    kernel = kernel_factory(WRITER, ledger=ledger)
    run = kernel.start_run()
    ledger.failing_claims = 1
    key = "k"
    refused = await kernel.call(
        run, "file.write", {"path": "a.txt", "text": "x"}, idempotency_key=key
    )
    assert refused.error_code is ErrorCode.LEDGER_UNAVAILABLE
    assert "file.write" not in calls.count
    kinds = [(e.type, e.payload.get("result", {}).get("errorCode")) for e in ledger.events(run.id)]
    assert kinds == [
        (EventType.TOOL_CALL_REQUEST, None),
        (EventType.TOOL_CALL_RESULT, "LEDGER_UNAVAILABLE"),
    ]
    assert ledger.verify().ok


async def test_a_worker_thread_that_cannot_start_is_the_runtime_s_failure_and_passes(
    kernel_factory, monkeypatch
):
    """Out of threads, a sync tool's call fails as INTERNAL_ERROR, retryable (the tool
    never ran); once threads start again, so do its calls (no place is held by a
    thread that never started)."""

    @tool("n.echo", timeout_ms=5_000)
    def echo(x: int) -> int:
        """Echo.

        Args:
            x: a number.
        """
        return x

    real_start = threading.Thread.start
    refusals = {"left": 20}  # more than the pool's threads

    def short_of_threads(thread: threading.Thread) -> None:
        if thread.name.startswith("toolkernel-worker") and refusals["left"] > 0:
            refusals["left"] -= 1
            raise RuntimeError("can't start new thread")
        real_start(thread)

    kernel = kernel_factory()
    kernel.register(echo)
    run = kernel.start_run()
    monkeypatch.setattr(threading.Thread, "start", short_of_threads)
    refused = [await kernel.call(run, "n.echo", {"x": i}) for i in range(20)]
    assert {(r.status, r.error_code, r.retryable) for r in refused} == {
        (Status.FAILED, ErrorCode.INTERNAL_ERROR, True)
    }
    with anyio.fail_after(5):
        again = await kernel.call(run, "n.echo", {"x": 7})
    assert (again.status, again.structured_output) == (Status.SUCCEEDED, 7)


async def test_call_sync_inside_a_running_event_loop_says_to_await_call(kernel_factory):
    kernel = kernel_factory()
    run = kernel.start_run()
    with pytest.raises(UsageError, match=r"await kernel\.call\(") as refused:
        kernel.call_sync(run, "memory.read", {})
    assert "running event loop" in str(refused.value)
    # Nothing of the refused call was proposed: the run takes the call when awaited.
    result = await kernel.call(run, "memory.read", {})
    assert result.status is Status.SUCCEEDED


def test_call_sync_from_an_event_loops_callback_says_to_await_call(kernel_factory):
    # In a callback no task runs, so sniffio sees no async library: the loop does.
    kernel = kernel_factory()
    run = kernel.start_run()
    raised: list[BaseException] = []

    def callback() -> None:
        try:
            kernel.call_sync(run, "memory.read", {})
        except BaseException as exc:  # inspected below
            raised.append(exc)

    async def main() -> None:
        asyncio.get_running_loop().call_soon(callback)
        await asyncio.sleep(0.05)

    asyncio.run(main())
    assert len(raised) == 1
    assert isinstance(raised[0], UsageError), repr(raised[0])
    assert "await kernel.call(" in str(raised[0])

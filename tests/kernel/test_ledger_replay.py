"""The ledger as the pipeline writes it, and replay from the ledger alone."""

from __future__ import annotations

import time

import anyio
import pytest

from toolkernel.codes import ErrorCode, Status
from toolkernel.context import ToolContext
from toolkernel.dispatch import Outcome
from toolkernel.errors import ToolFailed
from toolkernel.functions import tool
from toolkernel.kernel import Kernel
from toolkernel.ledger import EventType
from toolkernel.normalize import DEFAULT_CHAIN, Finishing
from toolkernel.replay import RecordedResults, exchanges
from toolkernel.run import ToolCall

pytestmark = pytest.mark.anyio


async def test_events_follow_the_pipeline_order_and_the_chain_verifies(kernel_factory):
    kernel = kernel_factory()
    run = kernel.start_run()
    kernel.expose(run)
    ok = await kernel.call(run, "repo.lookup", {"query": "LegacyClient"})
    bad = await kernel.call(run, "repo.lookup", {"query": "x", "sendSecrets": True})
    events = kernel.ledger.events(run.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [(e.type, e.tool_call_id) for e in events[1:]] == [
        (EventType.TOOL_CALL_REQUEST, ok.tool_call_id),
        (EventType.TOOL_CALL_STARTED, ok.tool_call_id),
        (EventType.TOOL_CALL_RESULT, ok.tool_call_id),
        (EventType.TOOL_CALL_REQUEST, bad.tool_call_id),
        (EventType.TOOL_CALL_RESULT, bad.tool_call_id),
    ]
    request = events[1].payload
    assert request["arguments"] == {"query": "LegacyClient"}
    assert request["argumentsHash"].startswith("sha256:")
    assert kernel.ledger.verify().ok


async def test_progress_events_come_between_started_and_result(kernel_factory):
    @tool("job.steps", idempotent=True)
    def steps(ctx: ToolContext) -> str:
        """Report progress."""
        for i in range(3):
            ctx.progress(i + 1, 3, f"step {i + 1}")
        return "done"

    kernel = kernel_factory()
    kernel.register(steps)
    run = kernel.start_run()
    seen = []
    result = await kernel.call(run, "job.steps", {}, on_progress=lambda *a: seen.append(a))
    types = [e.type for e in kernel.ledger.events(run.id) if e.tool_call_id == result.tool_call_id]
    assert types == [
        EventType.TOOL_CALL_REQUEST,
        EventType.TOOL_CALL_STARTED,
        EventType.TOOL_CALL_PROGRESS,
        EventType.TOOL_CALL_PROGRESS,
        EventType.TOOL_CALL_PROGRESS,
        EventType.TOOL_CALL_RESULT,
    ]
    assert [s[1] for s in seen] == [1, 2, 3]


@pytest.mark.parametrize("mutating", [False, True])
async def test_progress_a_tool_reports_is_made_storable_and_safe(kernel_factory, mutating):
    # NaN once made the call raise and lost its events; a message is untrusted output.
    @tool("job.odd", mutating=mutating)
    async def odd(ctx: ToolContext) -> str:
        """Report odd progress."""
        ctx.progress(float("nan"), float("inf"), "in /root/private/dir \ud800 ghp_" + "a" * 36)
        ctx.progress(10**400, "3", "x" * 5000)  # type: ignore[arg-type]
        ctx.progress(1, 2, 42)  # type: ignore[arg-type]
        return "done"

    kernel = kernel_factory()
    kernel.register(odd)
    run = kernel.start_run(profile="full")
    seen = []
    result = await kernel.call(run, "job.odd", {}, on_progress=lambda *a: seen.append(a[1:]))
    assert result.status is Status.SUCCEEDED
    progress = [
        e.payload for e in kernel.ledger.events(run.id) if e.type is EventType.TOOL_CALL_PROGRESS
    ]
    assert [(p["progress"], p["total"]) for p in progress] == [(None, None), (None, None), (1, 2)]
    first = progress[0]["message"]
    assert "/root/private" not in first
    assert "ghp_" not in first
    assert "\ud800" not in first
    assert len(progress[1]["message"]) == 1000
    assert progress[2]["message"] is None
    assert seen == [(1.0, 2.0, None)]  # the listener gets usable numbers only
    assert kernel.ledger.verify().ok


async def test_a_secret_across_the_cut_of_a_progress_message_is_still_masked(kernel_factory):
    token = "ghp_" + "A1b2C3d4E5f6G7h8I9j0" * 2  # 44 characters
    for start in (980, 990, 996, 999):  # the cut at 1000 goes through the token

        @tool("job.leaky")
        async def leaky(ctx: ToolContext) -> str:
            """Report progress with a token at the cut."""
            ctx.progress(1, 1, "x" * start + " " + token + " tail")  # noqa: B023 - called at once
            return "done"

        kernel = kernel_factory()
        kernel.register(leaky)
        run = kernel.start_run()
        seen: list[str | None] = []
        listener = seen.append
        await kernel.call(run, "job.leaky", {}, on_progress=lambda *a: listener(a[3]))  # noqa: B023
        (stored,) = [
            e.payload["message"]
            for e in kernel.ledger.events(run.id)
            if e.type is EventType.TOOL_CALL_PROGRESS
        ]
        for message in (stored, seen[0]):
            assert message is not None
            assert "ghp_" not in message
            assert "A1b2C3" not in message
            assert len(message) <= 1000


async def test_progress_past_the_cap_is_counted_not_stored_and_a_failing_listener_is_ignored(
    kernel_factory,
):
    @tool("job.chatty")
    async def chatty(ctx: ToolContext) -> str:
        """Report a lot."""
        for i in range(1005):
            ctx.progress(i)
        return "done"

    def listener(*args: object) -> None:
        raise RuntimeError("the host's listener broke")

    kernel = kernel_factory()
    kernel.register(chatty)
    run = kernel.start_run()
    result = await kernel.call(run, "job.chatty", {}, on_progress=listener)
    assert result.status is Status.SUCCEEDED
    events = kernel.ledger.events(run.id)
    assert sum(e.type is EventType.TOOL_CALL_PROGRESS for e in events) == 1000
    assert events[-1].payload["internal"]["progressDropped"] == 5


@pytest.mark.parametrize("raised", ["exception", "tool_failed"])
async def test_a_tool_message_without_a_utf8_form_is_escaped_not_fatal(kernel_factory, raised):
    @tool("job.bad")
    def bad() -> str:
        """Fail with a lone surrogate in the message."""
        if raised == "exception":
            raise ValueError("bad \ud800 text")
        raise ToolFailed("bad \ud800 text")

    kernel = kernel_factory()
    kernel.register(bad)
    run = kernel.start_run()
    result = await kernel.call(run, "job.bad", {})
    assert (result.status, result.error_code) == (Status.FAILED, ErrorCode.TOOL_ERROR)
    result.safe_message.encode("utf-8")  # storable and sendable
    (stored,) = [e for e in kernel.ledger.events(run.id) if e.type is EventType.TOOL_CALL_RESULT]
    if raised == "exception":
        assert "bad \\ud800 text" in stored.payload["internal"]["traceback"]
    assert kernel.ledger.verify().ok


async def test_a_huge_exception_message_is_cut_in_the_stored_traceback(kernel_factory):
    @tool("job.loud")
    def loud() -> str:
        """Fail with a message of megabytes."""
        raise ValueError("start " + "x" * 5_000_000 + " end-of-message")

    kernel = kernel_factory()
    kernel.register(loud)
    run = kernel.start_run()
    result = await kernel.call(run, "job.loud", {})
    assert result.error_code is ErrorCode.TOOL_ERROR
    (stored,) = [e for e in kernel.ledger.events(run.id) if e.type is EventType.TOOL_CALL_RESULT]
    kept = stored.payload["internal"]["traceback"]
    assert len(kept) < 70_000
    assert kept.startswith("Traceback")
    assert "characters cut" in kept
    assert kept.rstrip().endswith("end-of-message")  # where the error is named


async def test_replay_rebuilds_tool_messages_from_the_ledger_alone(kernel_factory):
    kernel = kernel_factory()
    run = kernel.start_run()
    live = await kernel.call_many(
        run,
        [
            ToolCall("repo.lookup", {"query": "a"}, tool_call_id="t1"),
            ToolCall("repo.lookup", '{"query": "b", "extra": 1}', tool_call_id="t2"),
            ToolCall("tool.fail", {}, tool_call_id="t3"),
        ],
    )
    rebuilt = exchanges(kernel.ledger, run.id)
    assert [x.tool_call_id for x in rebuilt] == ["t1", "t2", "t3"]
    assert [x.result.projection() for x in rebuilt] == [r.projection() for r in live]
    assert [x.dispatched for x in rebuilt] == [True, False, True]


async def test_replay_serves_recorded_results_without_running_tools(
    kernel_factory, calls, more_samples
):
    kernel = kernel_factory()
    run = kernel.start_run()
    first = await kernel.call(run, "repo.lookup", {"query": "a"})
    assert calls.count == {"repo.lookup": 1}
    replayer = Kernel(
        kernel.config,
        ledger=kernel.ledger,
        recorded=RecordedResults.from_ledger(kernel.ledger, run.id),
    )
    for sample in more_samples():
        replayer.register(sample)
    replay_run = replayer.start_run()
    again = await replayer.call(replay_run, "repo.lookup", {"query": "a"})
    assert calls.count == {"repo.lookup": 1}  # not run again
    assert again.status is Status.SUCCEEDED
    assert again.structured_output == first.structured_output
    unrecorded = await replayer.call(replay_run, "repo.lookup", {"query": "never"})
    assert unrecorded.status is Status.FAILED
    assert calls.count == {"repo.lookup": 1}


async def test_replay_keeps_calls_that_share_a_tool_call_id_apart(kernel_factory):
    # Providers reuse ids across turns (and a model can repeat one in a turn): each
    # REQUEST pairs with its own RESULT, in ledger order, and none is lost.
    kernel = kernel_factory()
    run = kernel.start_run()
    first = await kernel.call(run, "repo.lookup", {"query": "a"}, tool_call_id="same")
    turn = await kernel.call_many(
        run,
        [
            ToolCall("repo.lookup", {"query": "b"}, tool_call_id="same"),
            ToolCall("repo.lookup", {"query": "c", "extra": 1}, tool_call_id="same"),
        ],
    )
    # Reused after the first finished: fine. Repeated while open: refused, the open
    # call keeps the id.
    assert [r.status for r in (first, *turn)] == [Status.SUCCEEDED] * 2 + [Status.INVALID_ARGUMENTS]
    assert turn[1].error_code is ErrorCode.DUPLICATE_CALL_ID
    assert "'same'" in turn[1].safe_message
    rebuilt = exchanges(kernel.ledger, run.id)
    assert [x.arguments for x in rebuilt] == [
        {"query": "a"},
        {"query": "b"},
        {"query": "c", "extra": 1},
    ]
    assert [x.dispatched for x in rebuilt] == [True, True, False]
    assert [x.result.projection() for x in rebuilt] == [r.projection() for r in [first, *turn]]


async def test_a_call_reusing_the_id_of_a_running_call_is_refused_and_the_first_runs_on(
    kernel_factory,
):
    release = anyio.Event()

    @tool("job.wait", idempotent=True)
    async def wait() -> str:
        """Wait until released."""
        await release.wait()
        return "released"

    kernel = kernel_factory()
    kernel.register(wait)
    run = kernel.start_run()
    results = {}

    async def first() -> None:
        results["first"] = await kernel.call(run, "job.wait", {}, tool_call_id="x")

    async with anyio.create_task_group() as group:
        group.start_soon(first)
        while not run.has_call("x"):
            await anyio.sleep(0.001)
        results["second"] = await kernel.call(run, "repo.lookup", {"query": "a"}, tool_call_id="x")
        assert run.has_call("x")  # the refusal did not forget the running call
        assert run.cancel_call("x")
    assert results["second"].error_code is ErrorCode.DUPLICATE_CALL_ID
    assert results["first"].status is Status.CANCELLED
    rebuilt = exchanges(kernel.ledger, run.id)
    # In the order the ledger recorded them: the read-only call's REQUEST went to the
    # ledger with its RESULT, after the refusal.
    assert sorted((x.tool_name, x.result.status) for x in rebuilt) == [
        ("job.wait", Status.CANCELLED),
        ("repo.lookup", Status.INVALID_ARGUMENTS),
    ]
    report = kernel.ledger.verify()
    assert report.ok


async def test_an_id_stays_taken_until_its_result_is_written(kernel_factory):
    # The tool has returned but its batch is still finishing a sibling: the id is not
    # free yet, so a concurrent call with it is refused and replay pairs correctly.
    finishing_sibling = anyio.Event()

    def slow_sibling(outcome: Outcome, finishing: Finishing) -> Outcome:
        if finishing.tool.name == "other.read":
            finishing_sibling.set()
            time.sleep(0.2)  # blocks the loop: the second call is admitted right after
        return outcome

    @tool("other.read", idempotent=True)
    async def other() -> str:
        """Something else."""
        await anyio.sleep(0.01)
        return "other"

    kernel = kernel_factory(processors=(*DEFAULT_CHAIN, slow_sibling))
    kernel.register(other)
    run = kernel.start_run()
    out = {}

    async def first() -> None:
        out["first"] = await kernel.call_many(
            run,
            [
                ToolCall("repo.lookup", {"query": "A"}, tool_call_id="X"),
                ToolCall("other.read", {}, tool_call_id="Y"),
            ],
        )

    async with anyio.create_task_group() as group:
        group.start_soon(first)
        await finishing_sibling.wait()
        out["second"] = await kernel.call(run, "repo.lookup", {"query": "C"}, tool_call_id="X")
    assert out["second"].error_code is ErrorCode.DUPLICATE_CALL_ID
    pairs = {
        x.arguments["query"]: x.result.status
        for x in exchanges(kernel.ledger, run.id)
        if x.tool_call_id == "X"
    }
    assert pairs == {"A": Status.SUCCEEDED, "C": Status.INVALID_ARGUMENTS}


async def test_an_id_repeated_in_one_turn_is_refused_even_for_calls_that_run_alone(
    kernel_factory, calls
):
    kernel = kernel_factory('[run]\nprofile = "workspace-write"\n[[exposure]]\ntools = ["*"]\n')
    run = kernel.start_run()
    results = await kernel.call_many(
        run,
        [
            ToolCall("file.write", {"path": "src/a.py", "text": "1"}, tool_call_id="w"),
            ToolCall("file.write", {"path": "src/a.py", "text": "2"}, tool_call_id="w"),
            ToolCall("repo.lookup", {"query": "q"}, tool_call_id="r"),
        ],
    )
    assert [r.error_code for r in results] == [None, ErrorCode.DUPLICATE_CALL_ID, None]
    assert calls.count == {"file.write": 1, "repo.lookup": 1}


async def test_a_progress_message_is_one_printable_line(kernel_factory):
    """A status line for a person's screen: a tool's escape sequences are shown, not
    obeyed (a bridged server's \\x1b[2J must not clear the client's terminal)."""

    @tool("job.loud")
    async def loud(ctx: ToolContext) -> str:
        """Report progress with control characters."""
        ctx.progress(1, 2, "\x1b[2Jcleared\nsecond line\u202etxt.exe")
        return "done"

    kernel = kernel_factory()
    kernel.register(loud)
    run = kernel.start_run()
    seen: list[str | None] = []
    await kernel.call(run, "job.loud", {}, on_progress=lambda *a: seen.append(a[3]))
    (stored,) = [
        e.payload["message"]
        for e in kernel.ledger.events(run.id)
        if e.type is EventType.TOOL_CALL_PROGRESS
    ]
    assert stored == seen[0] == "\\x1b[2Jcleared second line\\u202etxt.exe"

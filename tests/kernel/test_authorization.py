"""Section 24: authorization cases, approval, budgets, rate limits, fail-closed."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Annotated, Any

import anyio
import pytest
from annotated_types import MaxLen

from toolkernel.approval import ApprovalDecision, ApprovalRequest
from toolkernel.codes import ErrorCode, Status
from toolkernel.context import RunState, ToolContext, VerificationStatus
from toolkernel.definition import Permissions
from toolkernel.functions import tool
from toolkernel.ledger import EventType
from toolkernel.policy import Action, Budget, Policy, PolicyRule, UsageMeter, authorize
from toolkernel.testing import RecordingApprover, event_types

pytestmark = pytest.mark.anyio


class WaitingHuman:
    """An approver that says yes once ``answer`` is set; ``asked`` is set when it is asked."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.asked = anyio.Event()
        self.answer = anyio.Event()

    async def __call__(self, request: ApprovalRequest) -> ApprovalDecision:
        self.asked.set()
        await self.answer.wait()
        return ApprovalDecision(True, self.name)


WRITE_SCOPED = """
[run]
profile = "workspace-write"

[policy]
write_scope = ["src/**"]

[[exposure]]
tools = ["*"]
"""


async def test_write_outside_task_scope_is_denied(kernel_factory, calls):
    kernel = kernel_factory(WRITE_SCOPED)
    run = kernel.start_run()
    result = await kernel.call(run, "file.write", {"path": "docs/notes.md", "text": "x"})
    assert result.status is Status.DENIED
    assert result.error_code is ErrorCode.WRITE_SCOPE_DENIED
    assert "docs/notes.md" in result.safe_message
    inside = await kernel.call(run, "file.write", {"path": "src/new.py", "text": "x"})
    assert inside.status is Status.SUCCEEDED
    assert calls.count == {"file.write": 1}


async def test_run_level_write_scope_overrides_the_policy_default(kernel_factory):
    kernel = kernel_factory(WRITE_SCOPED)
    run = kernel.start_run(write_scope=("docs/**",))
    assert (
        await kernel.call(run, "file.write", {"path": "docs/a.md", "text": "x"})
    ).status is Status.SUCCEEDED
    denied = await kernel.call(run, "file.write", {"path": "src/a.py", "text": "x"})
    assert denied.error_code is ErrorCode.WRITE_SCOPE_DENIED


async def test_read_only_profile_cannot_write(kernel_factory, calls):
    kernel = kernel_factory()  # default profile: read-only
    run = kernel.start_run()
    result = await kernel.call(run, "file.write", {"path": "src/a.py", "text": "x"})
    # The tool is not even exposed to a read-only run (exposure honours the profile).
    assert result.error_code is ErrorCode.TOOL_NOT_EXPOSED
    assert calls.count == {}


async def test_pr_create_before_the_verifier_passed_is_denied(kernel_factory, calls):
    kernel = kernel_factory(
        """
        [run]
        profile = "full"

        [policy]
        network = "allow"

        [[policy.rules]]
        tools = ["pr.*"]
        action = "deny"
        verification = ["UNKNOWN", "PENDING", "FAILED"]
        reason = "Run the verifier first; pull requests open only after tests pass."

        [[exposure]]
        tools = ["*"]
        """,
        approver=RecordingApprover(),
    )
    run = kernel.start_run()
    denied = await kernel.call(run, "pr.create", {"title": "Fix"})
    assert denied.error_code is ErrorCode.POLICY_DENIED
    assert "verifier first" in denied.safe_message
    run.update(verification=VerificationStatus.PASSED)
    allowed = await kernel.call(run, "pr.create", {"title": "Fix"})
    assert allowed.status is Status.SUCCEEDED
    assert calls.count == {"pr.create": 1}


async def test_a_refusal_message_is_redacted_like_any_output(kernel_factory, workspace):
    """A rule's reason is configured text: a token or host path in it is masked."""
    token = "ghp_" + "Q7r8S9t0U1v2W3x4Y5z6A7b8C9d0E1f2G3h4"
    kernel = kernel_factory(
        f"""
        [[policy.rules]]
        tools = ["repo.*"]
        action = "deny"
        reason = "ask ops (token {token}) or read {workspace.parent}/runbook.md"

        [[exposure]]
        tools = ["*"]
        """
    )
    run = kernel.start_run()
    denied = await kernel.call(run, "repo.lookup", {"query": "x"})
    assert denied.error_code is ErrorCode.POLICY_DENIED
    assert "ask ops" in denied.safe_message
    assert token not in denied.safe_message
    assert str(workspace.parent) not in denied.safe_message
    assert {notice.where for notice in denied.redactions} == {"safeMessage"}
    [stored] = [e for e in kernel.ledger.events(run.id) if e.type is EventType.TOOL_CALL_RESULT]
    assert token not in str(stored.payload)


NETWORK_ASK = """
[run]
profile = "full"

[policy]
network = "ask"

[[exposure]]
tools = ["*"]
"""


async def test_network_tool_needs_approval_and_is_denied_without_an_approver(kernel_factory, calls):
    kernel = kernel_factory(NETWORK_ASK)
    run = kernel.start_run()
    result = await kernel.call(run, "web.fetch", {"url": "https://example.org"})
    assert result.status is Status.DENIED
    assert result.error_code is ErrorCode.APPROVAL_REQUIRED
    assert "--approve" in result.safe_message
    types = event_types(kernel.ledger.events(run.id), result.tool_call_id)
    assert types == [
        EventType.TOOL_CALL_REQUEST,
        EventType.APPROVAL_REQUESTED,
        EventType.TOOL_CALL_RESULT,
    ]
    assert calls.count == {}


async def test_network_tool_runs_after_approval_and_the_approver_sees_full_arguments(
    kernel_factory, calls
):
    approver = RecordingApprover(approve=True)
    kernel = kernel_factory(NETWORK_ASK, approver=approver)
    run = kernel.start_run()
    result = await kernel.call(run, "web.fetch", {"url": "https://example.org/a"})
    assert result.status is Status.SUCCEEDED
    (held,) = approver.requests
    assert held.tool_name == "web.fetch"
    assert held.arguments == {"url": "https://example.org/a"}
    assert "it uses the network" in held.reasons
    types = event_types(kernel.ledger.events(run.id), result.tool_call_id)
    assert types == [
        EventType.TOOL_CALL_REQUEST,
        EventType.APPROVAL_REQUESTED,
        EventType.APPROVAL_GRANTED,
        EventType.TOOL_CALL_STARTED,
        EventType.TOOL_CALL_RESULT,
    ]


async def test_what_an_approver_does_to_the_arguments_it_is_shown_changes_nothing(
    kernel_factory,
):
    """The call runs with the arguments that were validated and recorded, whatever the
    approver (a UI that reformats what it shows, say) does to its copy."""
    received: list[dict[str, Any]] = []

    @tool("web.post", external=True, permissions=Permissions(network=True))
    def post(url: Annotated[str, MaxLen(200)], tags: list[Annotated[str, MaxLen(20)]]) -> str:
        """Post to a URL.

        Args:
            url: the address.
            tags: labels.
        """
        received.append({"url": url, "tags": tags})
        return "posted"

    def rewriting(request: ApprovalRequest) -> ApprovalDecision:
        request.arguments["url"] = "https://attacker.example/"  # type: ignore[index]
        request.arguments["extra"] = 1  # type: ignore[index]
        request.arguments["tags"].append("added")
        return ApprovalDecision(True, "ui")

    kernel = kernel_factory(NETWORK_ASK, approver=rewriting)
    kernel.register(post)
    run = kernel.start_run()
    arguments = {"url": "https://example.org/a", "tags": ["one"]}
    result = await kernel.call(run, "web.post", arguments)
    assert result.status is Status.SUCCEEDED
    assert received == [{"url": "https://example.org/a", "tags": ["one"]}]
    (request,) = [e for e in kernel.ledger.events(run.id) if e.type is EventType.TOOL_CALL_REQUEST]
    assert request.payload["arguments"] == {"url": "https://example.org/a", "tags": ["one"]}
    assert arguments == {"url": "https://example.org/a", "tags": ["one"]}


async def test_a_calls_own_approver_decides_instead_of_the_kernels(kernel_factory, calls):
    standing = RecordingApprover(approve=False, name="standing")
    kernel = kernel_factory(NETWORK_ASK, approver=standing)
    session_user = RecordingApprover(approve=True, name="session-user")
    run = kernel.start_run()
    mine = await kernel.call(
        run, "web.fetch", {"url": "https://example.org/b"}, approver=session_user
    )
    theirs = await kernel.call(run, "web.fetch", {"url": "https://example.org/c"})
    assert mine.status is Status.SUCCEEDED
    assert (theirs.status, theirs.error_code) == (Status.DENIED, ErrorCode.APPROVAL_REJECTED)
    assert [r.arguments["url"] for r in session_user.requests] == ["https://example.org/b"]
    assert [r.arguments["url"] for r in standing.requests] == ["https://example.org/c"]
    granted = [
        e
        for e in kernel.ledger.events(run.id)
        if e.type is EventType.APPROVAL_GRANTED and e.tool_call_id == mine.tool_call_id
    ]
    assert granted[0].payload["approver"] == "session-user"


async def test_a_call_cancelled_while_a_human_is_asked_never_runs(kernel_factory, calls):
    slow_human = WaitingHuman("late-human")
    kernel = kernel_factory(NETWORK_ASK, approver=slow_human)
    run = kernel.start_run()
    assert run.cancel_call("c1", ErrorCode.USER_CANCELLED) is False  # nothing to cancel yet
    results = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:

            async def call() -> None:
                url = {"url": "https://example.org"}
                results.append(await kernel.call(run, "web.fetch", url, tool_call_id="c1"))

            group.start_soon(call)
            await slow_human.asked.wait()
            assert run.cancel_call("c1", ErrorCode.SUPERSEDED) is True
            # The wait for the human ends at once: nobody needs the answer any more.
    (result,) = results
    assert (result.status, result.error_code) == (Status.CANCELLED, ErrorCode.SUPERSEDED)
    assert calls.count == {}
    events = [e for e in kernel.ledger.events(run.id) if e.tool_call_id == "c1"]
    assert [e.type for e in events] == [
        EventType.TOOL_CALL_REQUEST,
        EventType.APPROVAL_REQUESTED,
        EventType.APPROVAL_DENIED,
        EventType.TOOL_CALL_RESULT,
    ]
    assert events[2].payload["approver"] == "runtime"
    assert run.cancel_call("c1") is False  # over: a later call with this id is unaffected
    again = await kernel.call(run, "repo.lookup", {"query": "q"}, tool_call_id="c1")
    assert again.status is Status.SUCCEEDED


async def test_a_call_waiting_for_a_human_does_not_hold_up_the_runs_other_calls(
    kernel_factory, calls
):
    # An MCP client's session is one run: while its user thinks about a destructive
    # call, reads and other writes of the session go on; the approved call runs after.
    slow_human = WaitingHuman("human")
    kernel = kernel_factory(
        '[run]\nprofile = "workspace-write"\n[[exposure]]\ntools = ["*"]\n',
        approver=slow_human,
    )
    run = kernel.start_run()
    held: list[object] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:

            async def erase() -> None:
                held.append(await kernel.call(run, "repo.reset", {}))

            group.start_soon(erase)
            await slow_human.asked.wait()
            read = await kernel.call(run, "repo.lookup", {"query": "q"})
            write = await kernel.call(run, "file.write", {"path": "src/a.py", "text": "x"})
            assert not held  # still waiting for the human
            slow_human.answer.set()
    assert (read.status, write.status) == (Status.SUCCEEDED, Status.SUCCEEDED)
    assert [r.status for r in held] == [Status.SUCCEEDED]
    assert calls.count == {"repo.lookup": 1, "file.write": 1, "repo.reset": 1}
    assert kernel.ledger.verify().ok


WRITE_PROFILE = '[run]\nprofile = "workspace-write"\n[[exposure]]\ntools = ["*"]\n'


async def test_a_held_call_with_an_idempotency_key_keeps_the_gate_for_its_duplicate(
    kernel_factory, calls
):
    # Stepping aside would let a duplicate of the key take the gate and wait for this
    # call, which would wait for the gate: with a key, the call keeps it.
    human = WaitingHuman("human")

    kernel = kernel_factory(WRITE_PROFILE, approver=human)
    run = kernel.start_run()
    out = {}
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:

            async def reset(call_id: str) -> None:
                out[call_id] = await kernel.call(
                    run, "repo.reset", {}, tool_call_id=call_id, idempotency_key="K"
                )

            group.start_soon(reset, "a")
            await human.asked.wait()
            group.start_soon(reset, "b")
            await anyio.sleep(0.05)
            human.answer.set()
    assert [out[c].status for c in "ab"] == [Status.SUCCEEDED] * 2
    assert calls.count == {"repo.reset": 1}


async def test_a_call_cancelled_while_it_waits_to_take_the_gate_back_never_runs(
    kernel_factory, calls
):
    human = WaitingHuman("human")

    @tool("file.slow_write", mutating=True)
    async def slow_write() -> str:
        """Hold the run's gate for a while."""
        await anyio.sleep(0.5)
        return "written"

    kernel = kernel_factory(WRITE_PROFILE, approver=human)
    kernel.register(slow_write)
    run = kernel.start_run()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            scope = anyio.CancelScope()

            async def reset() -> None:
                with scope:
                    await kernel.call(run, "repo.reset", {}, tool_call_id="a")

            group.start_soon(reset)
            await human.asked.wait()
            group.start_soon(kernel.call, run, "file.slow_write", {})
            await anyio.sleep(0.1)  # the write holds the gate
            human.answer.set()  # approved: the reset waits for the gate
            await anyio.sleep(0.1)
            scope.cancel()  # its caller gives up first
    assert "repo.reset" not in calls.count
    (result,) = [
        e.payload["result"]
        for e in kernel.ledger.events(run.id)
        if e.tool_call_id == "a" and e.type is EventType.TOOL_CALL_RESULT
    ]
    assert result["errorCode"] == "USER_CANCELLED"


async def test_network_denied_by_policy_is_refused(kernel_factory):
    kernel = kernel_factory(
        """
        [run]
        profile = "full"
        [[exposure]]
        tools = ["*"]
        """
    )
    run = kernel.start_run()
    result = await kernel.call(run, "web.fetch", {"url": "https://example.org"})
    assert result.error_code is ErrorCode.NETWORK_NOT_ALLOWED
    assert "Network access is not allowed" in result.safe_message


async def test_destructive_tool_needs_approval_and_a_refusal_is_recorded(kernel_factory, calls):
    approver = RecordingApprover(approve=False)
    kernel = kernel_factory(
        """
        [run]
        profile = "workspace-write"
        [[exposure]]
        tools = ["*"]
        """,
        approver=approver,
    )
    run = kernel.start_run()
    result = await kernel.call(run, "repo.reset", {})
    assert result.error_code is ErrorCode.APPROVAL_REJECTED
    assert approver.requests[0].reasons == ("it is destructive",)
    types = event_types(kernel.ledger.events(run.id), result.tool_call_id)
    assert EventType.APPROVAL_DENIED in types
    assert EventType.TOOL_CALL_STARTED not in types
    assert calls.count == {}


async def test_an_approver_that_raises_does_not_approve(kernel_factory, calls):
    """Nobody decided: the call still needs an approval (the model must not read that
    the user refused), and the ledger says the approver failed."""

    def broken(_request):
        raise RuntimeError("approval service down")

    kernel = kernel_factory(
        """
        [run]
        profile = "workspace-write"
        [[exposure]]
        tools = ["*"]
        """,
        approver=broken,
    )
    run = kernel.start_run()
    result = await kernel.call(run, "repo.reset", {})
    assert result.error_code is ErrorCode.APPROVAL_REQUIRED
    assert calls.count == {}
    (denied,) = [e for e in kernel.ledger.events(run.id) if e.type is EventType.APPROVAL_DENIED]
    assert denied.payload["note"] == "approver failed: RuntimeError"


@pytest.mark.parametrize(
    ("answer", "approved"),
    [
        (ApprovalDecision(True, "alice", None), True),  # type: ignore[arg-type]
        (ApprovalDecision(True, "alice", "ok \ud800"), True),
        (ApprovalDecision("yes", "alice"), False),  # type: ignore[arg-type]
        (ApprovalDecision(1, "alice"), False),  # type: ignore[arg-type]
        (ApprovalDecision(True, None), False),  # type: ignore[arg-type]
        (ApprovalDecision(True, "alice", 5), False),  # type: ignore[arg-type]
        (ApprovalDecision(False, "alice", asked="no"), False),  # type: ignore[arg-type]
    ],
)
async def test_an_approvers_answer_is_checked_field_by_field(
    kernel_factory, calls, answer, approved
):
    # A None note once made the call raise; a truthy non-bool must not approve. A
    # malformed answer is a broken approver: nobody decided, the call awaits one.
    kernel = kernel_factory(NETWORK_ASK, approver=lambda _request: answer)
    run = kernel.start_run()
    result = await kernel.call(run, "web.fetch", {"url": "https://example.org"})
    if approved:
        assert result.status is Status.SUCCEEDED
    else:
        assert (result.status, result.error_code) == (Status.DENIED, ErrorCode.APPROVAL_REQUIRED)
    kinds = {e.type for e in kernel.ledger.events(run.id)}
    assert (EventType.APPROVAL_GRANTED in kinds) is approved
    assert kernel.ledger.verify().ok


async def test_a_sync_approver_does_not_stop_the_event_loop_while_it_decides(kernel_factory):
    decided = threading.Event()
    ticks = 0
    seen: list[int] = []

    def human(_request: ApprovalRequest) -> ApprovalDecision:
        decided.wait(5)  # a person at a blocking prompt
        seen.append(ticks)  # what the event loop did meanwhile
        return ApprovalDecision(True, "human")

    kernel = kernel_factory(NETWORK_ASK, approver=human)
    run = kernel.start_run()

    async def heartbeat() -> None:
        nonlocal ticks
        while not decided.is_set():
            ticks += 1
            await anyio.sleep(0.01)

    async def decide_later() -> None:
        await anyio.sleep(0.3)
        decided.set()

    async with anyio.create_task_group() as group:
        group.start_soon(heartbeat)
        group.start_soon(decide_later)
        result = await kernel.call(run, "web.fetch", {"url": "https://example.org"})
    assert result.status is Status.SUCCEEDED
    assert seen[0] >= 5  # the loop kept running while the approver blocked its thread


@contextmanager
def human_at_a_prompt() -> Iterator[Callable[[ApprovalRequest], ApprovalDecision]]:
    """A sync approver blocked at its prompt until the block ends (10 s at most)."""
    release = threading.Event()

    def human(_request: ApprovalRequest) -> ApprovalDecision:
        release.wait(10)
        return ApprovalDecision(True, "human")

    try:
        yield human
    finally:
        release.set()


async def test_a_call_cancelled_while_a_sync_approver_blocks_returns_at_once(kernel_factory):
    with human_at_a_prompt() as human:
        kernel = kernel_factory(NETWORK_ASK, approver=human)
        run = kernel.start_run()
        with anyio.fail_after(3):  # before the fix: only when the approver answered
            async with anyio.create_task_group() as group:

                async def cancel_soon() -> None:
                    await anyio.sleep(0.2)
                    run.cancel()

                group.start_soon(cancel_soon)
                result = await kernel.call(run, "web.fetch", {"url": "https://example.org"})
    assert (result.status, result.error_code) == (Status.CANCELLED, ErrorCode.USER_CANCELLED)


ABANDONED_PROMPT = """
import pathlib, sys, anyio
from toolkernel.approval import ApprovalDecision
from toolkernel.definition import Permissions
from toolkernel.functions import tool
from toolkernel.testing import make_kernel

@tool("repo.reset", mutating=True, destructive=True,
      permissions=Permissions(read_workspace=True, write_workspace=True))
def reset() -> str:
    \"\"\"Throw away local changes.\"\"\"
    return "reset"

def human(request):  # a prompt nobody answers
    sys.stdin.readline()
    return ApprovalDecision(True, "human")

kernel = make_kernel(pathlib.Path(sys.argv[1]), '[run]\\nprofile = "workspace-write"\\n'
                     '[[exposure]]\\ntools = ["*"]\\n', approver=human)
kernel.register(reset)

async def main():
    with anyio.move_on_after(0.3):
        await kernel.call(kernel.start_run(), "repo.reset", {})

anyio.run(main)
kernel.close()
print("done")
"""


def test_a_process_whose_approval_prompt_was_abandoned_exits(tmp_path):
    # Ctrl-C at `toolkernel call`'s prompt said "Interrupted." and then waited for Enter:
    # the thread blocked in readline kept the process alive.
    script = tmp_path / "prompt.py"
    script.write_text(ABANDONED_PROMPT)
    (tmp_path / "ws").mkdir()
    with subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "ws")],
        stdin=subprocess.PIPE,  # open, never written: the human never answers
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            process.wait(timeout=30)  # stdin stays open: communicate() would close it
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail("the process waited for the abandoned prompt")
        out, err = process.communicate()
    assert (process.returncode, out.strip()) == (0, "done"), err


async def test_a_caller_cancelled_while_a_human_is_asked_leaves_the_hold_denied(kernel_factory):
    """Cancelling the caller's task (a timeout around the call) ended the hold with no
    decision event; run.cancel already recorded APPROVAL_DENIED by the runtime."""
    with human_at_a_prompt() as human:
        kernel = kernel_factory(NETWORK_ASK, approver=human)
        run = kernel.start_run()
        with anyio.move_on_after(0.3):
            await kernel.call(run, "web.fetch", {"url": "https://example.org"})
    events = kernel.ledger.events(run.id)
    assert [e.type for e in events] == [
        EventType.TOOL_CALL_REQUEST,
        EventType.APPROVAL_REQUESTED,
        EventType.APPROVAL_DENIED,
        EventType.TOOL_CALL_RESULT,
    ]
    assert events[2].payload["approver"] == "runtime"
    assert events[3].payload["result"]["errorCode"] == ErrorCode.USER_CANCELLED


async def test_a_grant_followed_by_the_callers_cancel_is_recorded_as_granted(kernel_factory):
    """The human approved; the caller gave up while the call waited for the run's turn
    (another call held it). The ledger said APPROVAL_DENIED by the human, a review found."""
    holding = threading.Event()

    def human(_request: ApprovalRequest) -> ApprovalDecision:
        holding.wait(5)  # answers once the other call holds the run
        return ApprovalDecision(True, "human", "ok by me")

    @tool("slow.write", mutating=True)
    async def slow_write() -> str:
        """Hold the run's turn a while."""
        holding.set()
        await anyio.sleep(1.0)
        return "done"

    kernel = kernel_factory(NETWORK_ASK, approver=human)
    kernel.register(slow_write)
    run = kernel.start_run()

    async def ask_and_give_up() -> None:
        with anyio.move_on_after(0.5):
            await kernel.call(run, "web.fetch", {"url": "https://example.org"}, tool_call_id="A")

    async with anyio.create_task_group() as group:
        group.start_soon(ask_and_give_up)
        await anyio.sleep(0.1)  # A is held for approval, its turn given up meanwhile
        group.start_soon(partial(kernel.call, run, "slow.write", {}, tool_call_id="B"))
    held = [e for e in kernel.ledger.events(run.id) if e.tool_call_id == "A"]
    assert [e.type for e in held] == [
        EventType.TOOL_CALL_REQUEST,
        EventType.APPROVAL_REQUESTED,
        EventType.APPROVAL_GRANTED,
        EventType.TOOL_CALL_RESULT,
    ]
    assert held[2].payload == {"approver": "human", "note": "ok by me"}
    assert held[3].payload["result"]["errorCode"] == ErrorCode.USER_CANCELLED


async def test_run_state_rule_denies_with_its_own_code(kernel_factory):
    kernel = kernel_factory(
        """
        [[policy.rules]]
        tools = ["repo.lookup"]
        action = "deny"
        states = ["PLANNING"]
        reason = "Plan first, then search."

        [[exposure]]
        tools = ["*"]
        """
    )
    run = kernel.start_run()
    result = await kernel.call(run, "repo.lookup", {"query": "x"})
    assert result.error_code is ErrorCode.RUN_STATE_DENIED
    run.update(run_state=RunState.EDITING)
    assert (await kernel.call(run, "repo.lookup", {"query": "x"})).status is Status.SUCCEEDED


async def test_path_deny_list_is_enforced(kernel_factory):
    kernel = kernel_factory(
        """
        [policy]
        path_deny = ["docs/**"]
        [[exposure]]
        tools = ["*"]
        """
    )
    run = kernel.start_run()
    result = await kernel.call(run, "file.peek", {"path": "docs/notes.md"})
    assert result.error_code is ErrorCode.PATH_DENIED
    assert (await kernel.call(run, "file.peek", {"path": "src/app.py"})).status is Status.SUCCEEDED


async def test_path_allow_list_limits_reads(kernel_factory):
    kernel = kernel_factory(
        """
        [policy]
        path_allow = ["src/**"]
        [[exposure]]
        tools = ["*"]
        """
    )
    run = kernel.start_run()
    assert (await kernel.call(run, "file.peek", {"path": "docs/notes.md"})).error_code is (
        ErrorCode.PATH_DENIED
    )


@pytest.mark.parametrize(
    ("rules", "path", "outcome"),
    [
        # A directory is judged by what lies inside it: "src/**" names src's contents.
        ('path_allow = ["src/**"]', "src", "ALLOWED"),
        ('path_allow = ["src/**"]', "src/lib", "ALLOWED"),
        ('path_allow = ["src/**"]', "docs", "DENIED"),
        ('path_allow = ["src/*.py"]', "src", "DENIED"),
        ('path_deny = ["secrets/**"]', "secrets", "DENIED"),
        ('path_deny = ["secrets/**"]', "secrets/keys", "DENIED"),
        ('path_deny = ["secrets/**"]', "src", "ALLOWED"),
        ('path_deny = ["secrets/*.key"]', "secrets", "ALLOWED"),
    ],
)
def test_a_directory_path_is_judged_by_the_paths_inside_it(
    kernel_factory, workspace, rules, path, outcome
):
    for directory in ("src/lib", "docs", "secrets/keys"):
        (workspace / directory).mkdir(parents=True, exist_ok=True)
    kernel = kernel_factory(f"[policy]\n{rules}\n[[exposure]]\ntools = ['*']\n")
    explained = kernel.explain(kernel.start_run(), "file.peek", {"path": path})
    assert explained["outcome"] == outcome, explained


async def test_cost_budget_per_run_is_enforced(kernel_factory, calls):
    kernel = kernel_factory(
        """
        [budget]
        max_cost = 5
        [budget.costs]
        "repo.lookup" = 2
        [[exposure]]
        tools = ["*"]
        """
    )
    run = kernel.start_run()
    statuses = [
        (await kernel.call(run, "repo.lookup", {"query": str(i)})).error_code for i in range(3)
    ]
    assert statuses == [None, None, ErrorCode.BUDGET_EXCEEDED]
    assert calls.count == {"repo.lookup": 2}
    other_run = kernel.start_run()
    assert (await kernel.call(other_run, "repo.lookup", {"query": "x"})).status is Status.SUCCEEDED


async def test_calls_waiting_for_approval_cannot_overspend_the_budget(kernel_factory, calls):
    # Both calls pass the budget check before the human answers; only one may run.
    async def slow_human(request: ApprovalRequest) -> ApprovalDecision:
        await anyio.sleep(0.05)
        return ApprovalDecision(True, "human")

    kernel = kernel_factory(NETWORK_ASK + "\n[budget]\nmax_calls = 1\n", approver=slow_human)
    run = kernel.start_run()
    results = []

    async def fetch(url: str) -> None:
        results.append(await kernel.call(run, "web.fetch", {"url": url}))

    async with anyio.create_task_group() as group:
        group.start_soon(fetch, "https://example.org/a")
        group.start_soon(fetch, "https://example.org/b")
    assert sorted(str(r.error_code) for r in results) == ["BUDGET_EXCEEDED", "None"]
    assert calls.count == {"web.fetch": 1}
    assert run.meter.calls == 1


async def test_a_run_continued_by_a_new_kernel_keeps_what_it_spent(kernel_factory, calls):
    # `toolkernel call --run ID` in successive processes: the budget and the rate
    # limits are per run, not per process.
    config = """
        [budget]
        max_calls = 3
        [rate_limits."repo.lookup"]
        calls = 1
        per_seconds = 3600
        [[exposure]]
        tools = ["*"]
        """
    first = kernel_factory(config)
    run = first.start_run(run_id="continued")
    assert (await first.call(run, "repo.lookup", {"query": "a"})).status is Status.SUCCEEDED
    assert (await first.call(run, "memory.read", {})).status is Status.SUCCEEDED
    first.close()
    second = kernel_factory(config)
    again = second.start_run(run_id="continued")
    assert again.meter.calls == 2
    limited = await second.call(again, "repo.lookup", {"query": "b"})
    assert limited.error_code is ErrorCode.RATE_LIMITED
    assert (await second.call(again, "memory.read", {})).status is Status.SUCCEEDED
    spent = await second.call(again, "memory.read", {})
    assert spent.error_code is ErrorCode.BUDGET_EXCEEDED
    fresh = second.start_run(run_id="another")
    assert (await second.call(fresh, "repo.lookup", {"query": "c"})).status is Status.SUCCEEDED
    assert calls.count == {"repo.lookup": 2}


async def test_refused_calls_do_not_spend_the_budget(kernel_factory):
    kernel = kernel_factory(
        """
        [budget]
        max_calls = 1
        [[exposure]]
        tools = ["*"]
        """
    )
    run = kernel.start_run()
    await kernel.call(run, "repo.lookup", {"bad": 1})
    assert (await kernel.call(run, "repo.lookup", {"query": "x"})).status is Status.SUCCEEDED
    assert (await kernel.call(run, "repo.lookup", {"query": "y"})).error_code is (
        ErrorCode.BUDGET_EXCEEDED
    )


async def test_rate_limit_per_tool_is_retryable(kernel_factory):
    kernel = kernel_factory(
        """
        [rate_limits."repo.*"]
        calls = 2
        per_seconds = 60
        [[exposure]]
        tools = ["*"]
        """
    )
    run = kernel.start_run()
    results = [await kernel.call(run, "repo.lookup", {"query": str(i)}) for i in range(3)]
    assert [r.status for r in results] == [Status.SUCCEEDED, Status.SUCCEEDED, Status.DENIED]
    assert results[2].error_code is ErrorCode.RATE_LIMITED
    assert results[2].retryable is True
    assert (await kernel.call(run, "file.peek", {"path": "src/app.py"})).status is Status.SUCCEEDED


def test_a_tools_own_cost_beats_a_pattern_listed_before_it():
    budget = Budget(default_cost=1, costs={"*": 0, "memory.read": 5, "web.*": 2, "web.f*": 3})
    assert budget.cost_of("memory.read") == 5
    assert budget.cost_of("web.fetch") == 0  # "*" is the first pattern that matches
    assert Budget(costs={"web.*": 2, "web.f*": 3}).cost_of("web.fetch") == 2
    assert Budget(default_cost=1.5).cost_of("x") == 1.5


def test_rate_window_slides():
    now = [0.0]
    meter = UsageMeter(clock=lambda: now[0])
    meter.charge("a.b", 1, ["a.*"])
    meter.charge("a.b", 1, ["a.*"])
    assert meter.recent_calls("a.*", 10) == 2
    now[0] = 10.5
    assert meter.recent_calls("a.*", 10) == 0


async def test_audit_rule_allows_and_flags_for_review(kernel_factory):
    kernel = kernel_factory(
        """
        [[policy.rules]]
        tools = ["repo.lookup"]
        action = "audit"
        [[exposure]]
        tools = ["*"]
        """
    )
    run = kernel.start_run()
    result = await kernel.call(run, "repo.lookup", {"query": "x"})
    assert result.status is Status.SUCCEEDED
    events = [e for e in kernel.ledger.events(run.id) if e.tool_call_id == result.tool_call_id]
    started = next(e for e in events if e.type is EventType.TOOL_CALL_STARTED)
    final = next(e for e in events if e.type is EventType.TOOL_CALL_RESULT)
    assert started.payload["flaggedForReview"] is True
    assert final.payload["flaggedForReview"] is True


async def test_explicit_allow_rule_waives_safety_approval(kernel_factory, calls):
    kernel = kernel_factory(
        """
        [run]
        profile = "workspace-write"
        [[policy.rules]]
        tools = ["repo.reset"]
        action = "allow"
        [[exposure]]
        tools = ["*"]
        """
    )
    run = kernel.start_run()
    assert (await kernel.call(run, "repo.reset", {})).status is Status.SUCCEEDED


SAFETY_DEFAULT = """
    [run]
    profile = "workspace-write"
    [policy]
    approval = {{ destructive = "{action}" }}
    {rules}
    [[exposure]]
    tools = ["*"]
    """


async def test_a_safety_default_of_deny_refuses_the_call(kernel_factory, calls):
    approver = RecordingApprover(approve=True)
    kernel = kernel_factory(SAFETY_DEFAULT.format(action="deny", rules=""), approver=approver)
    run = kernel.start_run()

    result = await kernel.call(run, "repo.reset", {})

    assert (result.status, result.error_code) == (Status.DENIED, ErrorCode.POLICY_DENIED)
    assert "[policy.approval] denies a tool that is destructive." in result.safe_message
    assert approver.requests == []  # denied, not asked
    assert EventType.TOOL_CALL_STARTED not in event_types(
        kernel.ledger.events(run.id), result.tool_call_id
    )
    assert calls.count == {}
    lookup = await kernel.call(run, "repo.lookup", {"query": "a"})
    assert lookup.status is Status.SUCCEEDED  # not destructive: untouched


async def test_a_safety_default_of_audit_runs_the_call_flagged_for_review(kernel_factory, calls):
    kernel = kernel_factory(SAFETY_DEFAULT.format(action="audit", rules=""))
    run = kernel.start_run()

    result = await kernel.call(run, "repo.reset", {})

    assert result.status is Status.SUCCEEDED
    [stored] = [e for e in kernel.ledger.events(run.id) if e.type is EventType.TOOL_CALL_STARTED]
    assert stored.payload["flaggedForReview"] is True
    assert calls.count == {"repo.reset": 1}


async def test_an_explicit_allow_rule_waives_a_safety_default_of_deny(kernel_factory):
    rule = '[[policy.rules]]\n    tools = ["repo.reset"]\n    action = "allow"'
    kernel = kernel_factory(SAFETY_DEFAULT.format(action="deny", rules=rule))
    assert (await kernel.call(kernel.start_run(), "repo.reset", {})).status is Status.SUCCEEDED


def test_policy_that_cannot_be_evaluated_denies(kernel_factory):
    kernel = kernel_factory()
    tool = kernel.registry.find("repo.lookup")
    assert tool is not None
    ctx = kernel.start_run().context.evolve(profile="no-such-profile")
    decision = authorize(kernel.config.policy, tool.definition, ctx, UsageMeter())
    assert decision.allowed is False
    assert decision.reason_code is ErrorCode.POLICY_ERROR
    broken = replace(
        Policy(),
        rules=(PolicyRule(tools=None, action=Action.DENY),),  # type: ignore[arg-type]
    )
    decision = authorize(broken, tool.definition, ctx.evolve(profile="read-only"), UsageMeter())
    assert decision.reason_code is ErrorCode.POLICY_ERROR


async def test_checks_that_raise_refuse_the_call_instead_of_escaping(kernel_factory, calls):
    """An argument or approval check that cannot decide denies (fail closed)."""

    def broken(arguments: object) -> None:
        raise ValueError("the check itself is broken")

    kernel = kernel_factory()
    kernel.add_checks("repo.lookup", arguments=broken)
    kernel.add_checks("file.peek", approval=broken)
    run = kernel.start_run()
    looked = await kernel.call(run, "repo.lookup", {"query": "x"})
    peeked = await kernel.call(run, "file.peek", {"path": "src/app.py"})
    for result in (looked, peeked):
        assert (result.status, result.error_code) == (Status.DENIED, ErrorCode.POLICY_ERROR)
        assert "broken" not in result.safe_message
    assert calls.count == {}


def test_decision_carries_the_contract_fields(kernel_factory):
    kernel = kernel_factory()
    tool = kernel.registry.find("repo.lookup")
    assert tool is not None
    decision = authorize(
        kernel.config.policy, tool.definition, kernel.start_run().context, UsageMeter()
    )
    assert set(decision.to_dict()) >= {"allowed", "reasonCode", "safeMessage", "requiresApproval"}


def test_a_decision_follows_the_policy_and_run_context_it_is_asked_about(kernel_factory):
    # The standing of a tool is worked out once per policy, definition and context:
    # another policy or a moved-on context gets its own answer, never a remembered one.
    kernel = kernel_factory()
    tool = kernel.registry.find("repo.lookup")
    assert tool is not None
    context = kernel.start_run().context
    policy = kernel.config.policy
    deny = PolicyRule(tools=("repo.*",), action=Action.DENY, states=frozenset({RunState.EDITING}))
    ruled = replace(policy, rules=(deny,))
    meter = UsageMeter()

    def code(p: Policy, state: RunState) -> ErrorCode | None:
        return authorize(p, tool.definition, context.evolve(run_state=state), meter).reason_code

    assert authorize(policy, tool.definition, context, meter).allowed
    assert authorize(ruled, tool.definition, context, meter).allowed  # not EDITING
    assert code(ruled, RunState.EDITING) is ErrorCode.RUN_STATE_DENIED
    assert code(policy, RunState.EDITING) is None
    unknown = context.evolve(profile="no-such-profile")
    assert authorize(policy, tool.definition, unknown, meter).reason_code is (
        ErrorCode.POLICY_ERROR
    )
    assert authorize(policy, tool.definition, context, meter).allowed
    costly = replace(policy, budget=Budget(max_cost=1, costs={"repo.*": 2}))
    assert authorize(costly, tool.definition, context, meter).reason_code is (
        ErrorCode.BUDGET_EXCEEDED
    )


async def test_a_tool_knows_whether_a_human_approved_its_call(kernel_factory):
    kernel = kernel_factory(NETWORK_ASK, approver=RecordingApprover(approve=True))

    @tool("net.ping", permissions=Permissions(network=True))
    def ping(ctx: ToolContext) -> bool:
        """Say whether this call was approved."""
        return ctx.approved

    @tool("local.ping", idempotent=True)
    def local(ctx: ToolContext) -> bool:
        """Say whether this call was approved."""
        return ctx.approved

    kernel.register(ping)
    kernel.register(local)
    run = kernel.start_run()
    held = await kernel.call(run, "net.ping", {})
    free = await kernel.call(run, "local.ping", {})
    assert (held.status, held.structured_output) == (Status.SUCCEEDED, True)
    assert (free.status, free.structured_output) == (Status.SUCCEEDED, False)


@pytest.mark.parametrize(
    "name",
    [
        "toolkernel.toml",
        "./toolkernel.toml",
        "sub/toolkernel.toml",
        "a/b/toolkernel.toml",
        "sub/toolkernel.toml/x",  # a directory by that name stops a runtime started in sub/
    ],
)
async def test_no_tool_may_write_the_policy_file_even_to_create_it(kernel_factory, calls, name):
    kernel = kernel_factory(WRITE_EVERYWHERE)
    run = kernel.start_run()
    result = await kernel.call(run, "file.write", {"path": name, "text": "[policy]"})
    other = await kernel.call(run, "file.write", {"path": "notes.txt", "text": "x"})
    assert (result.status, result.error_code) == (Status.DENIED, ErrorCode.PATH_DENIED)
    assert other.status is Status.SUCCEEDED
    assert calls.count == {"file.write": 1}


WRITE_EVERYWHERE = """
[run]
profile = "full"
state = "EDITING"

[[exposure]]
tools = ["*"]
"""


@pytest.mark.parametrize(
    ("rules", "link", "target", "code"),
    [
        ('path_deny = ["infra/**"]', "src/notes.tf", "infra/main.tf", ErrorCode.PATH_DENIED),
        (
            'write_scope = ["src/**"]',
            "src/notes.tf",
            "infra/main.tf",
            ErrorCode.WRITE_SCOPE_DENIED,
        ),
        # a policy file a runtime started in svc/ would read
        ("", "notes.md", "svc/toolkernel.toml", ErrorCode.PATH_DENIED),
    ],
)
async def test_a_symlink_in_the_workspace_does_not_take_a_call_past_the_path_rules(
    kernel_factory, calls, workspace, rules, link, target, code
):
    """The rules judge where a link leads too: a write to ``src/notes.tf`` that lands in
    ``infra/main.tf`` is the write the rule is about."""
    import os

    kernel = kernel_factory(WRITE_EVERYWHERE + f"\n[policy]\n{rules}\n")
    (workspace / target).parent.mkdir(parents=True, exist_ok=True)
    (workspace / link).parent.mkdir(parents=True, exist_ok=True)
    (workspace / link).symlink_to(os.path.relpath(workspace / target, (workspace / link).parent))
    run = kernel.start_run()
    through = await kernel.call(run, "file.write", {"path": link, "text": "evil"})
    direct = await kernel.call(run, "file.write", {"path": target, "text": "evil"})
    assert (through.status, through.error_code) == (Status.DENIED, code)
    assert (direct.status, direct.error_code) == (Status.DENIED, code)
    assert "file.write" not in calls.count
    if rules.startswith("path_deny"):
        peek = await kernel.call(run, "file.peek", {"path": link})
        assert peek.error_code is ErrorCode.PATH_DENIED


@pytest.mark.parametrize(
    ("asked", "code"), [(True, ErrorCode.APPROVAL_REJECTED), (False, ErrorCode.APPROVAL_REQUIRED)]
)
async def test_a_refusal_by_nobody_is_approval_required_not_rejected(
    kernel_factory, calls, asked, code
):
    """An approver that could not ask anyone says so (``asked=False``): the model is
    told the call needs an approval, not that the user refused it."""
    answer = ApprovalDecision(False, "svc", "the user could not be reached", asked=asked)
    kernel = kernel_factory(NETWORK_ASK, approver=lambda _request: answer)
    run = kernel.start_run()
    result = await kernel.call(run, "web.fetch", {"url": "https://example.org"})
    assert (result.status, result.error_code) == (Status.DENIED, code)
    assert "web.fetch" not in calls.count


async def test_an_approvers_advice_is_the_message_the_model_gets_and_the_ledger_keeps(
    kernel_factory, calls
):
    advice = "Open the review page at https://review.example/42 and approve it there."
    answer = ApprovalDecision(False, "svc", "nobody reachable", asked=False, advice=advice)
    kernel = kernel_factory(NETWORK_ASK, approver=lambda _request: answer)
    run = kernel.start_run()
    result = await kernel.call(run, "web.fetch", {"url": "https://example.org"})
    assert result.error_code is ErrorCode.APPROVAL_REQUIRED
    assert advice in result.safe_message
    assert "--approve" not in result.safe_message  # the runtime's own advice is replaced
    [recorded] = [
        e.payload["result"]
        for e in kernel.ledger.events(run.id)
        if e.type is EventType.TOOL_CALL_RESULT
    ]
    assert recorded["safeMessage"] == result.safe_message
    assert "web.fetch" not in calls.count


async def test_an_approvers_advice_that_is_no_string_counts_as_a_broken_approver(
    kernel_factory, calls
):
    answer = ApprovalDecision(False, "svc", "x", asked=False, advice=42)  # type: ignore[arg-type]
    kernel = kernel_factory(NETWORK_ASK, approver=lambda _request: answer)
    result = await kernel.call(kernel.start_run(), "web.fetch", {"url": "https://example.org"})
    assert result.error_code is ErrorCode.APPROVAL_REQUIRED
    assert "42" not in result.safe_message
    assert "web.fetch" not in calls.count


async def test_a_deny_rule_without_a_reason_ends_its_message_cleanly(kernel_factory, calls):
    kernel = kernel_factory(
        """
        [run]
        profile = "full"

        [[policy.rules]]
        tools = ["web.fetch"]
        action = "deny"

        [[exposure]]
        tools = ["*"]
        """
    )
    run = kernel.start_run()
    result = await kernel.call(run, "web.fetch", {"url": "https://example.org/"})
    assert result.error_code is ErrorCode.POLICY_DENIED
    assert result.safe_message == "web.fetch is not allowed by this run's policy."
    assert calls.count == {}

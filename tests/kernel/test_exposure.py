"""Projection: which tools the model may see, from configuration rules."""

from __future__ import annotations

import pytest

from toolkernel.codes import ErrorCode, Status
from toolkernel.context import ApprovalState, RunState, VerificationStatus
from toolkernel.errors import UsageError
from toolkernel.functions import tool
from toolkernel.ledger import EventType

pytestmark = pytest.mark.anyio

LIFECYCLE = """
[run]
profile = "full"

[policy]
network = "allow"

[[exposure]]
states = ["PLANNING", "EDITING", "VERIFYING"]
tools = ["repo.lookup", "file.peek", "memory.read", "policy.explain"]

[[exposure]]
states = ["EDITING"]
profiles = ["workspace-write", "full"]
tools = ["file.write"]

[[exposure]]
verification = ["PASSED"]
tools = ["pr.*"]

[[exposure]]
approval = ["GRANTED"]
tools = ["repo.reset"]
"""


def names(definitions):
    return sorted(d.name for d in definitions)


def test_exposure_follows_run_state_profile_verification_and_approval(kernel_factory):
    kernel = kernel_factory(LIFECYCLE)
    ctx = kernel.start_run().context
    planning = names(kernel.list_available(ctx))
    assert planning == ["file.peek", "memory.read", "policy.explain", "repo.lookup"]
    editing = names(kernel.list_available(ctx.evolve(run_state=RunState.EDITING)))
    assert "file.write" in editing
    read_only = ctx.evolve(run_state=RunState.EDITING, profile="read-only")
    assert "file.write" not in names(kernel.list_available(read_only))
    assert "pr.create" not in editing
    passed = ctx.evolve(verification=VerificationStatus.PASSED)
    assert "pr.create" in names(kernel.list_available(passed))
    approved = ctx.evolve(approval=ApprovalState.GRANTED)
    assert "repo.reset" in names(kernel.list_available(approved))


def test_default_configuration_exposes_only_read_only_tools(kernel_factory):
    kernel = kernel_factory(None)
    exposed = names(kernel.list_available(kernel.start_run().context))
    assert "repo.lookup" in exposed
    assert "file.peek" in exposed
    assert not {"file.write", "web.fetch", "repo.reset", "pr.create"} & set(exposed)


def test_a_profile_missing_a_tool_permission_hides_it_whatever_the_rules(kernel_factory):
    kernel = kernel_factory(LIFECYCLE)
    ctx = kernel.start_run().context.evolve(run_state=RunState.EDITING, profile="read-only")
    assert "file.write" not in names(kernel.list_available(ctx))


def test_unknown_profile_exposes_nothing(kernel_factory):
    kernel = kernel_factory(LIFECYCLE)
    ctx = kernel.start_run().context.evolve(profile="nonexistent")
    assert kernel.list_available(ctx) == []


async def test_tools_exposed_event_records_definitions_by_canonical_hash(kernel_factory):
    kernel = kernel_factory(LIFECYCLE)
    run = kernel.start_run()
    shown = kernel.expose(run)
    event = kernel.ledger.events(run.id)[-1]
    assert event.type is EventType.TOOLS_EXPOSED
    assert [t["hash"] for t in event.payload["tools"]] == [d.hash for d in shown]
    assert set(event.payload["definitions"]) == {d.hash for d in shown}
    kernel.expose(run)  # shown again: recorded again, full definitions not repeated
    again = kernel.ledger.events(run.id)[-1]
    assert again.type is EventType.TOOLS_EXPOSED
    assert again.payload["definitions"] == {}


async def test_calling_a_registered_but_unexposed_tool_is_denied(kernel_factory, calls):
    kernel = kernel_factory(LIFECYCLE)
    run = kernel.start_run()
    kernel.expose(run)
    result = await kernel.call(run, "file.write", {"path": "src/a.py", "text": "x"})
    assert result.status is Status.DENIED
    assert result.error_code is ErrorCode.TOOL_NOT_EXPOSED
    assert "repo.lookup" in result.safe_message
    assert calls.count == {}


async def test_a_tool_not_shown_to_the_model_stays_unavailable_after_a_state_change(
    kernel_factory,
):
    kernel = kernel_factory(LIFECYCLE)
    run = kernel.start_run()
    kernel.expose(run)  # shown while PLANNING
    run.update(run_state=RunState.EDITING)
    args = {"path": "src/a.py", "text": "x"}
    hidden = await kernel.call(run, "file.write", args)
    assert hidden.error_code is ErrorCode.TOOL_NOT_EXPOSED
    kernel.expose(run)  # the agent loop shows the EDITING tools
    assert (await kernel.call(run, "file.write", args)).status is Status.SUCCEEDED


async def test_unknown_tool_is_denied_listing_the_exposed_tools(kernel_factory):
    kernel = kernel_factory(LIFECYCLE)
    run = kernel.start_run()
    kernel.expose(run)
    result = await kernel.call(run, "repo.nuke", {})
    assert result.error_code is ErrorCode.UNKNOWN_TOOL
    assert "repo.lookup" in result.safe_message
    assert "file.write" not in result.safe_message
    types = [e.type for e in kernel.ledger.events(run.id) if e.tool_call_id == result.tool_call_id]
    assert types == [EventType.TOOL_CALL_REQUEST, EventType.TOOL_CALL_RESULT]


async def test_call_without_version_gets_the_newest_and_unknown_versions_are_denied(
    kernel_factory,
):
    kernel = kernel_factory()
    base = {
        "name": "repo.count",
        "description": "Count.",
        "executionMode": "NATIVE",
        "inputSchema": {"type": "object", "additionalProperties": False},
    }
    kernel.register({**base, "version": "1.0"}, handler=lambda: "one")
    kernel.register({**base, "version": "2.0"}, handler=lambda: "two")
    run = kernel.start_run()
    assert (await kernel.call(run, "repo.count")).structured_output == "two"
    assert (await kernel.call(run, "repo.count", version="1.0")).structured_output == "one"
    missing = await kernel.call(run, "repo.count", version="9.9")
    assert missing.error_code is ErrorCode.UNKNOWN_VERSION
    assert "1.0, 2.0" in missing.safe_message


async def test_a_call_gets_the_version_the_model_was_shown_not_a_newer_one(kernel_factory):
    # Provider calls carry no version: a version registered after the tools were shown
    # is neither validated against nor run until the model is shown it.
    kernel = kernel_factory()
    base = {
        "name": "repo.count",
        "description": "Count.",
        "executionMode": "NATIVE",
        "inputSchema": {"type": "object", "additionalProperties": False},
    }
    kernel.register({**base, "version": "1.0"}, handler=lambda: "one")
    run = kernel.start_run()
    kernel.expose(run)
    kernel.register({**base, "version": "2.0"}, handler=lambda: "two")
    assert (await kernel.call(run, "repo.count")).structured_output == "one"
    kernel.expose(run)
    assert (await kernel.call(run, "repo.count")).structured_output == "two"
    # A program may still pick a version on purpose.
    assert (await kernel.call(run, "repo.count", version="1.0")).structured_output == "one"
    # The shown version withdrawn: the model is told to look again, not handed another.
    kernel.unregister("repo.count", "2.0")
    gone = await kernel.call(run, "repo.count")
    assert gone.error_code is ErrorCode.TOOL_NOT_EXPOSED
    assert "repo.count" not in gone.safe_message.split("Available tools:")[1]


def test_listeners_hear_of_every_tool_registered_or_withdrawn_until_they_stop(
    kernel_factory,
):
    kernel = kernel_factory()
    heard: list[bool] = []
    stop = kernel.on_tools_changed(lambda: heard.append(kernel.registry.find("x.y") is not None))

    @tool("x.y", idempotent=True)
    def xy() -> str:
        """A tool that comes and goes."""
        return "xy"

    kernel.register(xy)
    kernel.unregister("x.y")
    stop()
    kernel.register(xy)
    assert heard == [True, False]  # each change seen after it happened; none after stop


async def test_a_tool_withdrawn_with_a_reason_is_refused_with_it_until_registered_again(
    kernel_factory,
):
    kernel = kernel_factory()

    @tool("x.y", idempotent=True)
    def xy() -> str:
        """A tool that comes and goes."""
        return "xy"

    kernel.register(xy)
    run = kernel.start_run()
    kernel.expose(run)
    kernel.unregister("x.y", reason="Its owner took it away for review.")
    gone = await kernel.call(run, "x.y")
    assert (gone.status, gone.error_code) == (Status.DENIED, ErrorCode.POLICY_DENIED)
    assert gone.safe_message.endswith("Its owner took it away for review.")
    kernel.unregister("x.z", reason="never registered")  # nothing to withdraw: no effect
    assert (await kernel.call(run, "x.z")).error_code is ErrorCode.UNKNOWN_TOOL
    kernel.register(xy)
    kernel.expose(run)
    assert (await kernel.call(run, "x.y")).status is Status.SUCCEEDED
    kernel.unregister("x.y")  # no reason: as if it never was
    assert (await kernel.call(run, "x.y")).error_code is ErrorCode.UNKNOWN_TOOL


MUTATING_ALLOWED = """
[run]
state = "EDITING"
profile = "developer"
[[exposure]]
tools = ["*"]
[policy]
approval = { mutating = "allow" }
"""


async def test_the_version_a_run_was_shown_decides_whether_its_calls_run_alone(kernel_factory):
    """A newer read-only version registered mid-run must not let the shown mutating
    version run beside itself: the turn is split by the version that runs."""
    import time

    from toolkernel.definition import Permissions
    from toolkernel.run import ToolCall

    active, peak = [0], [0]

    def body(tag: str) -> str:
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        time.sleep(0.2)
        active[0] -= 1
        return tag

    writes = Permissions(read_workspace=True, write_workspace=True)

    @tool("t.deploy", version="1.0", mutating=True, permissions=writes)
    def deploy_v1(tag: str) -> str:
        """Deploy for real."""
        return body(tag)

    @tool("t.deploy", version="2.0")
    def deploy_v2(tag: str) -> str:
        """Deploy as a dry run."""
        return body(tag)

    kernel = kernel_factory(MUTATING_ALLOWED)
    kernel.register(deploy_v1)
    run = kernel.start_run()
    kernel.expose(run)
    kernel.register(deploy_v2)
    calls = [ToolCall("t.deploy", {"tag": f"d{i}"}, tool_call_id=f"c{i}") for i in range(3)]
    results = await kernel.call_many(run, calls)
    assert [r.status for r in results] == [Status.SUCCEEDED] * 3
    started = [e for e in kernel.ledger.events(run.id) if e.type is EventType.TOOL_CALL_STARTED]
    assert [e.payload["toolVersion"] for e in started] == ["1.0"] * 3
    assert peak[0] == 1


async def test_policy_explain_knows_a_tool_by_the_name_a_provider_was_shown(kernel_factory):
    """A model shown ``repo__lookup`` asks about that name: the answer is about the
    tool, not that there is no such tool."""
    kernel = kernel_factory()
    run = kernel.start_run()
    arguments = {"query": "x"}
    dotted = await kernel.call(
        run, "policy.explain", {"tool": "repo.lookup", "arguments": arguments}
    )
    spelled = await kernel.call(
        run, "policy.explain", {"tool": "repo__lookup", "arguments": arguments}
    )
    assert spelled.status is Status.SUCCEEDED
    assert spelled.structured_output == dotted.structured_output
    assert "repo.lookup is allowed" in spelled.structured_output["explanation"]
    invented = await kernel.call(run, "policy.explain", {"tool": "repo__nothing"})
    assert invented.structured_output["errorCode"] == "UNKNOWN_TOOL"


@pytest.mark.parametrize(
    ("fields", "named", "choices"),
    [
        ({"run_state": "EDITNG"}, "run_state 'EDITNG'", "use PLANNING, EXPLORING, EDITING,"),
        ({"verification": "passed"}, "verification 'passed'", "use UNKNOWN, PENDING, PASSED,"),
        ({"approval": "YES"}, "approval 'YES'", "use NONE, PENDING, GRANTED, DENIED"),
        ({"profile": "ful"}, "profile 'ful'", "developer, full, read-only, workspace-write"),
        ({"write_scope": "src/**"}, "write_scope", "a list of globs"),
    ],
)
def test_a_run_started_with_a_misspelt_field_is_refused_not_shown_nothing(
    kernel_factory, fields, named, choices
):
    # Matched by no rule, it would expose no tool and deny every call, with no word why.
    kernel = kernel_factory(LIFECYCLE)
    with pytest.raises(UsageError, match=named) as raised:
        kernel.start_run(**fields)
    assert choices in str(raised.value)


def test_a_run_moved_to_a_misspelt_state_keeps_its_context(kernel_factory):
    kernel = kernel_factory(LIFECYCLE)
    run = kernel.start_run(run_state="EDITING", write_scope=["src/**"])
    assert run.context.run_state is RunState.EDITING  # the string is read as the member
    assert run.context.write_scope == ("src/**",)
    with pytest.raises(UsageError, match="run_state 'VERIFY'"):
        run.update(run_state="VERIFY")
    assert run.context.run_state is RunState.EDITING
    assert "file.write" in names(kernel.list_available(run.context))


def test_a_run_moved_to_an_unknown_profile_is_refused_and_keeps_its_profile(kernel_factory):
    kernel = kernel_factory(LIFECYCLE)
    run = kernel.start_run(run_state="EDITING", profile="workspace-write")
    with pytest.raises(UsageError, match="profile 'nope'") as raised:
        run.update(profile="nope")
    assert "developer, full, read-only, workspace-write" in str(raised.value)
    assert run.context.profile == "workspace-write"
    assert "file.write" in names(kernel.list_available(run.context))
    run.update(profile="full")  # a defined one is taken
    assert run.context.profile == "full"


@pytest.mark.parametrize("state", list(RunState))
@pytest.mark.parametrize("profile", ["read-only", "workspace-write", "full"])
@pytest.mark.parametrize("verification", [VerificationStatus.UNKNOWN, VerificationStatus.PASSED])
@pytest.mark.parametrize("approval", [ApprovalState.NONE, ApprovalState.GRANTED])
def test_the_exposure_report_says_why_exactly_for_the_tools_not_exposed(
    kernel_factory, state, profile, verification, approval
):
    kernel = kernel_factory(LIFECYCLE)
    ctx = kernel.start_run(
        run_state=state, profile=profile, verification=verification, approval=approval
    ).context
    exposed = names(kernel.list_available(ctx))
    report = kernel.exposure_report(ctx)
    assert sorted(d.name for d, why in report if why is None) == exposed
    assert len(report) == len(kernel.registry.latest())
    assert all(why for d, why in report if d.name not in exposed)

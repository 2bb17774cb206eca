"""What a tool shapes its result with (ToolFailed, ToolPartial, ToolOutput,
CancelledByRuntime) cannot take its turn down: a malformed one fails its own call, and
every call of the turn is recorded."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from toolkernel.calls import ArtifactRef, ToolCallResult
from toolkernel.cancel import CancelledByRuntime
from toolkernel.codes import ErrorCode, Status
from toolkernel.dispatch import ToolOutput
from toolkernel.errors import ToolFailed, ToolPartial
from toolkernel.functions import tool
from toolkernel.kernel import Kernel
from toolkernel.ledger import Event, EventType
from toolkernel.run import ToolCall
from toolkernel.testing import make_kernel

pytestmark = pytest.mark.anyio

CONFIG = """
[[exposure]]
tools = ["*"]
"""
TOKEN = "ghp_R8kT3mZq9XwL2vN7pB4sY6dF1hJ0cE5aG8uK"
MISSING = f"/home/alice/.config/app/token-{TOKEN}.json"


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    kernel = make_kernel(tmp_path / "ws", CONFIG, workspace_tools=False)

    @tool("t.ok")
    def ok() -> str:
        """Succeed."""
        return "fine"

    kernel.register(ok)
    yield kernel
    kernel.close()


def raising(kernel: Kernel, make: Callable[[], BaseException]) -> None:
    """Register ``t.raise``, which raises what ``make`` builds."""

    @tool("t.raise")
    def raise_it() -> str:
        """Raise what the test chose."""
        raise make()

    kernel.register(raise_it)


async def turn(kernel: Kernel, middle: str) -> tuple[list[ToolCallResult], list[Event]]:
    """``t.ok``, ``middle``, ``t.ok`` as one turn: their results and the run's events."""
    run = kernel.start_run()
    calls = [
        ToolCall(name, {}, tool_call_id=f"c{i}") for i, name in enumerate(("t.ok", middle, "t.ok"))
    ]
    results = await kernel.call_many(run, calls)
    return results, kernel.ledger.events(run.id)


def result_event(events: list[Event], call_id: str) -> Event:
    (event,) = [
        e for e in events if e.type is EventType.TOOL_CALL_RESULT and e.tool_call_id == call_id
    ]
    return event


def assert_fails_alone(
    results: list[ToolCallResult],
    events: list[Event],
    code: ErrorCode = ErrorCode.TOOL_ERROR,
) -> None:
    """The middle call of the turn FAILED with ``code``; its neighbours succeeded, and
    every call of the turn is recorded in full."""
    assert [(r.status, r.error_code) for r in results] == [
        (Status.SUCCEEDED, None),
        (Status.FAILED, code),
        (Status.SUCCEEDED, None),
    ]
    assert_every_call_recorded(events)


def assert_every_call_recorded(events: list[Event]) -> None:
    for call_id in ("c0", "c1", "c2"):
        kinds = [e.type for e in events if e.tool_call_id == call_id]
        assert kinds == [
            EventType.TOOL_CALL_REQUEST,
            EventType.TOOL_CALL_STARTED,
            EventType.TOOL_CALL_RESULT,
        ], call_id


def wrapped_exception() -> ToolFailed:
    """The common slip: the caught exception passed as the message."""
    try:
        Path(MISSING).read_text()
    except OSError as exc:
        return ToolFailed(exc)  # type: ignore[arg-type]
    raise AssertionError("the file should not exist")


async def test_a_tool_failed_with_an_exception_as_message_fails_only_its_call(kernel):
    raising(kernel, wrapped_exception)
    results, events = await turn(kernel, "t.raise")
    assert_fails_alone(results, events)
    shown = json.dumps(results[1].projection())
    assert TOKEN not in shown
    assert "/home/alice" not in shown
    traceback = result_event(events, "c1").payload["internal"]["traceback"]
    assert "FileNotFoundError" in traceback
    assert "ToolFailed's safe_message must be a str, not FileNotFoundError" in traceback


async def test_a_code_outside_the_taxonomy_fails_only_its_call(kernel):
    raising(kernel, lambda: ToolFailed("nope", code="E_" + TOKEN))  # type: ignore[arg-type]
    results, events = await turn(kernel, "t.raise")
    assert_fails_alone(results, events)
    assert result_event(events, "c0").payload["result"]["errorCode"] is None
    assert TOKEN not in json.dumps(results[1].projection())
    traceback = result_event(events, "c1").payload["internal"]["traceback"]
    assert "ToolFailed's code must be an ErrorCode" in traceback


async def test_a_tool_partial_with_a_message_that_is_not_text_fails_only_its_call(kernel):
    raising(kernel, lambda: ToolPartial(b"half of it", output=[1]))  # type: ignore[arg-type]
    results, events = await turn(kernel, "t.raise")
    assert_fails_alone(results, events)


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: ToolFailed(OSError("x")), TypeError),  # type: ignore[arg-type]
        (lambda: ToolFailed("m", code="E_UNKNOWN"), ValueError),  # type: ignore[arg-type]
        (lambda: ToolFailed("m", code=["TOOL_ERROR"]), ValueError),  # type: ignore[arg-type]
        (lambda: ToolFailed("m", retryable="yes"), TypeError),  # type: ignore[arg-type]
        (lambda: ToolFailed("m", artifacts=[{"id": "a"}]), TypeError),  # type: ignore[list-item]
        (lambda: ToolPartial(42), TypeError),  # type: ignore[arg-type]
        (lambda: ToolPartial("m", artifacts=["a"]), TypeError),  # type: ignore[list-item]
    ],
    ids=[
        "message",
        "code",
        "unhashable-code",
        "retryable",
        "failed-artifacts",
        "partial",
        "partial-artifacts",
    ],
)
def test_the_signals_refuse_what_could_not_be_shown_or_recorded(build, error):
    with pytest.raises(error):
        build()


def test_a_code_given_as_its_string_is_taken_as_the_code():
    assert ToolFailed("m", code="NOT_FOUND").code is ErrorCode.NOT_FOUND  # type: ignore[arg-type]


class HandBuilt(ToolFailed):
    """A subclass that skips the constructor's checks and sets what it likes."""

    def __init__(self, **fields: Any) -> None:
        Exception.__init__(self, "hand-built")
        self.safe_message = "A hand-built failure."
        self.code = ErrorCode.NOT_FOUND
        self.retryable = None
        self.output = None
        self.artifacts = ()
        for name, value in fields.items():
            setattr(self, name, value)


class HandBuiltPartial(ToolPartial):
    def __init__(self, message: Any) -> None:
        Exception.__init__(self, "hand-built")
        self.safe_message = message
        self.output = [1]
        self.artifacts = ()


def bare_signal() -> ToolFailed:
    return ToolFailed.__new__(ToolFailed)


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (lambda: HandBuilt(safe_message=FileNotFoundError(MISSING)), "safe_message must be a str"),
        (lambda: HandBuilt(code="E_" + TOKEN), "code must be an ErrorCode"),
        (lambda: HandBuilt(code={"code": "TOOL_ERROR"}), "code must be an ErrorCode"),
        (lambda: HandBuilt(retryable="sometimes"), "retryable must be True, False or None"),
        (lambda: HandBuilt(artifacts=[{"id": "a"}]), "artifacts must be ArtifactRefs"),
        (lambda: HandBuiltPartial(FileNotFoundError(MISSING)), "safe_message must be a str"),
        (bare_signal, "AttributeError"),
        (lambda: CancelledByRuntime("E_" + TOKEN), "CancelledByRuntime"),  # type: ignore[arg-type]
        (lambda: CancelledByRuntime(ErrorCode.NOT_FOUND), "CancelledByRuntime"),
    ],
    ids=[
        "message",
        "unknown-code",
        "unhashable-code",
        "retryable",
        "artifacts",
        "partial-message",
        "no-fields",
        "cancel-unknown-code",
        "cancel-not-a-cancel-code",
    ],
)
async def test_a_malformed_signal_that_bypassed_its_constructor_fails_only_its_call(
    kernel, build, problem
):
    raising(kernel, build)
    results, events = await turn(kernel, "t.raise")
    assert_fails_alone(results, events)
    assert TOKEN not in json.dumps(results[1].projection())
    assert problem in result_event(events, "c1").payload["internal"]["traceback"]


async def test_a_well_formed_hand_built_signal_keeps_its_code_and_message(kernel):
    raising(kernel, lambda: HandBuilt(code="NOT_FOUND"))
    results, _ = await turn(kernel, "t.raise")
    assert results[1].status is Status.FAILED
    assert results[1].error_code is ErrorCode.NOT_FOUND
    assert results[1].safe_message == "A hand-built failure."


async def test_a_cancellation_raised_for_a_cancel_reason_still_cancels(kernel):
    raising(kernel, lambda: CancelledByRuntime(ErrorCode.SUPERSEDED))
    results, _ = await turn(kernel, "t.raise")
    assert (results[1].status, results[1].error_code) == (Status.CANCELLED, ErrorCode.SUPERSEDED)


@pytest.mark.parametrize(
    ("output", "why"),
    [
        (ToolOutput({"a": 1}, summary=ValueError(MISSING)), "summary is of type ValueError"),  # type: ignore[arg-type]
        (ToolOutput({"a": 1}, artifacts=({"id": "a"},)), "other than an ArtifactRef"),  # type: ignore[arg-type]
        (ToolOutput({"a": 1}, artifacts=ArtifactRef("a")), "artifacts is of type ArtifactRef"),  # type: ignore[arg-type]
    ],
    ids=["summary", "artifact", "artifacts-not-a-sequence"],
)
async def test_a_malformed_tool_output_is_a_contract_violation_of_its_call_alone(
    kernel, output, why
):
    @tool("t.output")
    def returns() -> Any:
        """Return what the test chose."""
        return output

    kernel.register(returns)
    results, events = await turn(kernel, "t.output")
    assert_fails_alone(results, events, ErrorCode.OUTPUT_CONTRACT_VIOLATION)
    assert "/home/alice" not in json.dumps(results[1].projection())
    assert why in result_event(events, "c1").payload["internal"]["contractViolation"]


async def test_a_well_formed_tool_output_keeps_its_summary_and_artifacts(kernel):
    ref = kernel.artifacts.put(b"full", media_type="text/plain", description="d", producer="x")

    @tool("t.output")
    def returns() -> Any:
        """Return a summary and a list of refs."""
        return ToolOutput({"a": 1}, summary="Done.", artifacts=[ref])  # type: ignore[arg-type]

    kernel.register(returns)
    results, _ = await turn(kernel, "t.output")
    assert results[1].status is Status.SUCCEEDED
    assert results[1].safe_message == "Done."
    assert results[1].artifacts == (ref,)


@pytest.mark.parametrize(
    ("make", "status"),
    [
        (lambda text: ToolFailed(text), Status.FAILED),
        (lambda text: ToolPartial(text, output="ok"), Status.PARTIAL),
    ],
)
async def test_a_huge_message_is_cut_for_the_model_and_kept_whole_as_an_artifact(
    kernel: Kernel, make: Callable[[str], BaseException], status: Status
):
    log = "".join(f"line {n}: compiling module {n}\n" for n in range(60_000))
    message = f"the build failed\n{log}error: missing symbol `{TOKEN}`\nthe end"
    raising(kernel, lambda: make(message))
    result = await kernel.call(kernel.start_run(), "t.raise", {})
    shown = result.safe_message
    [ref] = result.artifacts
    kept = kernel.artifacts.read(ref.id).decode()
    assert result.status is status
    assert len(shown) <= 2_500
    assert shown.startswith("the build failed\nline 0: compiling module 0\n")
    assert shown.endswith(
        "error: missing symbol `[REDACTED]`\nthe end [Redacted from this result: 1 github-token.]"
    )
    assert f"left out; the whole message is in artifact {ref.id}" in shown
    assert ref.description == "Full message of t.raise"
    assert kept == message  # the operator's copy; artifact.read masks what it shows


async def test_a_message_of_ordinary_length_is_shown_whole(kernel: Kernel):
    message = "x" * 2_000
    raising(kernel, lambda: ToolFailed(message))
    result = await kernel.call(kernel.start_run(), "t.raise", {})
    assert result.safe_message == message
    assert result.artifacts == ()

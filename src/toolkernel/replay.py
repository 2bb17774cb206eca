"""Replay: rebuild a run's tool exchanges from the ledger alone, and serve them again.

``exchanges`` pairs every TOOL_CALL_REQUEST with its TOOL_CALL_RESULT, in ledger
order, giving the tool messages the model saw. ``RecordedResults`` plugs into a
``Kernel(recorded=...)``: calls still go through validation and authorization, but
dispatch returns the recorded result for the same tool and arguments instead of
running the tool again.

A ledger is tamper-evident, not tamper-proof: ``exchanges`` and
``RecordedResults.from_ledger`` verify the run's hash chain first and refuse a run that
fails (unless told ``allow_broken``), since a forged RESULT would be shown or served as
the tool's output.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from toolkernel.calls import ToolCallRequest, ToolCallResult
from toolkernel.codes import ErrorCode, Status
from toolkernel.dispatch import Outcome
from toolkernel.ledger import Event, EventType, Ledger, LedgerError, Problem, VerifyReport

__all__ = ["Exchange", "RecordedResults", "exchanges", "paired", "require_intact"]

_NAMED_PROBLEMS: Final = 5
"""How many of a broken run's problems a refusal names; ``ledger verify`` lists all."""


@dataclass(frozen=True, slots=True)
class Exchange:
    """One call as the ledger recorded it: what was proposed and what the model got."""

    tool_call_id: str
    tool_name: str
    arguments: Any
    arguments_hash: str
    dispatched: bool
    result: ToolCallResult

    def to_dict(self) -> dict[str, Any]:
        return {
            "toolCallId": self.tool_call_id,
            "toolName": self.tool_name,
            "arguments": self.arguments,
            "dispatched": self.dispatched,
            "projection": self.result.projection(),
        }


def exchanges(ledger: Ledger, run_id: str, *, allow_broken: bool = False) -> list[Exchange]:
    """Every completed call of the run, in the order the ledger recorded the requests,
    once the run's hash chain verifies (``allow_broken``: read a run that fails too).
    The events paired are the events verified, from one read of the ledger.

    Raises:
        LedgerError: the run fails verification (its problems are named), or the
            ledger cannot be read.
    """
    read = ledger.read_verified(run_id)
    if not allow_broken:
        require_intact(read.report, run_id)
    if run_id in read.left_out:
        raise LedgerError(read.left_out[run_id])
    return paired(read.events, run_id)


def paired(events: Iterable[Event], run_id: str) -> list[Exchange]:
    """The completed calls among ``events`` (one run's, in ``seq`` order), as
    ``exchanges`` gives them, without verifying anything.

    Calls may share a tool-call id (providers reuse ids across turns). The kernel
    refuses a call whose id is still open, with a RESULT right after its REQUEST, so a
    later event belongs to the latest open REQUEST of its id.

    Raises:
        LedgerError: a RESULT that replay cannot read.
    """
    requests: list[dict[str, Any]] = []
    started: set[int] = set()
    results: dict[int, ToolCallResult] = {}
    open_calls: dict[str, list[int]] = defaultdict(list)
    for event in events:
        call_id = event.tool_call_id
        if call_id is None:
            continue
        if event.type is EventType.TOOL_CALL_REQUEST:
            open_calls[call_id].append(len(requests))
            requests.append(event.payload)
        elif not open_calls[call_id]:
            continue  # an event of no recorded request: the chain check reports it
        elif event.type is EventType.TOOL_CALL_STARTED:
            started.add(open_calls[call_id][-1])
        elif event.type is EventType.TOOL_CALL_RESULT:
            index = open_calls[call_id].pop()
            try:
                results[index] = ToolCallResult.from_dict(event.payload["result"])
            except (KeyError, TypeError, AttributeError, ValueError) as exc:
                raise LedgerError(
                    f"event {event.seq} of run {run_id!r} is not a result replay can read "
                    f"({type(exc).__name__}); verify the ledger"
                ) from exc
    return [
        Exchange(
            tool_call_id=str(request.get("toolCallId", "")),
            tool_name=str(request.get("toolName", "")),
            arguments=request.get("arguments"),
            arguments_hash=str(request.get("argumentsHash", "")),
            dispatched=index in started,
            result=results[index],
        )
        for index, request in enumerate(requests)
        if index in results
    ]


class RecordedResults:
    """Recorded results, served first-in first-out per (tool, arguments hash).

    ``from_ledger`` verifies the run first; the constructor trusts the exchanges it is
    given.
    """

    def __init__(self, recorded: Iterable[Exchange]) -> None:
        self._queues: dict[tuple[str, str], deque[ToolCallResult]] = defaultdict(deque)
        for exchange in recorded:
            if exchange.dispatched:
                key = (exchange.tool_name, exchange.arguments_hash)
                self._queues[key].append(exchange.result)

    @classmethod
    def from_ledger(
        cls, ledger: Ledger, run_id: str, *, allow_broken: bool = False
    ) -> RecordedResults:
        """The results the run recorded, once its hash chain verifies.

        Args:
            ledger: the ledger holding the run.
            run_id: the recorded run.
            allow_broken: serve a run that fails verification anyway (what an edited
                event says would be served as the tool's output).

        Raises:
            LedgerError: the run fails verification (its problems are named), or the
                ledger cannot be read.
        """
        return cls(exchanges(ledger, run_id, allow_broken=allow_broken))

    def take(self, request: ToolCallRequest) -> Outcome:
        """The next recorded outcome for this call, or FAILED/NOT_FOUND."""
        queue = self._queues.get((request.tool_name, request.arguments_hash))
        if not queue:
            return Outcome(
                Status.FAILED,
                ErrorCode.NOT_FOUND,
                f"No recorded result exists for this call of {request.tool_name}; "
                "replay serves only calls that ran in the recorded run.",
            )
        recorded = queue.popleft()
        return Outcome(
            recorded.status,
            recorded.error_code,
            recorded.safe_message,
            output=recorded.structured_output,
            artifacts=recorded.artifacts,
            retryable=recorded.retryable,
            attempts=recorded.usage.attempts,
            internal={"replayedFrom": recorded.tool_call_id},
        )


def require_intact(report: VerifyReport, run_id: str) -> None:
    """Refuse to replay a run whose verify ``report`` found problems.

    Raises:
        LedgerError: naming the first problems.
    """
    if report.ok:
        return
    named = "; ".join(_problem_text(p) for p in report.problems[:_NAMED_PROBLEMS])
    more = len(report.problems) - _NAMED_PROBLEMS
    if more > 0:
        named += f"; and {more} more (toolkernel ledger verify --run {run_id} lists them)"
    raise LedgerError(f"replay refused: run {run_id} fails verification: {named}")


def _problem_text(problem: Problem) -> str:
    where = f"seq {problem.seq}" if problem.seq is not None else "run"
    return f"{where}: {problem.kind}: {problem.detail}"

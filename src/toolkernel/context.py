"""The state of a run that decides what the model may see and do, and what tools get."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from toolkernel.cancel import CancellationToken
from toolkernel.errors import UsageError

if TYPE_CHECKING:
    from toolkernel.kernel import Kernel
    from toolkernel.run import Run

__all__ = [
    "ApprovalState",
    "RunContext",
    "RunState",
    "ToolContext",
    "VerificationStatus",
]


class RunState(StrEnum):
    """Where the run is in its lifecycle; exposure and policy rules key on it."""

    PLANNING = "PLANNING"
    EXPLORING = "EXPLORING"
    EDITING = "EDITING"
    VERIFYING = "VERIFYING"
    REVIEWING = "REVIEWING"
    COMPLETED = "COMPLETED"


class VerificationStatus(StrEnum):
    """What the verifier last said about the run's changes."""

    UNKNOWN = "UNKNOWN"
    PENDING = "PENDING"
    PASSED = "PASSED"
    FAILED = "FAILED"


class ApprovalState(StrEnum):
    """Whether a human has approved the run's plan (run-level, not per call)."""

    NONE = "NONE"
    PENDING = "PENDING"
    GRANTED = "GRANTED"
    DENIED = "DENIED"


@dataclass(frozen=True, slots=True)
class RunContext:
    """A snapshot of the run's state; replace it to move the run along."""

    run_id: str
    run_state: RunState = RunState.PLANNING
    profile: str = "read-only"
    verification: VerificationStatus = VerificationStatus.UNKNOWN
    approval: ApprovalState = ApprovalState.NONE
    write_scope: tuple[str, ...] = ()
    changed_files: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        """Read a state given as its string as the member; refuse one that is none.

        Raises:
            UsageError: a misspelt state (no rule would match it: the run would be
                shown no tool and denied every call, with no word why), or a write
                scope given as one string rather than a list of globs.
        """
        for name, kind in _STATES:
            value = getattr(self, name)
            if type(value) is not kind:
                try:
                    object.__setattr__(self, name, kind(value))
                except ValueError:
                    choices = ", ".join(kind)
                    raise UsageError(f"unknown {name} {value!r}; use {choices}") from None
        scope = self.write_scope
        if type(scope) is not tuple:
            if isinstance(scope, str) or not all(isinstance(glob, str) for glob in scope):
                raise UsageError(f"write_scope must be a list of globs, not {scope!r}")
            object.__setattr__(self, "write_scope", tuple(scope))

    def evolve(self, **changes: Any) -> RunContext:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "runState": str(self.run_state),
            "profile": self.profile,
            "verification": str(self.verification),
            "approval": str(self.approval),
            "writeScope": list(self.write_scope),
        }


_STATES: Final = (
    ("run_state", RunState),
    ("verification", VerificationStatus),
    ("approval", ApprovalState),
)


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a native tool may ask of the runtime while it runs.

    A tool function receives it by declaring a parameter annotated ``ToolContext``;
    that parameter never appears in the tool's input schema.
    """

    run_id: str
    tool_call_id: str
    workspace: Path
    token: CancellationToken
    notes: Mapping[str, str] = field(default_factory=dict)
    report_progress: Callable[[float, float | None, str | None], None] = lambda _p, _t, _m: None
    kernel: Kernel | None = None
    run: Run | None = None
    approved: bool = False
    """The call was held for approval and the approver granted it (APPROVAL_GRANTED)."""

    def progress(self, progress: float, total: float | None = None, message: str = "") -> None:
        """Report progress; it becomes a TOOL_CALL_PROGRESS event."""
        self.report_progress(progress, total, message or None)

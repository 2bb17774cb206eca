"""Approval: a held call waits for a human (or a program standing in for one).

Library users pass an ``Approver`` callback; the CLI uses ``TerminalApprover`` or the
``--approve`` flag (``approve_all``). With no approver the call is DENIED with
APPROVAL_REQUIRED and a message that says how to approve it.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import anyio.to_thread

__all__ = [
    "ApprovalDecision",
    "ApprovalRequest",
    "Approver",
    "TerminalApprover",
    "approve_all",
    "ask",
]


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What the approver is shown: the tool, its full arguments and why it is held."""

    run_id: str
    tool_call_id: str
    tool_name: str
    tool_version: str
    arguments: Mapping[str, Any]
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "toolCallId": self.tool_call_id,
            "toolName": self.tool_name,
            "toolVersion": self.tool_version,
            "arguments": self.arguments,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    approved: bool
    approver: str
    note: str = ""


Approver = Callable[[ApprovalRequest], "ApprovalDecision | Awaitable[ApprovalDecision]"]


def approve_all(approver: str = "auto") -> Approver:
    """An approver that approves everything, recorded under the name ``approver``."""

    def approve(_request: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision(True, approver, "approved in advance")

    return approve


async def ask(approver: Approver, request: ApprovalRequest) -> ApprovalDecision:
    """Call a sync or async approver."""
    answer = approver(request)
    if inspect.isawaitable(answer):
        answer = await answer
    if not isinstance(answer, ApprovalDecision):
        raise TypeError("an approver must return an ApprovalDecision")
    return answer


class TerminalApprover:
    """Asks on the terminal, showing the tool and its full arguments."""

    def __init__(self, stdin: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self._in = stdin or sys.stdin
        self._err = stderr or sys.stderr

    async def __call__(self, request: ApprovalRequest) -> ApprovalDecision:
        return await anyio.to_thread.run_sync(self._prompt, request)

    def _prompt(self, request: ApprovalRequest) -> ApprovalDecision:
        shown = json.dumps(dict(request.arguments), indent=2, ensure_ascii=False)
        self._err.write(
            f"\n{request.tool_name} {request.tool_version} needs approval "
            f"({'; '.join(request.reasons)}).\nArguments:\n{shown}\nApprove? [y/N] "
        )
        self._err.flush()
        answer = self._in.readline().strip().lower()
        return ApprovalDecision(answer in ("y", "yes"), "terminal", f"answered {answer!r}")

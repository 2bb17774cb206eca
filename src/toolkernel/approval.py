"""Approval: a held call waits for a human (or a program standing in for one).

Library users pass an ``Approver`` callback; the CLI uses ``TerminalApprover`` or the
``--approve`` flag (``approve_all``). With no approver the call is DENIED with
APPROVAL_REQUIRED and a message that says how to approve it.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TextIO

from toolkernel.canonical import utf8_text
from toolkernel.daemon import in_daemon_thread
from toolkernel.terminal import json_text, printable

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
    """An approver's answer. ``asked`` is False when nobody could decide (the client
    cannot ask its user, the approver failed): the call is then APPROVAL_REQUIRED,
    not the user's refusal (APPROVAL_REJECTED), which tells the model not to retry.
    ``advice`` then says how the call can be approved, in the result's message (and
    so in the ledger) instead of the runtime's own advice for the CLI and library."""

    approved: bool
    approver: str
    note: str = ""
    asked: bool = True
    advice: str = ""


_THREAD: Final = "toolkernel-approver"

Approver = Callable[[ApprovalRequest], "ApprovalDecision | Awaitable[ApprovalDecision]"]


def approve_all(approver: str = "auto") -> Approver:
    """An approver that approves everything, recorded under the name ``approver``."""

    def approve(_request: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision(True, approver, "approved in advance")

    approve.inline = True  # type: ignore[attr-defined] # it decides at once: no thread
    return approve


async def ask(approver: Approver, request: ApprovalRequest) -> ApprovalDecision:
    """Call a sync or async approver; the answer, checked.

    A sync approver runs in a thread of its own (a human at a prompt must not stop the
    event loop, and with it the run's other calls); when the waiting call is
    cancelled, the thread is abandoned, and as a daemon it does not keep the process
    from exiting while it waits for an answer that no longer matters.

    Raises:
        TypeError: the answer is not an ``ApprovalDecision`` of a bool, a string and
            a string (or ``None``) note.
    """
    if _is_async(approver) or getattr(approver, "inline", False):
        answer = approver(request)
    else:
        answer = await in_daemon_thread(approver, request, name=_THREAD)
    if inspect.isawaitable(answer):
        answer = await answer
    return _checked(answer)


def _is_async(approver: Approver) -> bool:
    call = getattr(approver, "__call__", None)  # noqa: B004 - an instance's async __call__
    return inspect.iscoroutinefunction(approver) or inspect.iscoroutinefunction(call)


def _checked(answer: object) -> ApprovalDecision:
    if not isinstance(answer, ApprovalDecision):
        raise TypeError("an approver must return an ApprovalDecision")
    if type(answer.approved) is not bool or type(answer.asked) is not bool:
        raise TypeError("ApprovalDecision.approved and .asked must be True or False")
    note = "" if answer.note is None else answer.note
    if not all(isinstance(text, str) for text in (answer.approver, note, answer.advice)):
        raise TypeError("ApprovalDecision.approver, .note and .advice must be strings")
    # As the ledger records them: cut, and storable whatever they hold.
    return ApprovalDecision(
        answer.approved,
        utf8_text(answer.approver[:200]),
        utf8_text(note[:500]),
        asked=answer.asked,
        advice=utf8_text(answer.advice[:_MAX_ADVICE]),
    )


_MAX_ADVICE: Final = 1000


class TerminalApprover:
    """Asks on the terminal, showing the tool and its full arguments."""

    def __init__(self, stdin: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self._in = stdin or sys.stdin
        self._err = stderr or sys.stderr

    async def __call__(self, request: ApprovalRequest) -> ApprovalDecision:
        return await in_daemon_thread(self._prompt, request, name=_THREAD)

    def _prompt(self, request: ApprovalRequest) -> ApprovalDecision:
        # The arguments are the model's choice, and a name, a version or a reason can
        # come from a bridged server: what a terminal would act on, or what would hide
        # or reorder text (U+202E), is escaped, so that the human approves what they read.
        shown = json_text(dict(request.arguments), indent=2)
        label = printable(f"{request.tool_name} {request.tool_version}")
        why = "; ".join(printable(reason) for reason in request.reasons)
        self._err.write(f"\n{label} needs approval ({why}).\nArguments:\n{shown}\nApprove? [y/N] ")
        self._err.flush()
        answer = self._in.readline().strip().lower()
        return ApprovalDecision(answer in ("y", "yes"), "terminal", f"answered {answer!r}")

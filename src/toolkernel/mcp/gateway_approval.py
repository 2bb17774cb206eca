"""Approval through the MCP client: the kernel asks the user of the current request.

A gateway serves many requests at once, each from a client that may or may not be
able to ask its user, so the gateway passes each ``tools/call`` its own approver
(``kernel.call(..., approver=...)``), unless the kernel was given one of its own:

* a handshake-era client that declared ``elicitation`` is asked with an
  ``elicitation/create`` form request showing the tool and its full arguments
  (``ElicitingApprover``): accept approves, decline or cancel rejects
  (APPROVAL_REJECTED); a request the client fails (an error, an answer that is no
  form result) asked nobody, and the call's message says how to approve it;
* a 2026-07-28 client cannot receive server requests; the gateway returns an
  ``InputRequiredResult`` carrying the same form, and the client's retry brings the
  answer (``AnsweredApprover``), bound to the tool and arguments it was asked about;
* any other client cannot ask its user (``cannot_ask``): the call is
  DENIED/APPROVAL_REQUIRED, and its message says how to approve it.

The advice (``how_to_approve``) is the approver's answer's ``advice``, so the kernel
records the message the client is sent, word for word.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

import anyio
import mcp_types as types
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError, NoBackChannelError
from pydantic import ValidationError

from toolkernel.approval import ApprovalDecision, ApprovalRequest
from toolkernel.cancel import CancellationToken
from toolkernel.canonical import sha256_of
from toolkernel.policy import NETWORK_REASON
from toolkernel.terminal import json_text, printable

__all__ = [
    "APPROVAL_INPUT",
    "AnsweredApprover",
    "ElicitingApprover",
    "answer_binding",
    "approval_form",
    "cannot_ask",
    "how_to_approve",
]

APPROVAL_INPUT: Final = "toolkernel.approval"
"""The key of the approval form in an ``InputRequiredResult`` and its retry."""

APPROVAL_WAIT_S: Final = 600.0
"""How long a user may take to answer; no answer by then is a rejection."""

APPROVER_NAME: Final = "mcp-elicitation"

_log = logging.getLogger(__name__)

_FORM_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "approve": {
            "type": "boolean",
            "title": "Approve",
            "description": "Run this tool call now.",
            "default": True,
        }
    },
    "required": ["approve"],
}


def approval_form(
    tool: str, version: str | None, arguments: Mapping[str, Any], reasons: Sequence[str]
) -> types.ElicitRequestFormParams:
    """The form shown to the user: the tool, why it is held, and its full arguments.

    The arguments are the model's choice: what would hide or reorder text where the
    client shows the form (bidi overrides, line separators, controls) is escaped, as
    ``toolkernel.terminal`` does, so that the user approves what they read.
    """
    shown = json_text(_sorted(arguments), indent=2)
    why = "; ".join(printable(reason) for reason in reasons) or "the policy asks for approval"
    label = printable(f"{tool} (version {version})" if version else tool)
    message = (
        f"toolkernel: the agent wants to run {label}, which needs your approval ({why}).\n"
        f"Arguments:\n{shown}\n"
        "Accept to run it once; decline to refuse."
    )
    return types.ElicitRequestFormParams(message=message, requested_schema=_FORM_SCHEMA)


def _sorted(value: Any) -> Any:
    """``value`` with the members of every object in key order, for the reader."""
    if isinstance(value, Mapping):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


def answer_binding(tool: str, arguments: Mapping[str, Any]) -> str:
    """What an answer is bound to: this tool with exactly these arguments."""
    return sha256_of({"tool": tool, "arguments": dict(arguments)})


def how_to_approve(tool: str, reasons: Sequence[str] = (), *, unasked: str | None = None) -> str:
    """The gateway's advice when the client cannot ask its user, or (``unasked``, why)
    failed to; ``reasons`` are why the call needs approval (the policy's), and decide
    which setting the advice names: an allow rule does not waive ``network = "ask"``."""
    cannot = (
        "cannot ask its user (it did not declare the elicitation capability)"
        if unasked is None
        else f"could not ask its user (elicitation failed: {unasked})"
    )
    why = f" The call needs approval because {'; '.join(reasons)}." if reasons else ""
    changes = []
    if NETWORK_REASON in reasons:
        changes.append('set network = "allow" under [policy]')
    if not reasons or any(reason != NETWORK_REASON for reason in reasons):
        changes.append(f'add a policy rule ([[policy.rules]] tools = ["{tool}"], action = "allow")')
    return (
        f"This MCP client {cannot}.{why} To allow the call, {' and '.join(changes)} in "
        f"toolkernel.toml and restart toolkernel serve, or run it once with "
        f"`toolkernel call {tool} --args '…' --approve`."
    )


class ElicitingApprover:
    """Asks the client's user with an ``elicitation/create`` form request.

    When the request itself fails, nobody decided: ``unasked`` says why. The kernel
    records the call rejected (the note says the elicitation failed); the gateway
    tells the model APPROVAL_REQUIRED and how to approve, not that the user refused.
    """

    def __init__(
        self,
        session: ServerSession,
        related_request_id: types.RequestId | None,
        token: CancellationToken | None = None,
    ) -> None:
        self._session = session
        self._related = related_request_id
        self._token = token or CancellationToken()  # cancelled: stop waiting for the user
        self.unasked: str | None = None

    async def __call__(self, request: ApprovalRequest) -> ApprovalDecision:
        form = approval_form(
            request.tool_name, request.tool_version, request.arguments, request.reasons
        )
        token = self._token
        answer: types.ElicitResult | None = None
        with anyio.move_on_after(APPROVAL_WAIT_S) as scope, token.watch(scope):
            try:
                answer = await self._session.elicit_form(
                    form.message, form.requested_schema, related_request_id=self._related
                )
            except (MCPError, ValidationError) as exc:
                self.unasked = _failure(exc)
                tool = printable(request.tool_name)
                _log.warning("elicitation for %s failed: %s", tool, self.unasked)
                note = f"elicitation failed: {self.unasked}"
                advice = how_to_approve(request.tool_name, request.reasons, unasked=self.unasked)
                return ApprovalDecision(False, APPROVER_NAME, note, asked=False, advice=advice)
        if answer is None:
            note = "the call was cancelled" if token.cancelled else "no answer in time"
            return ApprovalDecision(False, APPROVER_NAME, note)
        return decide(answer)


def _failure(exc: MCPError | ValidationError) -> str:
    """Why an elicitation failed, in a few words (the ledger's note, the model's advice)."""
    if isinstance(exc, NoBackChannelError):
        return "no channel to the client for the request"
    if isinstance(exc, MCPError):
        return f"the client answered error {exc.code}"
    return "the client's answer is no elicitation result"


def cannot_ask(request: ApprovalRequest) -> ApprovalDecision:
    """The approver of a client that cannot ask its user: nobody decides, and the
    call's message (as the ledger keeps it) says how to approve it."""
    advice = how_to_approve(request.tool_name, request.reasons)
    return ApprovalDecision(False, APPROVER_NAME, _CANNOT_ASK, asked=False, advice=advice)


cannot_ask.inline = True  # type: ignore[attr-defined] # it decides at once: no thread
_CANNOT_ASK: Final = "the client cannot ask its user (no elicitation capability)"


class AnsweredApprover:
    """Uses the answer a 2026-07-28 client brought back with its retried call."""

    def __init__(self, answer: types.ElicitResult) -> None:
        self._answer = answer

    def __call__(self, request: ApprovalRequest) -> ApprovalDecision:
        return decide(self._answer)


def decide(answer: types.ElicitResult) -> ApprovalDecision:
    """Only an accepted form whose required ``approve`` field is ``true`` approves:
    anything else (decline, cancel, no content, ``"no"``, a missing field) rejects."""
    content = answer.content or {}
    approved = answer.action == "accept" and content.get("approve") is True
    if answer.action == "accept" and not approved:
        return ApprovalDecision(
            False, APPROVER_NAME, "user accepted the form without approving the call"
        )
    return ApprovalDecision(approved, APPROVER_NAME, f"user answered {answer.action}")

"""Helpers for testing code that embeds the kernel: recording approvers, an adapter
that answers with the arguments, a kernel on a temporary workspace, and a reader for
the events of a run."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkernel.approval import ApprovalDecision, ApprovalRequest, Approver
from toolkernel.config import CONFIG_FILENAME, load_config
from toolkernel.dispatch import Invocation
from toolkernel.kernel import Kernel
from toolkernel.ledger import Event, EventType

__all__ = ["EchoAdapter", "RecordingApprover", "event_types", "make_kernel"]


@dataclass
class RecordingApprover:
    """Answers every approval request with ``approve`` and keeps the requests it saw."""

    approve: bool = True
    name: str = "test-approver"
    requests: list[ApprovalRequest] = field(default_factory=list)

    def __call__(self, request: ApprovalRequest) -> ApprovalDecision:
        self.requests.append(request)
        return ApprovalDecision(self.approve, self.name)


class EchoAdapter:
    """An adapter (for ``Kernel(adapters=...)``) whose every call answers with its
    arguments and keeps the invocations it saw: stands in for an EXTERNAL_API service."""

    def __init__(self) -> None:
        self.invocations: list[Invocation] = []

    async def invoke(self, invocation: Invocation) -> dict[str, Any]:
        self.invocations.append(invocation)
        return dict(invocation.arguments)


def make_kernel(
    workspace: Path,
    config: str | None = None,
    *,
    approver: Approver | None = None,
    **kwargs: Any,
) -> Kernel:
    """A kernel on ``workspace``; ``config`` is toolkernel.toml text written there."""
    workspace.mkdir(parents=True, exist_ok=True)
    path = None
    if config is not None:
        path = workspace / CONFIG_FILENAME
        path.write_text(textwrap.dedent(config), encoding="utf-8")
    return Kernel(load_config(path, workspace=workspace), approver=approver, **kwargs)


def event_types(events: Sequence[Event], tool_call_id: str | None = None) -> list[EventType]:
    """The types of ``events``, optionally only those of one call."""
    return [e.type for e in events if tool_call_id is None or e.tool_call_id == tool_call_id]

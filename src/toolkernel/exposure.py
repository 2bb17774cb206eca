"""Projection: which tools the model may see now, by rules from the configuration.

A tool is exposed when at least one rule selects it for the run's current state,
permission profile, verification status and approval state, and the profile grants
every permission the tool needs. A configuration with no rules gets `DEFAULT_EXPOSURE`:
every read-only tool.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from toolkernel.context import ApprovalState, RunContext, RunState, VerificationStatus
from toolkernel.definition import Permissions, ToolDefinition

__all__ = ["DEFAULT_EXPOSURE", "ExposureRule", "select_exposed", "why_hidden"]


@dataclass(frozen=True, slots=True)
class ExposureRule:
    """Selects tools by name pattern (and optionally by being read-only) under conditions."""

    tools: tuple[str, ...] = ("*",)
    states: frozenset[RunState] | None = None
    profiles: frozenset[str] | None = None
    verification: frozenset[VerificationStatus] | None = None
    approval: frozenset[ApprovalState] | None = None
    read_only: bool | None = None

    def selects(self, definition: ToolDefinition, ctx: RunContext) -> bool:
        return (
            (self.states is None or ctx.run_state in self.states)
            and (self.profiles is None or ctx.profile in self.profiles)
            and (self.verification is None or ctx.verification in self.verification)
            and (self.approval is None or ctx.approval in self.approval)
            and (self.read_only is None or definition.read_only == self.read_only)
            and any(fnmatchcase(definition.name, pattern) for pattern in self.tools)
        )


DEFAULT_EXPOSURE = (ExposureRule(tools=("*",), read_only=True),)
"""Used when a configuration names no rules: every read-only tool, in every state."""


def select_exposed(
    definitions: Iterable[ToolDefinition],
    rules: Iterable[ExposureRule],
    ctx: RunContext,
    granted: Permissions,
) -> list[ToolDefinition]:
    """The definitions the model may see under ``ctx``, in the order given."""
    rules = tuple(rules)
    return [d for d in definitions if why_hidden(d, rules, ctx, granted) is None]


def why_hidden(
    definition: ToolDefinition,
    rules: tuple[ExposureRule, ...],
    ctx: RunContext,
    granted: Permissions,
) -> str | None:
    """Why ``definition`` is not exposed under ``ctx``, in the configuration's terms;
    ``None`` when it is."""
    missing = definition.permissions.missing_from(granted)
    if missing:
        return f"profile {ctx.profile} lacks {', '.join(missing)}"
    if any(rule.selects(definition, ctx) for rule in rules):
        return None
    if rules == DEFAULT_EXPOSURE:
        return (
            "it is not read-only, and with no [[exposure]] rules configured only "
            "read-only tools are shown"
        )
    return (
        f"no [[exposure]] rule selects it now (state {ctx.run_state}, profile "
        f"{ctx.profile}, verification {ctx.verification}, approval {ctx.approval})"
    )

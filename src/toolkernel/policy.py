"""Authorization: may this run make this (valid) call now?

Separate from validation: validation asks whether the arguments are well-formed;
``authorize`` asks whether the run's task scope, permission profile, run state, path
lists, network policy, approval rules, safety profile, budget and rate limits allow
the call. Its ``Decision`` carries ``allowed``, ``reasonCode``, ``safeMessage`` and
``requiresApproval``. Any error while evaluating denies (fail closed).

Rule precedence: deny beats ask beats audit beats allow. The safety profile's defaults
(``[policy.approval]``: per trait allow, ask, audit or deny) come after the rules: an
explicit ``allow`` rule waives them, never a permission, path, network, budget or rate
check.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from enum import StrEnum
from fnmatch import fnmatchcase
from functools import lru_cache
from pathlib import Path
from typing import Any, Final

from toolkernel.codes import ErrorCode, safe_field, safe_message
from toolkernel.context import RunContext, RunState, VerificationStatus
from toolkernel.definition import ExecutionMode, Permissions, ToolDefinition
from toolkernel.errors import UsageError
from toolkernel.globs import GlobSet, compile_globs, literal_prefix

__all__ = [
    "Action",
    "ApprovalDefaults",
    "Budget",
    "Decision",
    "Policy",
    "PolicyRule",
    "RateLimit",
    "UsageMeter",
    "authorize",
]


class Action(StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"
    AUDIT = "audit"


BUILTIN_PROFILES: Final[dict[str, Permissions]] = {
    "read-only": Permissions(read_workspace=True),
    "workspace-write": Permissions(read_workspace=True, write_workspace=True),
    "developer": Permissions(read_workspace=True, write_workspace=True, execute_command=True),
    "full": Permissions(
        read_workspace=True, write_workspace=True, execute_command=True, network=True
    ),
}


@dataclass(frozen=True, slots=True)
class PolicyRule:
    """Applies ``action`` to the tools matching ``tools`` when every given condition holds."""

    tools: tuple[str, ...]
    action: Action
    states: frozenset[RunState] | None = None
    profiles: frozenset[str] | None = None
    verification: frozenset[VerificationStatus] | None = None
    reason: str = ""

    def applies(self, tool_name: str, ctx: RunContext) -> bool:
        return (
            any(fnmatchcase(tool_name, pattern) for pattern in self.tools)
            and (self.states is None or ctx.run_state in self.states)
            and (self.profiles is None or ctx.profile in self.profiles)
            and (self.verification is None or ctx.verification in self.verification)
        )


@dataclass(frozen=True, slots=True)
class RateLimit:
    calls: int
    per_seconds: float


@dataclass(frozen=True, slots=True)
class Budget:
    """Per-run limits on total cost and on the number of dispatched calls."""

    max_cost: float | None = None
    max_calls: int | None = None
    default_cost: float = 1.0
    costs: Mapping[str, float] = field(default_factory=dict)

    def cost_of(self, tool_name: str) -> float:
        """The tool's own entry, else the first pattern that matches in file order, else
        ``default_cost``."""
        exact = self.costs.get(tool_name)
        if exact is not None:
            return exact
        for pattern, cost in self.costs.items():
            if fnmatchcase(tool_name, pattern):
                return cost
        return self.default_cost


@dataclass(frozen=True, slots=True)
class ApprovalDefaults:
    """What the safety profile alone asks for, before any rule."""

    destructive: Action = Action.ASK
    external: Action = Action.ASK
    mutating: Action = Action.ALLOW
    execute: Action = Action.ALLOW


@dataclass(frozen=True, slots=True)
class Policy:
    profiles: Mapping[str, Permissions] = field(default_factory=lambda: dict(BUILTIN_PROFILES))
    network: Action = Action.DENY
    write_scope: tuple[str, ...] = ()
    path_allow: tuple[str, ...] = ()
    path_deny: tuple[str, ...] = ()
    approval: ApprovalDefaults = field(default_factory=ApprovalDefaults)
    rules: tuple[PolicyRule, ...] = ()
    budget: Budget = field(default_factory=Budget)
    rate_limits: Mapping[str, RateLimit] = field(default_factory=dict)

    def granted(self, profile: str) -> Permissions:
        """The permissions of a profile.

        Raises:
            KeyError: the run names a profile the policy does not define.
        """
        return self.profiles[profile]

    def check_profile(self, profile: str) -> None:
        """Raises:
        UsageError: the policy defines no such profile. A run under it would be
            granted nothing: shown no tool and denied every call, with no word why.
        """
        if profile not in self.profiles:
            known = ", ".join(sorted(self.profiles))
            raise UsageError(f"unknown profile {profile!r}; known profiles: {known}")


@dataclass(frozen=True, slots=True)
class Decision:
    """The authorizer's answer for one call."""

    allowed: bool
    reason_code: ErrorCode | None = None
    safe_message: str = ""
    requires_approval: bool = False
    audit: bool = False
    cost: float = 0.0
    approval_reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "allowed": self.allowed,
            "reasonCode": str(self.reason_code) if self.reason_code else None,
            "safeMessage": self.safe_message,
            "requiresApproval": self.requires_approval,
            "audit": self.audit,
            "approvalReasons": list(self.approval_reasons),
        }


class UsageMeter:
    """What a run has spent so far: cost, dispatched calls, and recent calls per tool."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.cost = 0.0
        self.calls = 0
        self._clock = clock
        self._recent: dict[str, deque[float]] = {}

    def recent_calls(self, key: str, window_s: float) -> int:
        stamps = self._recent.get(key)
        if not stamps:
            return 0
        horizon = self._clock() - window_s
        while stamps and stamps[0] <= horizon:
            stamps.popleft()
        return len(stamps)

    def charge(
        self, tool_name: str, cost: float, rate_keys: Sequence[str], *, ago_s: float = 0.0
    ) -> None:
        """Record a dispatched call (one that started ``ago_s`` seconds ago)."""
        self.cost += cost
        self.calls += 1
        now = self._clock() - ago_s if ago_s > 0 else self._clock()
        for key in rate_keys:
            self._recent.setdefault(key, deque()).append(now)


def _deny(code: ErrorCode, **fields: object) -> Decision:
    return Decision(False, code, safe_message(code, **fields))


def authorize(
    policy: Policy,
    definition: ToolDefinition,
    ctx: RunContext,
    meter: UsageMeter,
    *,
    paths: Sequence[str] = (),
) -> Decision:
    """Decide whether ``definition`` may run now with the given workspace ``paths``.

    Never raises: a policy that cannot be evaluated denies with POLICY_ERROR.
    """
    try:
        return _authorize(policy, definition, ctx, meter, paths)
    except Exception:  # noqa: BLE001 - fail closed is the contract at this boundary
        return _deny(ErrorCode.POLICY_ERROR, tool=definition.name)


def _authorize(
    policy: Policy,
    d: ToolDefinition,
    ctx: RunContext,
    meter: UsageMeter,
    paths: Sequence[str],
) -> Decision:
    standing = _standing(policy, d, ctx)
    if standing.early is not None:
        return standing.early
    denied = _path_problem(policy, d, ctx, paths)
    if denied is not None:
        return denied
    if standing.late is not None:
        return standing.late

    name, budget, cost = d.name, policy.budget, standing.allowed.cost
    if budget.max_cost is not None and meter.cost + cost > budget.max_cost:
        return _deny(ErrorCode.BUDGET_EXCEEDED, tool=name, budget="cost")
    if budget.max_calls is not None and meter.calls + 1 > budget.max_calls:
        return _deny(ErrorCode.BUDGET_EXCEEDED, tool=name, budget="call")
    for pattern, limit in standing.rate_limits:
        if meter.recent_calls(pattern, limit.per_seconds) >= limit.calls:
            return _deny(
                ErrorCode.RATE_LIMITED, tool=name, limit=limit.calls, window=limit.per_seconds
            )
    return standing.allowed


@dataclass(frozen=True, slots=True)
class _Standing:
    """What the policy says of a tool in a run context, before a call's own paths,
    budget and rate limits: a denial that comes before the path check (a rule, a
    permission, the network), one that comes after it (the safety profile), else the
    decision an allowed call gets; and the rate limits the tool counts against."""

    early: Decision | None
    late: Decision | None
    allowed: Decision
    rate_limits: tuple[tuple[str, RateLimit], ...]


# Worked out once per policy, definition and run context (all three are values: a run
# moves on by replacing its context, a reload builds a new policy), not once per call.
# Keyed by identity; the objects are held with the answer, so an id is not reused.
_STANDINGS: dict[tuple[int, int, int], tuple[Policy, ToolDefinition, RunContext, _Standing]] = {}
_MAX_STANDINGS: Final = 512


def _standing(policy: Policy, d: ToolDefinition, ctx: RunContext) -> _Standing:
    key = (id(policy), id(d), id(ctx))
    known = _STANDINGS.get(key)
    if known is not None and known[0] is policy and known[1] is d and known[2] is ctx:
        return known[3]
    standing = _stand(policy, d, ctx)
    if len(_STANDINGS) >= _MAX_STANDINGS:
        _STANDINGS.clear()
    _STANDINGS[key] = (policy, d, ctx, standing)
    return standing


def _stand(policy: Policy, d: ToolDefinition, ctx: RunContext) -> _Standing:
    name = d.name
    limits = tuple(
        (pattern, limit)
        for pattern, limit in policy.rate_limits.items()
        if fnmatchcase(name, pattern)
    )
    allowed = Decision(True, cost=policy.budget.cost_of(name))

    def denied(early: Decision | None = None, late: Decision | None = None) -> _Standing:
        return _Standing(early, late, allowed, limits)

    rules = [rule for rule in policy.rules if rule.applies(name, ctx)] if policy.rules else []
    for rule in rules:
        if rule.action is Action.DENY:
            if rule.states is not None:
                return denied(
                    _deny(
                        ErrorCode.RUN_STATE_DENIED,
                        tool=name,
                        state=ctx.run_state,
                        hint=rule.reason,
                    )
                )
            return denied(_deny(ErrorCode.POLICY_DENIED, tool=name, hint=rule.reason))

    granted = policy.granted(ctx.profile)
    needs_network = d.permissions.network or d.safety.external
    missing = [p for p in d.permissions.missing_from(granted) if p != "network"]
    if missing:
        return denied(_deny(ErrorCode.PERMISSION_DENIED, tool=name, need=", ".join(missing)))
    if needs_network and (policy.network is Action.DENY or not granted.network):
        return denied(_deny(ErrorCode.NETWORK_NOT_ALLOWED, tool=name))

    # An explicit allow rule waives the safety profile's defaults, deny and audit too.
    waived = bool(rules) and any(rule.action is Action.ALLOW for rule in rules)
    defaults = {} if waived else _safety_defaults(policy.approval, d)
    if Action.DENY in defaults:
        hint = f"[policy.approval] denies a tool that {defaults[Action.DENY][0]}."
        return denied(late=_deny(ErrorCode.POLICY_DENIED, tool=name, hint=hint))
    approval_reasons = _approval_reasons(policy, rules, needs_network, defaults)
    audit = (bool(rules) and any(rule.action is Action.AUDIT for rule in rules)) or (
        Action.AUDIT in defaults
    )
    allowed = Decision(
        allowed=True,
        requires_approval=bool(approval_reasons),
        audit=audit,
        cost=allowed.cost,
        approval_reasons=tuple(approval_reasons),
    )
    return _Standing(None, None, allowed, limits)


def rate_keys(policy: Policy, tool_name: str) -> list[str]:
    """The rate-limit patterns a call of ``tool_name`` counts against."""
    if not policy.rate_limits:
        return []
    return [pattern for pattern in policy.rate_limits if fnmatchcase(tool_name, pattern)]


NETWORK_REASON: Final = "it uses the network"
"""The approval reason of ``[policy] network = "ask"`` (an allow rule does not waive it)."""


def write_scope(policy: Policy, ctx: RunContext) -> tuple[str, ...]:
    """The write scope in force: the run's own, else the policy's."""
    return ctx.write_scope or policy.write_scope


def scope_paths(patterns: Sequence[str], workspace: Path) -> tuple[Path, ...] | None:
    """What a command may write under the write scope ``patterns``: the files and
    directories their literal prefixes name (``src/**`` -> ``src``), where they exist
    with no symlink on the way; ``None`` (the whole workspace) without a scope, or
    when a pattern is a name alone (``*.py``), which matches at any depth."""
    if not patterns:
        return None
    found = []
    for pattern in patterns:
        prefix = literal_prefix(pattern)
        if not prefix:
            return None
        path = workspace / prefix
        with suppress(OSError):
            if path.exists() and path.resolve() == path:
                found.append(path)
    return tuple(found)


def _path_problem(
    policy: Policy, d: ToolDefinition, ctx: RunContext, paths: Sequence[str]
) -> Decision | None:
    if not paths:
        return None
    deny = _globs(policy.path_deny)
    allow = _globs(policy.path_allow) if policy.path_allow else None
    for path in paths:
        if _covers(deny, path) or (allow is not None and not _covers(allow, path)):
            return _deny(ErrorCode.PATH_DENIED, tool=d.name, path=safe_field(path, 120))
    writes = d.permissions.write_workspace or d.execution_mode is ExecutionMode.SANDBOX_WRITE
    scope_patterns = write_scope(policy, ctx)
    # A command's paths (its cwd) are where it runs, not what it writes: the sandbox
    # holds what it writes to the scope (scope_paths).
    if writes and scope_patterns and d.execution_mode is not ExecutionMode.PROCESS:
        scope = _globs(scope_patterns)
        for path in paths:
            if not _covers(scope, path):
                return _deny(ErrorCode.WRITE_SCOPE_DENIED, tool=d.name, path=safe_field(path, 120))
    return None


def _covers(globs: GlobSet, path: str) -> bool:
    """Whether ``globs`` match ``path`` or, for a directory, what lies inside it:
    "secrets/**" covers a search of "secrets", "src/**" a command run in "src"."""
    return globs.matches(path) or globs.matches(f"{path}/_")


def _approval_reasons(
    policy: Policy,
    rules: Sequence[PolicyRule],
    needs_network: bool,
    defaults: Mapping[Action, list[str]],
) -> list[str]:
    if rules and any(rule.action is Action.ASK for rule in rules):
        return [
            rule.reason or "a policy rule asks for approval"
            for rule in rules
            if rule.action is Action.ASK
        ]
    reasons = []
    if needs_network and policy.network is Action.ASK:
        reasons.append(NETWORK_REASON)
    return reasons + [f"it {what}" for what in defaults.get(Action.ASK, [])]


def _safety_defaults(defaults: ApprovalDefaults, d: ToolDefinition) -> dict[Action, list[str]]:
    """What ``[policy.approval]`` says of the tool's safety profile: for each action
    other than allow, what about the tool calls for it ("is destructive", …)."""
    said: dict[Action, list[str]] = {}
    for applies, action, what in (
        (d.safety.destructive, defaults.destructive, "is destructive"),
        (d.safety.external, defaults.external, "acts outside the workspace"),
        (d.safety.mutating, defaults.mutating, "changes the workspace"),
        (d.permissions.execute_command, defaults.execute, "runs a command"),
    ):
        if applies and action is not Action.ALLOW:
            said.setdefault(action, []).append(what)
    return said


@lru_cache(maxsize=128)
def _globs(patterns: tuple[str, ...]) -> GlobSet:
    return compile_globs(patterns)

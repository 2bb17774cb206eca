"""Built-in workspace tools and the sandbox adapter they run under.

::

    from toolkernel.tools import install

    kernel = Kernel(config)
    install(kernel)            # registers WORKSPACE_TOOLS and the sandbox adapter

=================  ===================  ====================  =========================
tool               execution mode       concurrency group     runs
=================  ===================  ====================  =========================
``repo.search``    SANDBOX_READ_ONLY    READ_ONLY             ripgrep, sandboxed
``file.read``      SANDBOX_READ_ONLY    READ_ONLY             in-process, link-free walk
``file.patch``     SANDBOX_WRITE        WORKSPACE_MUTATION    in-process, atomic write
``shell.run``      PROCESS              COMMAND_EXECUTION     the argv, sandboxed
``verifier.run``   PROCESS              COMMAND_EXECUTION     the test command, sandboxed
``artifact.read``  NATIVE               READ_ONLY             in-process, the store
=================  ===================  ====================  =========================
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, Final

from toolkernel.codes import ErrorCode
from toolkernel.errors import SandboxUnavailable
from toolkernel.functions import FunctionTool
from toolkernel.policy import Action
from toolkernel.sandbox import SandboxLimits
from toolkernel.tools.adapter import (
    DEFAULT_TEST_COMMAND,
    SANDBOX_MODES,
    CapturedStream,
    CommandResult,
    Sandbox,
    SandboxAdapter,
    SandboxSettings,
    sandbox_for,
)
from toolkernel.tools.artifact_read import artifact_read, check_artifact_read
from toolkernel.tools.commands import (
    DEFAULT_COMMAND_POLICY,
    CommandPolicy,
    CommandRule,
    CommandVerdict,
    check_command,
    command_approval_reasons,
    review_command,
)
from toolkernel.tools.files import check_file_read, file_read
from toolkernel.tools.patch import check_file_patch, file_patch
from toolkernel.tools.search import repo_search
from toolkernel.tools.shell import check_shell_run, shell_run
from toolkernel.tools.verifier import verifier_run
from toolkernel.validation import Violation

if TYPE_CHECKING:
    from toolkernel.kernel import Kernel

__all__ = [
    "DEFAULT_COMMAND_POLICY",
    "DEFAULT_TEST_COMMAND",
    "SANDBOX_MODES",
    "WORKSPACE_TOOLS",
    "CapturedStream",
    "CommandPolicy",
    "CommandResult",
    "CommandRule",
    "CommandVerdict",
    "Sandbox",
    "SandboxAdapter",
    "SandboxSettings",
    "artifact_read",
    "check_command",
    "command_approval_reasons",
    "file_patch",
    "file_read",
    "install",
    "repo_search",
    "review_command",
    "sandbox_for",
    "settings_from_config",
    "shell_run",
    "verifier_run",
]

WORKSPACE_TOOLS: Final[tuple[FunctionTool, ...]] = (
    repo_search,
    file_read,
    file_patch,
    shell_run,
    verifier_run,
    artifact_read,
)

_log = logging.getLogger(__name__)


def install(kernel: Kernel, settings: SandboxSettings | None = None) -> SandboxAdapter | None:
    """Register `WORKSPACE_TOOLS` on ``kernel`` and the sandbox adapter for its modes.

    Tools already registered under the same name and version are left alone, and so
    are adapters the kernel was given for these modes: what the embedder chose wins.
    The ``secret_env`` values are masked from now on in every call's result, not only
    in commands' output: they are in this process's environment, where native tools and
    bridged servers can read them too.

    Returns:
        The adapter, or ``None`` when bubblewrap cannot start here (and unsandboxed
        runs were not allowed): the tools are registered all the same, and calls in
        the sandbox modes are then DENIED with SANDBOX_UNAVAILABLE by the kernel.
    """
    settings = settings or settings_from_config(kernel.config.sandbox)
    for value in settings.secret_env.values():
        kernel.redactor.add_secret(value)
    for workspace_tool in WORKSPACE_TOOLS:
        definition = workspace_tool.definition
        if kernel.registry.find(definition.name, definition.version) is None:
            kernel.register(workspace_tool)
    _add_checks(kernel, settings.command_policy)
    try:
        adapter = SandboxAdapter.create(kernel.config, settings)
    except SandboxUnavailable as exc:
        _log.warning("sandbox-mode tools are refused: %s", exc.reason)
        return None
    for mode, mode_adapter in adapter.adapters().items():
        kernel.adapters.setdefault(mode, mode_adapter)
    return adapter


def settings_from_config(section: Mapping[str, Any]) -> SandboxSettings:
    """``SandboxSettings`` from the ``[sandbox]`` section of toolkernel.toml."""
    limits = SandboxLimits(**section.get("limits", {}))
    rules = tuple(
        CommandRule(tuple(rule["prefix"]), Action(rule["action"]), rule.get("reason", ""))
        for rule in section.get("commands", ())
    )
    if not section.get("replace_default_commands", False):
        rules = (*DEFAULT_COMMAND_POLICY.rules, *rules)
    policy = CommandPolicy(rules, Action(section.get("command_default", "allow")))
    secret_names = section.get("secret_env", ())
    return SandboxSettings(
        allow_unsandboxed=bool(section.get("allow_unsandboxed", False)),
        bwrap=section.get("bwrap"),
        limits=limits,
        env_allow=tuple(section.get("env_allow", ())),
        env_set=dict(section.get("env", {})),
        secret_env={name: os.environ[name] for name in secret_names if name in os.environ},
        path=tuple(section["path"]) if "path" in section else None,
        command_policy=policy,
        test_command=tuple(section.get("test_command", DEFAULT_TEST_COMMAND)),
        rg=section.get("rg"),
    )


def _add_checks(kernel: Kernel, policy: CommandPolicy) -> None:
    """The tools' own argument checks, run in validation (a refused call never starts),
    and ``shell.run``'s command policy: deny in validation, ask in authorization (the
    approver sees the full command)."""

    def argv_of(arguments: Mapping[str, Any]) -> list[str]:
        argv = arguments.get("argv")
        return [str(part) for part in argv] if isinstance(argv, list) else []

    def denied(arguments: Mapping[str, Any]) -> Violation | None:
        verdict = review_command(argv_of(arguments), policy)
        if verdict.action is not Action.DENY:
            return None
        program = PurePosixPath(verdict.command[0]).name if verdict.command else "?"
        reason = verdict.rule.reason if verdict.rule and verdict.rule.reason else "policy"
        detail = f"`{program}` is denied ({reason})"
        return Violation(ErrorCode.COMMAND_NOT_ALLOWED, "argv", {"detail": detail})

    kernel.add_checks(
        "shell.run",
        arguments=lambda arguments: check_shell_run(arguments) or denied(arguments),
        approval=lambda arguments: command_approval_reasons(argv_of(arguments), policy),
    )
    kernel.add_checks("file.read", arguments=check_file_read)
    kernel.add_checks(
        "file.patch", arguments=lambda arguments: check_file_patch(arguments, kernel.guard)
    )
    kernel.add_checks("artifact.read", arguments=check_artifact_read)

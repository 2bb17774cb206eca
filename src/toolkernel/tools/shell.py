"""``shell.run``: one argv in the sandbox, with the workspace writable and no network.

Before anything starts, the command policy judges the argv (see `commands`): a denied
command is INVALID_ARGUMENTS/COMMAND_NOT_ALLOWED; a command the policy asks about runs
only if a human approved *this* call (``ToolContext.approved``: the kernel recorded
APPROVAL_GRANTED before dispatch). That second check keeps "ask" fail-closed even
where the kernel's authorization has not been taught `command_approval_reasons` yet.

The result carries the exit code and a bounded head and tail of each stream; the
complete streams are artifacts. A nonzero exit is FAILED/PROCESS_EXIT_NONZERO with the
same output, so the model sees what went wrong.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final

from annotated_types import Ge, Le, MaxLen, MinLen

from toolkernel.codes import ErrorCode, safe_message
from toolkernel.context import ToolContext
from toolkernel.definition import ConcurrencyGroup, ExecutionMode, Permissions
from toolkernel.dispatch import ToolOutput
from toolkernel.errors import ToolFailed
from toolkernel.functions import NO_NUL, WorkspacePath, tool
from toolkernel.policy import Action
from toolkernel.tools.adapter import sandbox_for
from toolkernel.tools.commands import review_command
from toolkernel.tools.workspace_io import locate
from toolkernel.validation import Violation

__all__ = ["check_shell_run", "display_command", "shell_run"]

_NAME: Final = "shell.run"

# What a shell (and the sandbox, like it) means by these statuses; a program may exit
# with them for its own reasons, hence "a shell's status".
_SHELL_STATUSES: Final[dict[int | None, str]] = {
    126: " (a shell's status for a program that cannot be executed)",
    127: " (a shell's status for a program not found)",
}


@tool(
    _NAME,
    execution_mode=ExecutionMode.PROCESS,
    permissions=Permissions(read_workspace=True, write_workspace=True, execute_command=True),
    mutating=True,
    concurrency_group=ConcurrencyGroup.COMMAND_EXECUTION,
    timeout_ms=600_000,
    tags=("workspace", "builtin"),
)
async def shell_run(
    ctx: ToolContext,
    argv: Annotated[list[Annotated[str, MaxLen(4096), NO_NUL]], MinLen(1), MaxLen(256)],
    cwd: WorkspacePath = ".",
    timeoutMs: Annotated[int, Ge(100), Le(590_000)] = 120_000,
) -> ToolOutput:
    """Run a command (an argv list, no shell) in the sandboxed workspace; no network.

    Args:
        argv: the program and its arguments, e.g. ["pytest", "-q", "tests/"]; to use
            shell syntax, pass ["sh", "-c", "..."].
        cwd: workspace-relative working directory.
        timeoutMs: how long the command may run, in milliseconds.
    """
    sandbox = sandbox_for(ctx)
    if (violation := check_shell_run({"argv": argv})) is not None:
        raise ToolFailed(
            safe_message(
                violation.code, tool=_NAME, property=violation.property, **violation.fields
            ),
            code=violation.code,
        )
    verdict = review_command(argv, sandbox.settings.command_policy)
    if verdict.action is Action.DENY:
        why = verdict.rule.reason if verdict.rule and verdict.rule.reason else "denied by policy"
        raise _not_allowed(f"`{display_command(verdict.command)}` is not allowed ({why})")
    if verdict.action is Action.ASK and not ctx.approved:
        raise ToolFailed(
            safe_message(
                ErrorCode.APPROVAL_REQUIRED,
                tool=_NAME,
                how=f"The command `{display_command(argv)}` must be approved by a human first.",
            ),
            code=ErrorCode.APPROVAL_REQUIRED,
        )
    target = locate(ctx, cwd, tool=_NAME, prop="cwd")
    if not (target.workspace.joinpath(*target.parts)).is_dir():
        raise ToolFailed(
            f"The working directory '{target.relative}' does not exist.", code=ErrorCode.NOT_FOUND
        )
    result = await sandbox.run(
        argv,
        cwd="/".join(target.parts) or ".",
        timeout_s=timeoutMs / 1000,
        label=_NAME,
    )
    shown = display_command(argv)
    data = result.to_dict()
    data.pop("artifacts")  # they travel as the result's artifact refs
    if result.exit_code != 0:
        raise ToolFailed(
            safe_message(
                ErrorCode.PROCESS_EXIT_NONZERO,
                detail=f"`{shown}` exited with status {result.exit_code}"
                f"{_SHELL_STATUSES.get(result.exit_code, '')}; see stderr and stdout.",
            ),
            code=ErrorCode.PROCESS_EXIT_NONZERO,
            output=data,
            artifacts=result.artifacts,
        )
    return ToolOutput(data, f"`{shown}` exited with status 0.", result.artifacts)


def check_shell_run(arguments: Mapping[str, Any]) -> Violation | None:
    """What the schema cannot say about ``shell.run``'s arguments: a program to run.

    `toolkernel.tools.install` has the kernel run this in validation, with the command
    policy's denials, so such a call is refused before it starts; the tool checks
    again when registered without it.
    """
    argv = arguments.get("argv")
    if isinstance(argv, list) and argv and argv[0] == "":
        detail = "the program name is empty"
        return Violation(ErrorCode.COMMAND_NOT_ALLOWED, "argv", {"detail": detail})
    return None


def display_command(argv: Sequence[str], limit: int = 200) -> str:
    """The argv as one shell-quoted line, cut to ``limit`` characters."""
    text = shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _not_allowed(detail: str) -> ToolFailed:
    return ToolFailed(
        safe_message(ErrorCode.COMMAND_NOT_ALLOWED, property="argv", tool=_NAME, detail=detail),
        code=ErrorCode.COMMAND_NOT_ALLOWED,
    )

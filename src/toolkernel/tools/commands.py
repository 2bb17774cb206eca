"""Command policy: allow, ask or deny a command by prefix of its parsed argv.

::

    policy = CommandPolicy((CommandRule(("pytest",), Action.ALLOW),
                            CommandRule(("git", "push"), Action.ASK),
                            CommandRule(("curl",), Action.DENY)))
    check_command(["git", "push", "origin", "main"], policy)   # Action.ASK

The longest matching prefix decides; between rules of equal length the strictest
(deny, then ask) wins. Program names are compared by basename, so ``/usr/bin/curl``
is ``curl``. Common wrappers are looked through (``env A=1 curl``, ``timeout 5
curl``, ``nice``, ``nohup``), and the script of ``sh -c``/``bash -c`` is split into
its simple commands, each checked, the strictest verdict kept. A script that cannot
be parsed needs approval.

This is a guard rail for the approval flow, not the security boundary: a program can
always reach the network or the disk in ways no prefix predicts (``python -c``). The
sandbox (no network, read-only root) is what enforces; the policy decides what a
human sees first.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Final

from toolkernel.policy import Action

__all__ = [
    "DEFAULT_COMMAND_POLICY",
    "CommandPolicy",
    "CommandRule",
    "CommandVerdict",
    "check_command",
    "command_approval_reasons",
    "review_command",
]

_STRICTNESS: Final = {Action.ALLOW: 0, Action.AUDIT: 0, Action.ASK: 1, Action.DENY: 2}
_SHELLS: Final = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
_WRAPPERS: Final = frozenset({"env", "nice", "nohup", "timeout", "stdbuf", "time", "command"})
_SEPARATORS: Final = frozenset({";", "&&", "||", "|", "&", "(", ")", ";;", "|&"})
_MAX_DEPTH: Final = 4


@dataclass(frozen=True, slots=True)
class CommandRule:
    """``action`` for every argv that starts with ``prefix`` (program by basename)."""

    prefix: tuple[str, ...]
    action: Action
    reason: str = ""


@dataclass(frozen=True, slots=True)
class CommandPolicy:
    """Rules by argv prefix, and the action when none matches."""

    rules: tuple[CommandRule, ...] = ()
    default: Action = Action.ALLOW


@dataclass(frozen=True, slots=True)
class CommandVerdict:
    """What the policy says about one command, and which simple command decided it."""

    action: Action
    command: tuple[str, ...]
    rule: CommandRule | None


DEFAULT_COMMAND_POLICY: Final = CommandPolicy(
    rules=(
        *(
            CommandRule((name,), Action.DENY, "network clients are not allowed")
            for name in ("curl", "wget", "ssh", "scp", "sftp", "nc", "ncat", "telnet", "ftp")
        ),
        *(
            CommandRule((name,), Action.DENY, "privilege changes are not allowed")
            for name in ("sudo", "su", "doas")
        ),
        CommandRule(("git", "push"), Action.ASK, "it publishes commits"),
        CommandRule(("git", "reset", "--hard"), Action.ASK, "it discards local changes"),
        CommandRule(("git", "clean"), Action.ASK, "it deletes untracked files"),
        CommandRule(("rm", "-rf"), Action.ASK, "it deletes recursively"),
        CommandRule(("rm", "-fr"), Action.ASK, "it deletes recursively"),
    )
)
"""Deny network clients and privilege changes, ask before publishing or discarding work."""


def review_command(argv: Sequence[str], policy: CommandPolicy) -> CommandVerdict:
    """The strictest verdict over every simple command ``argv`` would run."""
    verdicts = [_judge(command, policy) for command in _simple_commands(list(argv), 0)]
    if not verdicts:
        return CommandVerdict(Action.ASK, tuple(argv), None)
    return max(verdicts, key=lambda v: _STRICTNESS[v.action])


def check_command(argv: Sequence[str], policy: CommandPolicy) -> Action:
    """ALLOW, ASK or DENY for ``argv`` (AUDIT rules count as ALLOW)."""
    action = review_command(argv, policy).action
    return Action.ALLOW if action is Action.AUDIT else action


def command_approval_reasons(argv: Sequence[str], policy: CommandPolicy) -> tuple[str, ...]:
    """Why a human must approve ``argv``, showing the full command; empty when not asked.

    Meant for the kernel's authorization step: append these to the decision's
    ``approval_reasons`` (and set ``requires_approval``) for ``shell.run`` calls.
    """
    verdict = review_command(argv, policy)
    if verdict.action is not Action.ASK:
        return ()
    why = verdict.rule.reason if verdict.rule and verdict.rule.reason else "policy asks"
    return (f"the command `{_display(argv)}` needs approval ({why})",)


def _judge(command: tuple[str, ...], policy: CommandPolicy) -> CommandVerdict:
    best: CommandRule | None = None
    for rule in policy.rules:
        if not _starts_with(command, rule.prefix):
            continue
        if (
            best is None
            or len(rule.prefix) > len(best.prefix)
            or (
                len(rule.prefix) == len(best.prefix)
                and _STRICTNESS[rule.action] > _STRICTNESS[best.action]
            )
        ):
            best = rule
    return CommandVerdict(best.action if best else policy.default, command, best)


def _starts_with(command: tuple[str, ...], prefix: tuple[str, ...]) -> bool:
    if not prefix or len(command) < len(prefix):
        return False
    return _program(command[0]) == _program(prefix[0]) and command[1 : len(prefix)] == prefix[1:]


def _program(word: str) -> str:
    return PurePosixPath(word).name


def _simple_commands(argv: list[str], depth: int) -> list[tuple[str, ...]]:
    """The commands ``argv`` runs, looking through wrappers and ``sh -c`` scripts."""
    if not argv:
        return []
    # A wrapper with nothing to wrap (a bare ``env``) is itself the command.
    argv = _unwrap(argv) or argv
    if depth < _MAX_DEPTH and _program(argv[0]) in _SHELLS and "-c" in argv[1:]:
        script_at = argv.index("-c", 1) + 1
        if script_at >= len(argv):
            return []
        found: list[tuple[str, ...]] = []
        for segment in _split_script(argv[script_at]):
            nested = _simple_commands(segment, depth + 1)
            if not nested:
                return []  # unparsable: the caller turns "nothing understood" into ASK
            found.extend(nested)
        return found
    return [tuple(argv)]


def _unwrap(argv: list[str]) -> list[str]:
    while argv and _program(argv[0]) in _WRAPPERS:
        rest = argv[1:]
        # Skip the wrapper's own options and arguments: env's NAME=value pairs,
        # timeout's duration, nice's -n N. What remains starts at the real program.
        while rest and (rest[0].startswith("-") or "=" in rest[0] or _is_number(rest[0])):
            rest = rest[1:]
        argv = rest
    return argv


def _is_number(word: str) -> bool:
    return word.rstrip("smhd").replace(".", "", 1).isdigit()


def _split_script(script: str) -> list[list[str]]:
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    segments: list[list[str]] = [[]]
    try:
        for token in lexer:
            if token in _SEPARATORS:
                segments.append([])
            else:
                segments[-1].append(token)
    except ValueError:  # unbalanced quotes
        return [[]]
    return [s for s in segments if s] or [[]]


def _display(argv: Sequence[str], limit: int = 500) -> str:
    text = shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 1] + "…"

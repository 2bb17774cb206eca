"""Command policy: allow, ask or deny a command by prefix of its parsed argv.

::

    policy = CommandPolicy((CommandRule(("pytest",), Action.ALLOW),
                            CommandRule(("git", "push"), Action.ASK),
                            CommandRule(("curl",), Action.DENY)))
    check_command(["git", "push", "origin", "main"], policy)   # Action.ASK

The longest matching prefix decides; between rules of equal length the strictest
(deny, then ask) wins. A prefix is matched by its program and operands in order, and
by its options wherever they stand: ``git reset -q --hard HEAD`` and ``git push origin
--force`` match the rules ``git reset --hard`` and ``git push --force``. Program
names are compared by basename, so ``/usr/bin/curl`` is ``curl``. Common wrappers are
looked through with their options (``env A=1 curl``, ``env -C dir curl``, ``timeout
-s KILL 5 curl``, ``nice``, ``nohup``), and the script of ``sh -c``/``bash -c`` is
split into its simple commands, each checked, the strictest verdict kept. A script
that cannot be parsed needs approval, and so does ``env -S``, whose command is a
string env splits itself.

Commands and rule prefixes are compared in one spelling: ``rm``'s recursive and force
flags, however written (``-Rf``, ``-r -f``, ``--recursive --force``, ``-rfv``), are
``rm -rf``; ``git``'s global options (``-C DIR``, ``-c k=v``, ``--git-dir=…``,
``--no-pager``) are skipped, so ``git -C . push`` is ``git push``.

This is a guard rail for the approval flow, not the security boundary: a program can
always reach the network or the disk in ways no prefix predicts (``python -c``,
``find -delete``, ``xargs rm -rf``, a git alias), and a command put together when the
script runs (``sh -c "$CMD"``, ``eval``) is beyond what splitting a ``sh -c`` string
can see. The sandbox (no network, read-only root) is what enforces; the policy decides
what a human sees first.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Final, Literal

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
_OptionKind = Literal["value", "split"]
# Wrapper options whose value is the next word (unless attached: ``-uNAME``,
# ``--unset=NAME``), and env's -S, whose value is the command itself, as a string.
_WRAPPER_OPTIONS: Final[dict[str, dict[str, _OptionKind]]] = {
    "env": {
        **dict.fromkeys(("u", "unset", "C", "chdir"), "value"),
        **dict.fromkeys(("S", "split-string"), "split"),
    },
    "timeout": dict.fromkeys(("s", "signal", "k", "kill-after"), "value"),
    "nice": dict.fromkeys(("n", "adjustment"), "value"),
    "stdbuf": dict.fromkeys(("i", "o", "e", "input", "output", "error"), "value"),
    "time": dict.fromkeys(("f", "format", "o", "output"), "value"),
}
# git's global options whose value is the next word; git takes no abbreviations.
_GIT_VALUE_OPTIONS: Final = frozenset(
    {"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--config-env"}
    | {"--super-prefix", "--attr-source"}
)


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
    spelled = _Shape.of(command)
    best: CommandRule | None = None
    best_length = 0
    for rule in policy.rules:
        prefix = _Shape.of(rule.prefix)
        if not prefix.words or not spelled.matches(prefix):
            continue
        length = len(prefix.words)
        if (
            best is None
            or length > best_length
            or (length == best_length and _STRICTNESS[rule.action] > _STRICTNESS[best.action])
        ):
            best, best_length = rule, length
    return CommandVerdict(best.action if best else policy.default, command, best)


@dataclass(frozen=True, slots=True)
class _Shape:
    """A command, or a rule's prefix, as rules are matched: its canonical words, the
    program and operands in order, and its options as a set (their order, and where
    they stand among the operands, changes nothing about what the program does)."""

    words: tuple[str, ...]
    operands: tuple[str, ...]
    options: frozenset[str]

    @classmethod
    def of(cls, command: Sequence[str]) -> _Shape:
        words = _canonical(command)
        operands: list[str] = []
        options: set[str] = set()
        for at, word in enumerate(words[1:], start=1):
            if word == "--":  # the rest are operands, whatever they look like
                operands += words[at + 1 :]
                break
            if word.startswith("-") and word != "-":
                options.add(word)
            else:
                operands.append(word)
        return cls(words, (*words[:1], *operands), frozenset(options))

    def matches(self, prefix: _Shape) -> bool:
        """Whether ``prefix``'s program and operands begin this command's, and each of
        its options is among this command's (``git reset -q --hard`` is a ``git reset
        --hard``). git takes any unambiguous abbreviation of a subcommand's long option,
        so ``--har`` counts as ``--hard``."""
        if self.operands[: len(prefix.operands)] != prefix.operands:
            return False
        git = self.words[0] == "git"
        return all(
            option in self.options or (git and _abbreviated(option, self.options))
            for option in prefix.options
        )


def _abbreviated(option: str, given: frozenset[str]) -> bool:
    """Whether a long ``option`` is among ``given`` shortened (``--har``), or with a
    value attached (``--hard=x``)."""
    if not option.startswith("--"):
        return False
    names = {word.partition("=")[0] for word in given if word.startswith("--")}
    return any(len(name) > 2 and option.startswith(name) for name in names)


def _canonical(words: Sequence[str]) -> tuple[str, ...]:
    """``words`` spelled the way rules are matched: the program by basename, ``rm``'s
    deletion flags in one spelling, ``git`` from its subcommand on."""
    if not words:
        return ()
    program, args = _program(words[0]), list(words[1:])
    if program == "rm":
        args = _rm_arguments(args)
    elif program == "git":
        args = _git_subcommand(args)
    return (program, *args)


def _rm_arguments(args: list[str]) -> list[str]:
    """``rm``'s arguments as -r/-R/--recursive and -f/--force, spelled ``-rf``, ``-r``
    or ``-f``, then the operands (GNU rm takes options after operands too). Its other
    options (-v, -i, -I, --one-file-system, --no-preserve-root, …) change nothing a
    rule is about, so they are left out: ``rm -rfv .git`` is ``rm -rf .git``. ``--``
    stays only where an operand looks like an option."""
    recursive = force = False
    options: list[str] = []  # read, then left out
    operands: list[str] = []
    for at, word in enumerate(args):
        if word == "--":
            operands += args[at + 1 :]
            break
        if word.startswith("--"):
            # Abbreviations count: no other long option of rm starts with r or f.
            is_recursive, is_force = "recursive".startswith(word[2:]), "force".startswith(word[2:])
            recursive, force = recursive or is_recursive, force or is_force
            if not (is_recursive or is_force):
                options.append(word)
        elif word.startswith("-") and word != "-":
            recursive |= "r" in word[1:] or "R" in word[1:]
            force |= "f" in word[1:]
            if other := "".join(c for c in word[1:] if c not in "rRf"):
                options.append("-" + other)
        else:
            operands.append(word)
    flags = "r" * recursive + "f" * force
    separator = ["--"] if any(o.startswith("-") for o in operands) else []
    return [*(["-" + flags] if flags else []), *separator, *operands]


def _git_subcommand(args: list[str]) -> list[str]:
    """``git``'s arguments from its subcommand on, its global options skipped."""
    at = 0
    while at < len(args) and args[at].startswith("-"):
        at += 2 if args[at] in _GIT_VALUE_OPTIONS else 1
    return args[at:]


def _program(word: str) -> str:
    return PurePosixPath(word).name


def _simple_commands(argv: list[str], depth: int) -> list[tuple[str, ...]]:
    """The commands ``argv`` runs, looking through wrappers and ``sh -c`` scripts."""
    if not argv:
        return []
    unwrapped = _unwrap(argv)
    if unwrapped is None:
        return []  # not understood: the caller turns that into ASK
    # A wrapper with nothing to wrap (a bare ``env``) is itself the command.
    argv = unwrapped or argv
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


def _unwrap(argv: list[str]) -> list[str] | None:
    """The command inside wrappers (empty for a bare wrapper); ``None`` for ``env -S``."""
    while argv and _program(argv[0]) in _WRAPPERS:
        options = _WRAPPER_OPTIONS.get(_program(argv[0]), {})
        rest = argv[1:]
        # Skip the wrapper's own options and arguments: env's NAME=value pairs,
        # timeout's duration, nice's -n N. What remains starts at the real program.
        while rest and (rest[0].startswith("-") or "=" in rest[0] or _is_number(rest[0])):
            kind = _option_kind(rest[0], options)
            if kind == "split":
                return None
            rest = rest[2:] if kind == "value" else rest[1:]
        argv = rest
    return argv


def _option_kind(word: str, options: dict[str, _OptionKind]) -> _OptionKind | None:
    """``"value"`` if ``word`` is a wrapper option whose value is the next word,
    ``"split"`` for env's -S in any spelling, else ``None`` (one word, nothing follows)."""
    if not word.startswith("-"):
        return None  # NAME=value, a duration
    if word.startswith("--"):
        name, equals, _ = word[2:].partition("=")
        # GNU tools take any unambiguous abbreviation of a long option.
        kinds = {kind for long, kind in options.items() if len(long) > 1 and long.startswith(name)}
        if not name or not kinds:
            return None
        if "split" in kinds:
            return "split"
        return None if equals else "value"
    for at, letter in enumerate(word[1:], start=1):
        kind = options.get(letter)
        if kind == "split":
            return "split"
        if kind == "value":  # the rest of the cluster is the value, else the next word is
            return "value" if at == len(word) - 1 else None
    return None


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

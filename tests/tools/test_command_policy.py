"""Command policy verdicts by argv prefix, as the kernel's authorization would ask."""

from __future__ import annotations

import pytest

from toolkernel.policy import Action
from toolkernel.tools import (
    DEFAULT_COMMAND_POLICY,
    CommandPolicy,
    CommandRule,
    check_command,
    command_approval_reasons,
)

POLICY = CommandPolicy(
    (
        CommandRule(("pytest",), Action.ALLOW),
        CommandRule(("git",), Action.ALLOW),
        CommandRule(("git", "push"), Action.ASK, "it publishes commits"),
        CommandRule(("curl",), Action.DENY),
    ),
    default=Action.ASK,
)


@pytest.mark.parametrize(
    ("argv", "action"),
    [
        (["pytest", "-q"], Action.ALLOW),
        (["git", "status"], Action.ALLOW),
        (["git", "push", "origin", "main"], Action.ASK),
        (["curl", "https://x"], Action.DENY),
        (["/usr/bin/curl"], Action.DENY),
        (["timeout", "5", "curl", "x"], Action.DENY),
        (["env", "A=1", "B=2", "git", "push"], Action.ASK),
        (["sh", "-c", "pytest -q && git push"], Action.ASK),
        (["bash", "-c", "git status; curl x | sh"], Action.DENY),
        (["sh", "-c", "echo 'unbalanced"], Action.ASK),
        (["make"], Action.ASK),
    ],
)
def test_the_longest_prefix_decides_and_the_strictest_command_wins(argv, action):
    assert check_command(argv, POLICY) is action


def test_approval_reasons_show_the_full_command():
    (reason,) = command_approval_reasons(["git", "push", "--force", "origin", "main"], POLICY)
    assert "git push --force origin main" in reason
    assert "publishes" in reason
    assert command_approval_reasons(["pytest"], POLICY) == ()


def test_the_default_policy_denies_network_clients_and_asks_before_pushing():
    assert check_command(["wget", "x"], DEFAULT_COMMAND_POLICY) is Action.DENY
    assert check_command(["git", "push"], DEFAULT_COMMAND_POLICY) is Action.ASK
    assert check_command(["python", "-m", "pytest"], DEFAULT_COMMAND_POLICY) is Action.ALLOW
    assert check_command(["env"], DEFAULT_COMMAND_POLICY) is Action.ALLOW

"""Command policy verdicts by argv prefix, as the kernel's authorization would ask."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


@pytest.mark.parametrize(
    "argv",
    [
        ["rm", "-rf", "src"],
        ["rm", "-fr", "src"],
        ["rm", "-Rf", "src"],
        ["rm", "-fR", "src"],
        ["rm", "-r", "-f", "src"],
        ["rm", "-f", "-R", "src"],
        ["rm", "--recursive", "--force", "src"],
        ["rm", "--force", "-r", "src"],
        ["rm", "--rec", "--for", "src"],
        ["rm", "-rfv", "src"],
        ["rm", "-v", "-rfi", "src"],
        ["rm", "src", "-rf"],
        ["/bin/rm", "-Rf", "--no-preserve-root", "/"],
        ["git", "-C", ".", "push"],
        ["git", "-c", "a.b=c", "clean", "-fdx"],
        ["git", "--no-pager", "-C", "sub", "--git-dir=.git", "push", "origin"],
        ["git", "--git-dir", ".git", "--work-tree", ".", "reset", "--hard"],
        ["git", "--namespace=x", "-p", "clean"],
        ["sh", "-c", "cd src && rm -Rf ."],
        ["env", "-C", "src", "rm", "-r", "-f", "."],
        ["env", "-u", "HOME", "git", "push"],
        ["timeout", "-s", "KILL", "5", "rm", "-rf", "src"],
        ["timeout", "--signal", "KILL", "5", "git", "-C", ".", "push"],
        ["nice", "-n", "5", "rm", "-rf", "src"],
        ["stdbuf", "-o", "L", "rm", "-rf", "src"],
    ],
)
def test_spellings_of_recursive_deletion_and_git_global_options_still_ask(argv):
    assert check_command(argv, DEFAULT_COMMAND_POLICY) is Action.ASK


@pytest.mark.parametrize(
    "argv",
    [
        ["rm", "-f", "build.log"],
        ["rm", "-r", "build"],
        ["rm", "--", "-rf"],  # removes the file named "-rf"
        ["git", "-C", "sub", "status"],
        ["git", "-c", "push.default=current", "status"],
        ["git", "log", "--", "push"],
    ],
)
def test_commands_that_only_look_like_a_recursive_deletion_or_a_push_are_allowed(argv):
    assert check_command(argv, DEFAULT_COMMAND_POLICY) is Action.ALLOW


def test_a_configured_rule_is_normalized_like_the_command():
    policy = CommandPolicy((CommandRule(("rm", "-fr"), Action.DENY),))
    assert check_command(["rm", "-R", "--force", "x"], policy) is Action.DENY
    policy = CommandPolicy((CommandRule(("git", "push"), Action.DENY),))
    assert check_command(["git", "-C", ".", "push"], policy) is Action.DENY


def test_env_split_string_is_not_understood_so_it_asks():
    assert check_command(["env", "-S", "rm -rf src"], DEFAULT_COMMAND_POLICY) is Action.ASK


def test_a_duration_or_assignment_after_a_wrapper_is_not_taken_for_an_option():
    assert check_command(["timeout", "5s", "git", "push"], DEFAULT_COMMAND_POLICY) is Action.ASK
    assert check_command(["env", "Au=1", "rm", "-Rf", "x"], DEFAULT_COMMAND_POLICY) is Action.ASK


@pytest.mark.parametrize(
    "argv",
    [
        ["rm", "-rf", ".git"],
        ["rm", "-rfv", ".git"],
        ["rm", "-rf", "--verbose", ".git"],
        ["rm", "-r", "-f", "-I", ".git"],
        ["rm", "--one-file-system", "-Rf", ".git"],
    ],
)
def test_a_rule_naming_an_operand_matches_whatever_other_options_rm_gets(argv):
    policy = CommandPolicy(
        rules=(
            CommandRule(("rm", "-rf"), Action.ASK, "recursive deletion"),
            CommandRule(("rm", "-rf", ".git"), Action.DENY, "never delete history"),
        )
    )
    assert check_command(argv, policy) is Action.DENY


@pytest.mark.parametrize(
    "argv",
    [
        ["git", "reset", "-q", "--hard"],
        ["git", "reset", "--quiet", "--hard", "HEAD~1"],
        ["git", "reset", "HEAD~1", "--hard"],
        ["git", "-C", ".", "reset", "--no-recurse-submodules", "--hard"],
        ["git", "reset", "--har", "HEAD"],  # git takes unambiguous abbreviations
        ["sh", "-c", "git reset -q --hard origin/main"],
    ],
)
def test_a_git_option_a_rule_names_matches_wherever_it_stands(argv):
    assert check_command(argv, DEFAULT_COMMAND_POLICY) is Action.ASK


@pytest.mark.parametrize(
    "argv",
    [
        ["git", "reset", "-q", "HEAD~1"],
        ["git", "reset", "--", "--hard"],  # a path named --hard
        ["git", "checkout", "--hard"],  # another subcommand
        ["git", "log", "--grep", "reset", "--hard"],
    ],
)
def test_a_rule_option_only_matches_as_an_option_of_the_named_subcommand(argv):
    assert check_command(argv, DEFAULT_COMMAND_POLICY) is Action.ALLOW


def test_a_rule_with_an_operand_and_an_option_matches_them_in_any_arrangement():
    policy = CommandPolicy(
        (
            CommandRule(("git", "push"), Action.ASK),
            CommandRule(("git", "push", "origin", "--force"), Action.DENY),
        )
    )
    assert check_command(["git", "push", "--force", "origin", "main"], policy) is Action.DENY
    assert check_command(["git", "push", "origin", "main", "--force"], policy) is Action.DENY
    assert check_command(["git", "push", "upstream", "--force"], policy) is Action.ASK
    assert check_command(["git", "push", "origin", "--force-with-lease"], policy) is Action.ASK


_OPTIONS = st.lists(
    st.sampled_from(["-q", "--quiet", "--no-recurse-submodules", "-v", "--keep"]), max_size=4
)


@given(before=_OPTIONS, after=_OPTIONS, target=st.sampled_from(["HEAD", "HEAD~1", "main"]))
def test_options_around_the_one_a_rule_names_never_change_the_verdict(before, after, target):
    """Property: however other options and the operand are arranged around ``--hard``,
    the rule ``git reset --hard`` decides."""
    for argv in (
        ["git", "reset", *before, "--hard", *after, target],
        ["git", "reset", *before, target, *after, "--hard"],
        ["git", "reset", target, *before, "--hard", *after],
    ):
        assert check_command(argv, DEFAULT_COMMAND_POLICY) is Action.ASK, argv

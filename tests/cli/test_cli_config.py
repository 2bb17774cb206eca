"""Configuration through the CLI: nothing broken is skipped, every refusal names its key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkernel.cli import main


def check(capsys, workspace: Path) -> tuple[int, str, str]:
    code = main(["config", "check", "--workspace", str(workspace)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_dangling_config_link_is_an_error_not_the_defaults(capsys, workspace):
    (workspace / "toolkernel.toml").symlink_to(workspace / "missing.toml")
    code, out, err = check(capsys, workspace)
    assert code == 2
    assert "defaults" not in out
    assert err.startswith("ConfigError: ")
    assert "toolkernel.toml" in err
    assert "Traceback" not in err
    assert main(["call", "memory.read", "--workspace", str(workspace)]) == 2
    assert "ConfigError" in capsys.readouterr().err


def test_a_config_that_is_a_directory_is_an_error(capsys, workspace):
    (workspace / "toolkernel.toml").mkdir()
    code, _, err = check(capsys, workspace)
    assert code == 2
    assert "toolkernel.toml" in err
    assert "not a regular file" in err


def test_config_check_refuses_a_missing_workspace(capsys, tmp_path):
    missing = tmp_path / "nowhere"
    code, out, err = check(capsys, missing)
    assert code == 2
    assert out == ""
    assert str(missing) in err
    assert not missing.exists()


def test_deeply_nested_toml_is_a_config_error(capsys, workspace):
    (workspace / "toolkernel.toml").write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    code, _, err = check(capsys, workspace)
    assert code == 2
    assert err.startswith("ConfigError: ")
    assert "nested too deeply" in err


def test_nesting_the_parser_reads_but_the_schema_cannot_is_named(capsys, workspace):
    (workspace / "toolkernel.toml").write_text("a = " + "[" * 300 + "]" * 300 + "\n")
    code, _, err = check(capsys, workspace)
    assert code == 2
    assert err.startswith("ConfigError: ")
    assert "key 'a'" in err


@pytest.mark.parametrize("value", ["1e309", "nan", "-inf"])
def test_a_non_finite_number_is_named_as_such(capsys, workspace, value):
    (workspace / "toolkernel.toml").write_text(f"[budget]\nmax_cost = {value}\n")
    code, _, err = check(capsys, workspace)
    assert code == 2
    assert "budget.max_cost" in err
    assert "not a finite number" in err
    assert "null" not in err


def test_a_date_is_a_config_error_naming_the_key(capsys, workspace):
    (workspace / "toolkernel.toml").write_text("max_argument_bytes = 1979-05-27T07:32:00Z\n")
    code, _, err = check(capsys, workspace)
    assert code == 2
    assert "max_argument_bytes" in err
    assert "InternalError" not in err


def test_patterns_that_match_no_tool_are_warned_about(capsys, workspace):
    (workspace / "toolkernel.toml").write_text(
        "[[policy.rules]]\n"
        'tools = ["shell.rnu", "shell.run", "git.*"]\n'
        'action = "deny"\n'
        '[rate_limits."file.raed"]\n'
        "calls = 1\n"
        "per_seconds = 1\n"
        "[budget.costs]\n"
        '"nope.*" = 2.0\n'
        '"repo.search" = 1.0\n'
        "[[exposure]]\n"
        'tools = ["memory.read", "mem.read"]\n'
        "[[mcp.servers]]\n"
        'name = "git"\n'
        'command = ["true"]\n'
    )
    code, out, err = check(capsys, workspace)
    assert code == 0
    assert "valid" in out
    warned = [line for line in err.splitlines() if "warning" in line]
    assert len(warned) == 4, err
    for key, pattern in [
        ("policy.rules.0.tools", "shell.rnu"),
        ("rate_limits", "file.raed"),
        ("budget.costs", "nope.*"),
        ("exposure.0.tools", "mem.read"),
    ]:
        assert any(key in line and repr(pattern) in line for line in warned), (key, err)
    assert "git.*" not in err  # a bridged server's namespace is not known at check time


def test_an_unknown_profile_on_the_command_line_is_a_usage_error(capsys, workspace):
    for argv in (["call", "memory.read"], ["tools", "--format", "json"]):
        code = main([*argv, "--profile", "nope", "--workspace", str(workspace)])
        captured = capsys.readouterr()
        assert code == 2
        assert captured.out == ""
        assert "'nope'" in captured.err
        assert "read-only" in captured.err  # the known profiles are listed


def test_a_known_profile_on_the_command_line_still_works(capsys, workspace):
    assert (
        main(["tools", "--profile", "read-only", "--format", "json", "--workspace", str(workspace)])
        == 0
    )
    assert "memory.read" in {t["name"] for t in json.loads(capsys.readouterr().out)}


@pytest.mark.parametrize(
    ("toml", "key", "why"),
    [
        (
            "[policy]\npath_deny = ['src/**', '[z-a]']\n",
            "policy.path_deny.1",
            "bad character range",
        ),
        ("[policy]\nwrite_scope = ['src/[z-a]']\n", "policy.write_scope.0", "bad character"),
        ("extra_forbidden_paths = ['x[z-a]']\n", "extra_forbidden_paths.0", "bad character"),
        (
            "extra_forbidden_paths = ['drafts/notes[v2']\n",
            "extra_forbidden_paths.0",
            "a '[' not closed before the next '/' is a letter here, not to ripgrep",
        ),
        (
            "[policy]\npath_deny = ['*.{pem,key}']\n",
            "policy.path_deny.0",
            "'{' is a letter here and alternatives to ripgrep",
        ),
    ],
)
def test_an_invalid_glob_is_named_when_the_file_is_read(capsys, workspace, toml, key, why):
    """It passed `config check` and then refused every call that takes a path with a
    bare POLICY_ERROR (or a message listing twenty built-in patterns)."""
    (workspace / "toolkernel.toml").write_text(toml)
    code, _, err = check(capsys, workspace)
    assert code == 2
    assert f"key '{key}'" in err
    assert "is not a valid glob" in err
    assert why in err
    assert str(workspace / "toolkernel.toml") in err


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("k" * 100_000 + " = 1\n", "kkkk"),
        ("[[mcp.servers]]\nname = 'x'\ncommand = ['true']\ntimeout_ms = 1e300\n", "timeout_ms"),
        ("[run]\nprofile = '" + "p" * 100_000 + "'\n", "run.profile"),
    ],
)
def test_a_config_error_quotes_a_huge_key_or_value_cut_short(capsys, workspace, toml, key):
    (workspace / "toolkernel.toml").write_text(toml)
    code, _, err = check(capsys, workspace)
    assert code == 2
    assert key in err
    assert len(err) < 600


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[ledger]\npath = 'ledger.db'\n", "ledger.path"),
        ("state_dir = '.'\n", "state_dir"),
        (
            "[[mcp.servers]]\nname = 'a'\ncommand = ['true']\n"
            "[[mcp.servers]]\nname = 'a'\ncommand = ['true']\n",
            "mcp.servers[1].name",
        ),
    ],
)
def test_every_config_error_names_the_file(capsys, workspace, toml, key):
    (workspace / "toolkernel.toml").write_text(toml)
    code, _, err = check(capsys, workspace)
    assert code == 2
    assert f"{workspace / 'toolkernel.toml'}: key '{key}'" in err


def test_ledger_verify_refuses_a_configuration_the_kernel_refuses(capsys, workspace):
    """It said "no ledger" (exit 1) for a ledger placed where no kernel may keep one."""
    (workspace / "toolkernel.toml").write_text("[ledger]\npath = 'ledger.db'\n")
    code = main(["ledger", "verify", "--workspace", str(workspace)])
    err = capsys.readouterr().err
    assert code == 2
    assert "ledger.path" in err


def test_config_check_escapes_control_characters_in_the_paths_it_prints(capsys, tmp_path):
    workspace = tmp_path / "ws\x1b]0;PWNED\x07\x1b[2J"
    workspace.mkdir()
    (workspace / "toolkernel.toml").write_text("[run]\nstate = 'EDITING'\n")
    assert main(["config", "check", "--workspace", str(workspace)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "\x07" not in out
    assert "valid (workspace " in out
    assert "ws\\x1b]0;PWNED\\x07\\x1b[2J" in out


@pytest.mark.parametrize(
    ("files", "tools", "named"),
    [
        ({"broken_tools.py": "def oops(:\n"}, "modules = ['broken_tools']", "tools.modules.0"),
        (
            {"failing_tools.py": "raise RuntimeError('no')\n"},
            "modules = ['failing_tools']",
            "tools.modules.0",
        ),
        ({"defs.json": '{"name": "x.y"}'}, "definitions = ['defs.json']", "tools.definitions.0"),
    ],
)
def test_a_broken_tool_source_is_a_config_error_naming_the_key_and_entry(
    capsys, workspace, monkeypatch, files, tools, named
):
    for name, text in files.items():
        (workspace / name).write_text(text)
    monkeypatch.syspath_prepend(str(workspace))
    (workspace / "toolkernel.toml").write_text(f"[tools]\n{tools}\n")
    assert main(["tools", "--workspace", str(workspace)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ConfigError: {workspace / 'toolkernel.toml'}: key '{named}'")
    assert "InternalError" not in err


@pytest.mark.parametrize("beside", [True, False])
def test_a_module_not_on_the_import_path_says_how_to_put_it_there(capsys, workspace, beside):
    """The toolkernel command does not import from the workspace (on purpose): a module
    written beside toolkernel.toml is not found, and the error says why and what to do."""
    if beside:
        (workspace / "team_tools.py").write_text("X = 1\n")
    (workspace / "toolkernel.toml").write_text("[tools]\nmodules = ['team_tools']\n")
    assert main(["tools", "--workspace", str(workspace)]) == 2
    err = capsys.readouterr().err
    assert "key 'tools.modules.0' ('team_tools')" in err
    assert "not on Python's import path" in err
    assert "pip install -e" in err
    assert "PYTHONPATH" in err
    assert (str(workspace / "team_tools.py") in err) is beside


def test_a_missing_module_that_a_tool_module_imports_is_reported_as_its_error(
    capsys, workspace, monkeypatch
):
    (workspace / "team_tools.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(workspace))
    (workspace / "toolkernel.toml").write_text("[tools]\nmodules = ['team_tools']\n")
    assert main(["tools", "--workspace", str(workspace)]) == 2
    err = capsys.readouterr().err
    assert "No module named 'no_such_dependency_xyz'" in err
    assert "PYTHONPATH" not in err


def data_tool(mode: str) -> str:
    return json.dumps(
        {
            "name": "team.build",
            "version": "1.0",
            "description": "Build the project.",
            "executionMode": mode,
            "permissions": {"executeCommand": True, "network": True},
            "safety": {"mutating": True},
            "inputSchema": {"type": "object", "additionalProperties": False},
        }
    )


@pytest.mark.parametrize(
    ("mode", "fix"),
    [
        ("PROCESS", "tools.modules"),
        ("SANDBOX_READ_ONLY", "tools.modules"),
        ("SANDBOX_WRITE", "tools.modules"),
        ("REMOTE_MCP", "mcp.servers"),
        ("EXTERNAL_API", "adapters="),
    ],
)
def test_a_definitions_file_tool_that_nothing_here_can_run_is_refused_at_load(
    capsys, workspace, mode, fix
):
    # Listed, exposed and then refused on every call with a misleading code, it
    # would look to the user like a policy fault, not like a tool with no code.
    (workspace / "defs.json").write_text(data_tool(mode))
    (workspace / "toolkernel.toml").write_text(
        "[run]\nprofile = 'full'\n[[exposure]]\ntools = ['*']\n"
        "[tools]\ndefinitions = ['defs.json']\n"
    )
    for command in (["tools"], ["call", "team.build"], ["config", "check"]):
        assert main([*command, "--workspace", str(workspace)]) == 2, command
        err = capsys.readouterr().err
        assert err.startswith(
            f"ConfigError: {workspace / 'toolkernel.toml'}: key 'tools.definitions.0'"
        ), err
        assert "team.build: field 'executionMode'" in err
        assert fix in err


@pytest.mark.parametrize(
    ("toml", "key", "why"),
    [
        ('[ledger]\ndsn = "postgresql://ada@db/audit"\n', "ledger.dsn", "backend is 'sqlite'"),
        ('[ledger]\nschema = "audit"\n', "ledger.schema", "backend is 'sqlite'"),
        (
            '[ledger]\nbackend = "postgres"\ndsn = "postgresql://ada@db/audit"\npath = "l.db"\n',
            "ledger.path",
            "backend is 'postgres'",
        ),
        (
            '[ledger]\nbackend = "postgres"\ndsn = "postgresql://ada@db/audit"\n'
            'synchronous = "full"\n',
            "ledger.synchronous",
            "backend is 'postgres'",
        ),
    ],
)
def test_a_ledger_key_the_backend_does_not_read_is_refused(capsys, workspace, toml, key, why):
    # A DSN without backend = "postgres" was ignored: the events went to SQLite while
    # the user believed them in PostgreSQL.
    (workspace / "toolkernel.toml").write_text(toml)
    code, out, err = check(capsys, workspace)
    assert code == 2
    assert out == ""
    assert f"key '{key}'" in err
    assert why in err


def test_config_check_warns_of_a_server_command_not_found(capsys, workspace):
    (workspace / "toolkernel.toml").write_text(
        '[[mcp.servers]]\nname = "git"\ncommand = ["no-such-mcp-server-xyz", "--stdio"]\n'
        '[[mcp.servers]]\nname = "ok"\ncommand = ["true"]\n'
    )
    code, out, err = check(capsys, workspace)
    assert code == 0  # the gateway goes on without it, as it would at serve time
    assert "valid" in out
    warned = [line for line in err.splitlines() if "warning" in line]
    assert len(warned) == 1, err
    assert "key 'mcp.servers.0.command'" in warned[0]
    assert "'no-such-mcp-server-xyz' is not found" in warned[0]


def test_config_check_warns_of_a_path_both_allowed_and_denied(capsys, workspace):
    (workspace / "toolkernel.toml").write_text(
        '[policy]\npath_allow = ["src/**", "docs/**"]\npath_deny = ["src/**"]\n'
    )
    code, _, err = check(capsys, workspace)
    assert code == 0
    warned = [line for line in err.splitlines() if "warning" in line]
    assert len(warned) == 1, err
    assert "'src/**'" in warned[0]
    assert "path_deny wins" in warned[0]

"""Path values the OS cannot use (a NUL, a name too long, an unknown user's home, a
regular file or a symbolic link loop on the way) are configuration errors naming the
key, through the CLI and through ``load_config`` alike: never an InternalError."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from toolkernel.cli import main
from toolkernel.config import CONFIG_FILENAME, Config, LedgerConfig, load_config
from toolkernel.errors import ConfigError
from toolkernel.state import check_placement

# TOML string bodies: escapes are written as TOML reads them.
NUL = "a\\u0000b"
TOO_LONG = "a" * 300
UNKNOWN_HOME = "~nosuchuser_toolkernel/x"
THROUGH_A_FILE = "plain.txt/x"
THROUGH_A_LOOP = "loop/x"

# key named in the message -> the TOML that sets it to {value}
PATH_KEYS = {
    "workspace": 'workspace = "{value}"\n',
    "state_dir": 'state_dir = "{value}"\n',
    "ledger.path": '[ledger]\npath = "{value}"\n',
    "tools.definitions.0": '[tools]\ndefinitions = ["{value}"]\n',
}
# the workspace is taken as written: '~' there is a directory name, not a home
CASES = [
    (key, value)
    for key in PATH_KEYS
    for value in (NUL, TOO_LONG, UNKNOWN_HOME, THROUGH_A_FILE, THROUGH_A_LOOP)
    if (key, value) != ("workspace", UNKNOWN_HOME)
]
# key named in the message -> the TOML that puts a NUL into it
OTHER_STRINGS = {
    "sandbox.bwrap": '[sandbox]\nbwrap = "a\\u0000b"\n',
    "sandbox.rg": '[sandbox]\nrg = "a\\u0000b"\n',
    "sandbox.path.0": '[sandbox]\npath = ["a\\u0000b"]\n',
    "sandbox.env.NAME": '[sandbox.env]\nNAME = "a\\u0000b"\n',
    "mcp.servers.0.cwd": '[[mcp.servers]]\nname = "s"\ncommand = ["true"]\ncwd = "a\\u0000b"\n',
    "mcp.servers.0.command.1": '[[mcp.servers]]\nname = "s"\ncommand = ["x", "a\\u0000b"]\n',
}


@pytest.fixture
def configured(workspace: Path) -> Path:
    """The workspace, with a regular file and a symbolic link loop to point through."""
    (workspace / "plain.txt").write_text("not a directory\n")
    (workspace / "loop").symlink_to("loop")
    return workspace


def write_config(workspace: Path, text: str) -> Path:
    path = workspace / CONFIG_FILENAME
    path.write_text(text, encoding="utf-8")
    return path


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("key", "value"), CASES)
@pytest.mark.parametrize("command", [["config", "check"], ["tools"]])
def test_an_unusable_path_value_exits_2_naming_its_key(capsys, configured, key, value, command):
    path = write_config(configured, PATH_KEYS[key].format(value=value))
    code, err = run_cli(capsys, *command, "--config", str(path))
    assert code == 2
    assert err.startswith("ConfigError: ")
    assert f"key '{key}'" in err
    assert "Traceback" not in err
    assert "\x00" not in err


@pytest.mark.parametrize(("key", "value"), CASES)
def test_load_config_refuses_an_unusable_path_value_naming_its_key(configured, key, value):
    path = write_config(configured, PATH_KEYS[key].format(value=value))
    with pytest.raises(ConfigError, match=f"key '{key}'"):
        load_config(path)


@pytest.mark.parametrize("key", OTHER_STRINGS)
def test_a_nul_in_any_string_value_is_refused_naming_its_key(capsys, workspace, key):
    write_config(workspace, OTHER_STRINGS[key])
    code, err = run_cli(capsys, "config", "check", "--workspace", str(workspace))
    assert code == 2
    assert err.startswith("ConfigError: ")
    assert f"key '{key}'" in err
    with pytest.raises(ConfigError, match=f"key '{key}'"):
        load_config(workspace / CONFIG_FILENAME)


def test_a_nul_in_a_key_name_is_refused(workspace):
    write_config(workspace, '[sandbox.env]\n"A\\u0000B" = "x"\n')
    with pytest.raises(ConfigError, match=r"key 'sandbox\.env\.A\\u0000B'"):
        load_config(workspace / CONFIG_FILENAME)


def test_a_path_that_does_not_exist_yet_is_still_accepted(workspace):
    write_config(workspace, 'state_dir = "state/new"\n[ledger]\npath = "~/ledger-x/l.db"\n')
    config = load_config(workspace / CONFIG_FILENAME)
    assert config.state_dir == workspace.resolve() / "state" / "new"
    assert config.ledger.path == Path.home() / "ledger-x" / "l.db"


@pytest.mark.parametrize("where", [TOO_LONG, THROUGH_A_FILE, THROUGH_A_LOOP, "loop"])
@pytest.mark.parametrize("command", [["config", "check"], ["tools"]])
def test_an_unusable_workspace_option_exits_2_naming_it(capsys, configured, where, command):
    code, err = run_cli(capsys, *command, "--workspace", str(configured / where))
    assert code == 2
    assert err.startswith("ConfigError: workspace: ")
    assert "Traceback" not in err


@pytest.mark.parametrize("where", [TOO_LONG, THROUGH_A_FILE, THROUGH_A_LOOP, "loop"])
def test_an_unusable_config_option_exits_2_naming_the_file(capsys, configured, where):
    code, err = run_cli(capsys, "config", "check", "--config", str(configured / where))
    assert code == 2
    assert err.startswith("ConfigError: ")
    assert "cannot read the configuration" in err
    assert "Traceback" not in err


def test_load_config_refuses_a_nul_in_its_arguments(workspace):
    with pytest.raises(ConfigError, match="workspace: "):
        load_config(workspace=workspace / "a\x00b")
    with pytest.raises(ConfigError, match="cannot read the configuration"):
        load_config(workspace / "a\x00b.toml")


@pytest.mark.parametrize(("field", "key"), [("state_dir", "state_dir"), ("ledger", "ledger.path")])
@pytest.mark.parametrize("value", ["a\x00b", THROUGH_A_LOOP])
def test_check_placement_names_the_key_of_an_unusable_state_path(configured, field, key, value):
    default = Config.default(configured)
    unusable = {"state_dir": configured / value, "ledger": LedgerConfig(path=configured / value)}
    config = replace(default, **{field: unusable[field]})
    with pytest.raises(ConfigError, match=f"^{key}: "):
        check_placement(config)

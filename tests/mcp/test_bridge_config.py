"""``[mcp]`` configuration: parsed into frozen records, errors name the key."""

from __future__ import annotations

import re
import sys
import tomllib

import anyio
import pytest
from fixtures.bridge_support import FIXTURE_SERVER

from toolkernel.cli import main as cli_main
from toolkernel.config import CONFIG_SCHEMA, load_config
from toolkernel.definition import TrustLevel
from toolkernel.errors import ConfigError
from toolkernel.mcp import MCP_CONFIG_SCHEMA, inspect_server, parse_servers, render_inspect
from toolkernel.schema import compile_schema

CONFIG = """
[[mcp.servers]]
name = "git"
command = ["uvx", "mcp-server-git"]
env_allow = ["HOME"]
env = { GIT_AUTHOR_NAME = "bot" }
timeout_ms = 5000
tools = ["git_status", "git_diff"]
trust = "trusted"

[[mcp.servers]]
name = "web"
url = "http://127.0.0.1:8000/mcp"
pin = "strict"
start_timeout_ms = 2500
"""


def test_servers_are_parsed_with_defaults():
    git, web = parse_servers(tomllib.loads(CONFIG)["mcp"])
    assert git.command == ("uvx", "mcp-server-git")
    assert git.transport == "stdio"
    assert web.transport == "http"
    assert git.tools == frozenset({"git_status", "git_diff"})
    assert git.trust is TrustLevel.TRUSTED
    assert web.trust is TrustLevel.UNTRUSTED
    assert git.timeout_ms == 5000
    assert web.timeout_ms == 30_000
    assert git.start_timeout_s == 10.0  # timeout_ms, but never under 10 s
    assert web.start_timeout_s == 2.5
    assert web.tools is None
    assert web.pin == "strict"
    assert git.pin == "tofu"
    assert git.child_env({"HOME": "/h", "AWS_SECRET_ACCESS_KEY": "x"}) == {
        "HOME": "/h",
        "GIT_AUTHOR_NAME": "bot",
    }


def test_the_schema_fragment_accepts_the_example():
    assert compile_schema(MCP_CONFIG_SCHEMA).is_valid(tomllib.loads(CONFIG)["mcp"])


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"servers": [{"name": "a", "command": ["x"], "timeout": 1}]}, "mcp.servers[0].timeout"),
        ({"servers": [{"name": "a", "command": ["x"], "trust": "yes"}]}, "mcp.servers[0].trust"),
        ({"servers": [{"command": ["x"]}]}, "mcp.servers[0].name"),
        ({"servers": [{"name": "1bad", "command": ["x"]}]}, "mcp.servers[0].name"),
        ({"servers": [{"name": "a"}]}, "mcp.servers[0]"),
        ({"servers": [{"name": "a", "command": ["x"], "url": "http://h/mcp"}]}, "mcp.servers[0]"),
        ({"servers": [{"name": "a", "url": "ftp://h"}]}, "mcp.servers[0].url"),
        (
            {"servers": [{"name": "a", "command": ["x"]}, {"name": "a", "command": ["y"]}]},
            "mcp.servers[1].name",
        ),
    ],
)
def test_errors_name_the_key(table, key):
    with pytest.raises(ConfigError, match=re.escape(f"key '{key}'")):
        parse_servers(table)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("sandbox", "read-only"),
        ("env", {"API_TOKEN": "x"}),
        ("env_allow", ["HOME"]),
        ("cwd", "sub"),
        ("network", True),
        ("ro_binds", ["/opt/x"]),
    ],
)
def test_options_of_a_stdio_server_are_refused_for_an_http_one(option, value):
    # Accepted, they would do nothing: an env "for the server" that never reaches it.
    table = {"servers": [{"name": "web", "url": "http://127.0.0.1:9/mcp", option: value}]}
    with pytest.raises(ConfigError, match=re.escape(f"key 'mcp.servers[0].{option}'")) as raised:
        parse_servers(table)
    assert "stdio" in str(raised.value)


@pytest.mark.anyio
async def test_inspect_lists_findings_decisions_and_pins():
    command = [sys.executable, str(FIXTURE_SERVER), "--poison"]
    with anyio.fail_after(30):
        report = await inspect_server(command, name="fx")
    tools = {tool.remote_name: tool for tool in report.tools}
    assert tools["echo"].decision == "accept"
    assert tools["echo"].risk["mutating"]
    assert tools["echo"].risk["external"]
    assert tools["echo"].pin_hash.startswith("sha256:")
    assert tools["add"].decision == "reject"
    assert any(reason["rule"].startswith("P") for reason in tools["add"].reasons)
    text = render_inspect(report)
    assert "REJECT  fx.add" in text
    assert "ACCEPT  fx.echo" in text
    data = render_inspect(report, "json")
    assert '"decision": "reject"' in data


def test_the_config_file_schema_carries_the_server_schema_unchanged(tmp_path):
    assert CONFIG_SCHEMA["properties"]["mcp"] == MCP_CONFIG_SCHEMA
    (tmp_path / "toolkernel.toml").write_text(
        '[[mcp.servers]]\nname = "git"\ncommand = ["mcp-server-git"]\n'
        'sandbox = "read-only"\nro_binds = ["/opt/tools"]\n'
    )
    [server] = load_config(workspace=tmp_path).mcp_servers
    assert (server.sandbox, server.network, server.ro_binds) == (
        "read-only",
        False,
        ("/opt/tools",),
    )


def test_inspecting_a_server_that_dies_at_once_is_a_clear_error(tmp_path, capfd):
    argv = ["mcp", "inspect", "--workspace", str(tmp_path), "--", sys.executable, "-c", "0"]
    assert cli_main(argv) == 2
    err = capfd.readouterr().err
    assert "ServerUnavailable: the server could not be started: it exited" in err
    assert "InternalError" not in err


def test_inspect_can_start_the_server_in_the_sandbox(tmp_path, capfd):
    fixtures = str(FIXTURE_SERVER.parent)
    server = [sys.executable, str(FIXTURE_SERVER), "--files"]
    argv = ["mcp", "inspect", "--workspace", str(tmp_path), "--format", "json"]
    jailed = [*argv, "--sandbox", "read-only", "--", *server]
    assert cli_main([*argv, "--sandbox", "read-only", "--ro-bind", fixtures, "--", *server]) == 0
    assert '"peek"' in capfd.readouterr().out
    assert cli_main(jailed) == 2  # without its own directory, the script cannot be read
    assert "could not be started" in capfd.readouterr().err


def test_inspect_refuses_sandbox_options_that_would_do_nothing(tmp_path, capfd):
    base = ["mcp", "inspect", "--workspace", str(tmp_path)]
    assert cli_main([*base, "--sandbox", "read-only", "http://127.0.0.1:9/mcp"]) == 2
    assert cli_main([*base, "--ro-bind", "/opt", "--", sys.executable, "x.py"]) == 2
    err = capfd.readouterr().err
    assert "a URL is not started here" in err
    assert "add --sandbox" in err


def test_inspect_does_not_call_a_tool_rejected_before_its_risk_was_judged_read_only():
    from toolkernel.mcp.inspect import InspectedTool, InspectReport

    def inspected(name: str, risk: dict[str, bool]) -> InspectedTool:
        decision = "accept" if risk else "reject"
        reasons = () if risk else ({"rule": "D012", "message": "not a valid JSON Schema"},)
        return InspectedTool(name, f"fx.{name}", decision, reasons, (), risk, "sha256:0", None)

    report = InspectReport(
        "fx",
        "python server.py",
        TrustLevel.UNTRUSTED,
        {"name": "fixture"},
        "2025-06-18",
        (
            inspected("broken", {}),
            inspected("lookup", {"mutating": False, "destructive": False, "external": False}),
        ),
    )
    text = render_inspect(report)
    assert "REJECT  fx.broken  [risk not assessed]" in text
    assert "ACCEPT  fx.lookup  [read-only]" in text

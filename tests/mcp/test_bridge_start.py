"""Starting downstream servers: bounded in time, failures that say what
happened, and stdout that is not JSON-RPC reported once instead of a traceback a line."""

from __future__ import annotations

import itertools
import logging
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import anyio
import pytest
from fixtures.bridge_support import (
    FIXTURE_SERVER,
    events_of,
    fixture_server,
    free_port,
    open_kernel,
)

from toolkernel.cli import main as cli_main
from toolkernel.codes import ErrorCode, Status
from toolkernel.definition import TrustLevel
from toolkernel.ledger import EventType
from toolkernel.mcp import McpBridge, ServerConfig, ServerUnavailable, inspect_server
from toolkernel.mcp import bridge as bridge_module
from toolkernel.mcp.inspect import STDERR_SHOWN, InspectedTool, InspectReport, render_inspect

pytestmark = pytest.mark.anyio

GARBAGE_NOTE = "wrote non-JSON-RPC output on stdout: 'garbage'"


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info or "Failed to parse" in r.getMessage()]


def _notes(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


async def test_garbage_on_stdout_is_reported_once_without_a_traceback(caplog):
    server = ServerConfig(
        name="junk",
        command=("sh", "-c", "echo garbage; echo garbage; sleep 5"),
        start_timeout_ms=1000,
    )
    with anyio.fail_after(10), pytest.raises(ServerUnavailable):
        await inspect_server(server)
    assert _notes(caplog, "non-JSON-RPC") == [f"MCP server junk {GARBAGE_NOTE}"]
    assert _tracebacks(caplog) == []


async def test_a_server_that_prints_a_banner_first_still_connects(workspace, caplog):
    command = f"echo garbage; exec '{sys.executable}' '{FIXTURE_SERVER}'"
    server = ServerConfig(name="chatty", command=("sh", "-c", command))
    kernel = open_kernel(workspace)
    with anyio.fail_after(30):
        async with McpBridge(kernel, [server]) as bridge:
            [report] = await bridge.connect_all()
    assert report.connected
    assert "chatty.echo" in report.accepted
    assert _notes(caplog, "non-JSON-RPC") == [f"MCP server chatty {GARBAGE_NOTE}"]
    assert _tracebacks(caplog) == []


async def test_a_server_that_floods_stdout_is_refused_as_broken(caplog):
    with anyio.fail_after(10), pytest.raises(ServerUnavailable, match="not JSON-RPC") as caught:
        await inspect_server(["yes"])
    assert str(caught.value).startswith("the server could not be started: it wrote 100 lines")
    assert len(caplog.records) < 5
    assert _tracebacks(caplog) == []


async def test_a_server_that_floods_stdout_mid_call_fails_remote_error_and_restarts(
    workspace, caplog
):
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    with anyio.fail_after(30):
        async with McpBridge(kernel, [fixture_server("fx", "--babble", timeout_ms=8000)]) as bridge:
            await bridge.connect_all(run)
            flooded = await kernel.call(run, "fx.babble", {})
            again = await kernel.call(run, "fx.echo", {"message": "back"})
    assert flooded.status is Status.FAILED
    assert flooded.error_code is ErrorCode.REMOTE_ERROR
    assert flooded.retryable
    assert again.status is Status.SUCCEEDED
    assert _tracebacks(caplog) == []


async def test_a_server_that_never_answers_is_given_up_after_its_timeout(workspace):
    silent = ServerConfig(name="slow", command=("sleep", "1000"), start_timeout_ms=1000)
    kernel = open_kernel(workspace)
    with anyio.fail_after(10):
        async with McpBridge(kernel, [silent, fixture_server()]) as bridge:
            down, up = await bridge.connect_all()
    assert not down.connected
    assert (
        down.error
        == "MCP server slow could not be started: it did not answer initialize within 1 s"
    )
    assert up.connected


# Answers nothing and exits when its stdin closes: a failed start ends at its timeout,
# with no grace period for the process to go.
MUTE = (sys.executable, "-c", "import sys; sys.stdin.read()")


async def test_servers_start_together_and_are_admitted_in_the_configured_order(workspace):
    mute = [ServerConfig(name=f"mute{n}", command=MUTE, start_timeout_ms=3000) for n in (1, 2)]
    late = fixture_server("late", tools=frozenset({"echo"}))
    late = replace(late, command=("sh", "-c", 'sleep 1; exec "$0" "$@"', *late.command))
    early = fixture_server("early", tools=frozenset({"echo"}))
    kernel = open_kernel(workspace)
    with anyio.fail_after(30):
        async with McpBridge(kernel, [mute[0], late, early, mute[1]]) as bridge:
            began = anyio.current_time()
            reports = await bridge.connect_all()
            took = anyio.current_time() - began
    # One after the other, the two mute servers alone would take the sum of their
    # start timeouts; together they take one. A bound, not a measure of speed.
    assert took < 2 * 3
    assert [(r.server, r.connected) for r in reports] == [
        ("mute1", False),
        ("late", True),
        ("early", True),
        ("mute2", False),
    ]
    rejected = [e.payload["server"] for e in events_of(kernel, EventType.REMOTE_TOOL_REJECTED)]
    assert rejected == sorted(rejected, key=["late", "early"].index)  # late's first
    assert {"late", "early"} <= set(rejected)


def test_a_start_is_bounded_by_the_call_timeout_but_never_below_ten_seconds():
    assert ServerConfig(name="a", command=("x",), timeout_ms=300).start_timeout_s == 10
    assert ServerConfig(name="a", command=("x",), timeout_ms=60_000).start_timeout_s == 60
    assert ServerConfig(name="a", command=("x",), start_timeout_ms=1500).start_timeout_s == 1.5


def _missing_command(tmp_path: Path) -> ServerConfig:
    return ServerConfig(name="x", command=("toolkernel-no-such-command",))


def _missing_cwd(tmp_path: Path) -> ServerConfig:
    return ServerConfig(name="x", command=("cat",), cwd=tmp_path / "gone")


def _not_mcp(tmp_path: Path) -> ServerConfig:
    return ServerConfig(name="x", command=("cat",))


def _unreachable(tmp_path: Path) -> ServerConfig:
    return ServerConfig(name="x", url=f"http://user:secret@127.0.0.1:{free_port()}/mcp?key=k")


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (_missing_command, "command 'toolkernel-no-such-command' not found"),
        (_missing_cwd, "cwd '{tmp}/gone' does not exist"),
        (_not_mcp, "is not an MCP server (it answered initialize with an error: Method not found)"),
        (_unreachable, "could not connect to URL http://127.0.0.1:{port}/mcp (connection refused)"),
    ],
)
async def test_a_start_failure_says_what_happened(
    tmp_path: Path, config: Callable[[Path], ServerConfig], why: str
):
    server = config(tmp_path)
    port = server.url.split(":")[-1].split("/")[0] if server.url else ""
    with anyio.fail_after(10), pytest.raises(ServerUnavailable) as caught:
        await inspect_server(server)
    message = str(caught.value)
    assert message.startswith("MCP server x could not be started: ")
    assert why.format(tmp=tmp_path, port=port) in message
    assert "secret" not in message


async def test_the_model_is_not_told_the_host_path_of_a_server_that_cannot_restart(
    workspace, tmp_path
):
    home = tmp_path / "server-home"
    home.mkdir()
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    with anyio.fail_after(30):
        async with McpBridge(kernel, [fixture_server(cwd=home)]) as bridge:
            await bridge.connect_all(run)
            await kernel.call(run, "fx.crash", {})
            shutil.rmtree(home)
            result = await kernel.call(run, "fx.echo", {"message": "x"})
    assert result.error_code is ErrorCode.REMOTE_ERROR
    assert result.retryable
    assert str(tmp_path) not in str(result.projection())


def test_inspect_without_a_name_says_the_server(tmp_path, capfd):
    argv = ["mcp", "inspect", "--workspace", str(tmp_path), "--", "cat"]
    assert cli_main(argv) == 2
    err = capfd.readouterr().err
    assert err == (
        "ServerUnavailable: the server could not be started: it is not an MCP server "
        "(it answered initialize with an error: Method not found)\n"
    )


async def test_inspect_passes_on_a_bounded_part_of_a_stderr_flood(capfd):
    # `yes >&2` wrote 11 GB to `2>file` in the 30 s start timeout before.
    server = ServerConfig(
        name="flood", command=("sh", "-c", "yes garbage >&2"), start_timeout_ms=1000
    )
    with anyio.fail_after(15), pytest.raises(ServerUnavailable):
        await inspect_server(server)
    err = capfd.readouterr().err
    assert err.startswith("garbage\n")
    assert len(err) < STDERR_SHOWN + 200
    assert re.search(r"\[toolkernel: \d+ more characters of the server's stderr dropped\]", err)


def test_inspect_text_escapes_everything_the_server_said():
    forged = "\x1b[2J\x1b[H\x1b[32mALL TOOLS ACCEPTED\x1b[0m\n"
    report = InspectReport(
        server="srv",
        target="python server.py",
        trust=TrustLevel.UNTRUSTED,
        server_info={"name": f"name{forged}", "version": f"1{forged}"},
        protocol_version="2025-11-25",
        tools=(
            InspectedTool(
                remote_name=f"ok{forged}",
                name=f"srv.ok{forged}",
                decision="reject",
                reasons=({"rule": "P113", "message": f"control characters{forged}"},),
                findings=(
                    {
                        "severity": "error",
                        "rule": "P113",
                        "pointer": f"/inputSchema/properties/p{forged}",
                        "message": f"m{forged}",
                    },
                ),
                risk={},
                pin_hash="sha256:00",
                pin_status=None,
            ),
        ),
    )
    text = render_inspect(report)
    assert "\x1b" not in text
    assert "\\x1b[2J" in text
    assert text.count("\n") == 8  # a newline in a name cannot add a line of its own
    assert "        pin sha256:00" in text  # the layout is kept


TOKEN_NAME = "ghp_" + "R8kT3mZq9XwL2vN7pB4sY6dF1hJ0cE5aG8uK"


@pytest.mark.parametrize(
    ("options", "rejected"),
    [((), None), (("--poison",), "server.add"), (("--named", TOKEN_NAME), f"server.{TOKEN_NAME}")],
)
def test_inspect_exits_1_when_the_bridge_would_reject_a_tool(tmp_path, capfd, options, rejected):
    server = [sys.executable, str(FIXTURE_SERVER), *options]
    argv = ["mcp", "inspect", "--workspace", str(tmp_path), "--", *server]
    assert cli_main(argv) == (1 if rejected else 0)
    out = capfd.readouterr().out
    assert ("REJECT  " in out) is bool(rejected)
    if rejected:
        assert f"REJECT  {rejected}" in out
    assert "ACCEPT  server.echo" in out


def test_version_names_the_installed_package(capsys):
    with pytest.raises(SystemExit) as exited:
        cli_main(["--version"])
    assert exited.value.code == 0
    assert re.fullmatch(r"toolkernel \d+\.\d+\.\d+\S*\n", capsys.readouterr().out)


async def test_inspect_escapes_what_the_server_writes_on_stderr(capfd):
    script = r"printf '\033[2J\033]0;owned\007boom\nnext line\n' >&2; exit 3"
    server = ServerConfig(name="loud", command=("sh", "-c", script), start_timeout_ms=2000)
    with anyio.fail_after(15), pytest.raises(ServerUnavailable):
        await inspect_server(server)
    err = capfd.readouterr().err
    assert "\x1b" not in err
    assert "\x07" not in err
    assert "\\x1b[2J\\x1b]0;owned\\x07boom\nnext line\n" in err  # escaped, lines kept


async def test_a_server_down_when_the_bridge_connects_is_bridged_once_it_is_up(
    workspace, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(bridge_module, "RECONNECT_FIRST_S", 0.05)
    caplog.set_level(logging.INFO, logger="toolkernel.mcp.bridge")
    up = tmp_path / "up"
    command = f"test -f '{up}' && exec '{sys.executable}' '{FIXTURE_SERVER}'"
    server = ServerConfig(name="late", command=("sh", "-c", command))
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    with anyio.fail_after(30):
        async with McpBridge(kernel, [server]) as bridge:
            [report] = await bridge.connect_all(run)
            before = await kernel.call(run, "late.echo", {"message": "early"})
            up.touch()
            while kernel.registry.find("late.echo", None) is None:
                await anyio.sleep(0.02)
            after = await kernel.call(run, "late.echo", {"message": "now"})
    assert not report.connected
    assert before.error_code is ErrorCode.UNKNOWN_TOOL
    assert after.status is Status.SUCCEEDED
    assert after.structured_output == {"content": [{"type": "text", "text": "now"}]}
    [note] = _notes(caplog, "is up")
    assert note.startswith("MCP server late is up: ")


def test_a_server_that_stays_down_is_tried_less_and_less_often():
    waits = list(itertools.islice(bridge_module.reconnect_waits(), 9))
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]

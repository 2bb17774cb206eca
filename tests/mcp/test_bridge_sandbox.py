"""A sandboxed downstream server: bubblewrap around the whole server process."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from fixtures.bridge_support import FIXTURE_SERVER, OPEN_POLICY, fixture_server, open_kernel

from toolkernel.codes import Status
from toolkernel.definition import ExecutionMode
from toolkernel.errors import ConfigError
from toolkernel.mcp import McpBridge
from toolkernel.mcp.sandboxed import sandboxed_argv
from toolkernel.mcp.servers import parse_servers
from toolkernel.testing import EchoAdapter

pytestmark = pytest.mark.anyio

FIXTURES = str(FIXTURE_SERVER.parent)
Calls = list[tuple[str, dict[str, str]]]


def files_server(**fields: Any) -> Any:
    return fixture_server("fx", "--files", ro_binds=(FIXTURES,), **fields)


async def _texts(workspace: Path, server: Any, calls: Calls) -> list[str]:
    kernel = open_kernel(workspace)
    try:
        with anyio.fail_after(60):
            async with McpBridge(kernel, [server]) as bridge:
                [report] = await bridge.connect_all()
                assert report.connected, report.error
                run = kernel.start_run()
                texts = []
                for name, arguments in calls:
                    result = await kernel.call(run, f"fx.{name}", arguments)
                    assert result.status is Status.SUCCEEDED, result.safe_message
                    texts.append(result.structured_output["content"][0]["text"])
                return texts
    finally:
        kernel.close()


@pytest.fixture
def layout(workspace: Path, tmp_path: Path) -> dict[str, str]:
    (workspace / "notes.txt").write_text("workspace notes")
    (workspace / ".env").write_text("API_TOKEN=not-for-servers")
    outside = tmp_path / "outside.txt"
    outside.write_text("host file")
    return {
        "notes": str(workspace / "notes.txt"),
        "env": str(workspace / ".env"),
        "outside": str(outside),
        "ledger": str(workspace / ".toolkernel" / "ledger.db"),
        "new": str(workspace / "new.txt"),
        "git": str(workspace / ".git" / "hooks-evil"),
    }


def _calls(paths: dict[str, str]) -> Calls:
    return [
        ("echo", {"message": "hi"}),
        ("peek", {"path": paths["notes"]}),
        ("peek", {"path": paths["env"]}),
        ("peek", {"path": paths["outside"]}),
        ("touch", {"path": paths["new"]}),
    ]


async def test_an_unsandboxed_server_reaches_everything_the_user_can(workspace, layout):
    texts = await _texts(workspace, files_server(), _calls(layout))
    assert texts == [
        "hi",
        "read: workspace notes",
        "read: API_TOKEN=not-for-servers",
        "read: host file",
        "wrote",
    ]


async def test_a_read_only_sandbox_shows_the_workspace_and_nothing_else(workspace, layout):
    texts = await _texts(workspace, files_server(sandbox="read-only"), _calls(layout))
    assert texts[0] == "hi"
    assert texts[1] == "read: workspace notes"
    assert "not-for-servers" not in texts[2]  # forbidden files are masked
    assert texts[3] == "refused: FileNotFoundError"  # the host outside the workspace
    assert texts[4].startswith("refused: ")  # the workspace is read-only
    assert not Path(layout["new"]).exists()


async def test_a_workspace_sandbox_writes_the_workspace_but_not_git_or_the_ledger(
    workspace, layout
):
    (workspace / ".git").mkdir(exist_ok=True)
    (workspace / "vendor" / ".git").mkdir(parents=True)
    (workspace / "vendor" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    calls = [
        ("touch", {"path": layout["new"]}),
        ("touch", {"path": layout["git"]}),
        ("peek", {"path": layout["ledger"]}),
        ("touch", {"path": str(workspace / "toolkernel.toml")}),
        ("touch", {"path": str(workspace / "vendor" / ".git" / "hook")}),
    ]
    texts = await _texts(workspace, files_server(sandbox="workspace"), calls)
    assert texts[0] == "wrote"
    assert Path(layout["new"]).read_text() == "touched"
    assert texts[1].startswith("refused: ")
    assert texts[2].startswith("refused: ")  # the runtime's state is hidden
    assert texts[3].startswith("refused: ")  # its own sandbox is not its to loosen
    assert texts[4].startswith("refused: ")  # nor a nested repository's hooks
    assert not Path(layout["git"]).exists()
    assert "touched" not in (workspace / "toolkernel.toml").read_text()


async def test_a_workspace_sandbox_cannot_change_the_tool_definitions_the_runtime_loads(
    workspace,
):
    # They say what may run on the host at the next start (its flags, its permissions).
    definitions = workspace / "defs" / "build.toml"
    definitions.parent.mkdir()
    definitions.write_text(
        'name = "team.build"\nversion = "1.0"\ndescription = "Build."\n'
        'executionMode = "EXTERNAL_API"\n[inputSchema]\ntype = "object"\n'
        "additionalProperties = false\n"
    )
    before = definitions.read_text()
    config = OPEN_POLICY + '\n[tools]\ndefinitions = ["defs/build.toml"]\n'
    kernel = open_kernel(workspace, config, adapters={ExecutionMode.EXTERNAL_API: EchoAdapter()})
    try:
        with anyio.fail_after(60):
            async with McpBridge(kernel, [files_server(sandbox="workspace")]) as bridge:
                [report] = await bridge.connect_all()
                assert report.connected, report.error
                touch = {"path": str(definitions)}
                result = await kernel.call(kernel.start_run(), "fx.touch", touch)
    finally:
        kernel.close()
    assert result.structured_output["content"][0]["text"].startswith("refused: ")
    assert definitions.read_text() == before


async def test_without_bubblewrap_a_sandboxed_server_is_unavailable_not_unsandboxed(
    workspace, layout
):
    kernel = open_kernel(workspace)
    kernel.config = replace(kernel.config, sandbox={"bwrap": "/nonexistent/bwrap"})
    try:
        with anyio.fail_after(60):
            async with McpBridge(kernel, [files_server(sandbox="read-only")]) as bridge:
                [report] = await bridge.connect_all()
    finally:
        kernel.close()
    assert report.connected is False
    assert report.error is not None
    assert "bwrap" in report.error or "bubblewrap" in report.error
    assert kernel.registry.find("fx.peek") is None


def test_only_a_stdio_server_can_be_sandboxed() -> None:
    servers = parse_servers(
        {"servers": [{"name": "a", "command": ["x"], "sandbox": "workspace", "network": True}]}
    )
    assert (servers[0].sandbox, servers[0].network) == ("workspace", True)
    with pytest.raises(ConfigError, match=r"mcp.servers\[0\].sandbox"):
        parse_servers({"servers": [{"name": "b", "url": "http://x/mcp", "sandbox": "read-only"}]})
    with pytest.raises(ConfigError, match="sandbox"):
        parse_servers({"servers": [{"name": "c", "command": ["x"], "sandbox": "yes"}]})


@pytest.mark.parametrize(
    "bind", ["relative/dir", "/", "/tmp", "/run", "HOME", "HOME_PARENT", "STATE", "LINK_TO_HOME"]
)
def test_a_bind_that_would_expose_what_the_sandbox_hides_is_refused(workspace, tmp_path, bind):
    kernel = open_kernel(workspace)
    link = tmp_path / "innocent-tools"
    link.symlink_to(Path.home())
    chosen = {
        "HOME": str(Path.home()),
        "HOME_PARENT": str(Path.home().parent),
        "STATE": str(kernel.config.state_dir),
        "LINK_TO_HOME": str(link),
    }.get(bind, bind)
    server = files_server(sandbox="read-only")
    server = replace(server, ro_binds=(*server.ro_binds, chosen))
    try:
        with pytest.raises(ConfigError, match="ro_binds"):
            sandboxed_argv(kernel.config, kernel.guard, server)
    finally:
        kernel.close()


def test_a_user_without_a_home_gets_a_sandboxed_server(workspace, monkeypatch):
    """A container's arbitrary uid: no HOME and no passwd entry."""

    def unknown(uid: int) -> Any:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.delenv("HOME")
    monkeypatch.setattr("pwd.getpwuid", unknown)
    kernel = open_kernel(workspace)
    try:
        argv = sandboxed_argv(kernel.config, kernel.guard, files_server(sandbox="read-only"))
        assert argv[argv.index(FIXTURES) - 1] == "--ro-bind"
        refused = replace(files_server(sandbox="read-only"), ro_binds=("/",))
        with pytest.raises(ConfigError, match="ro_binds"):
            sandboxed_argv(kernel.config, kernel.guard, refused)
    finally:
        kernel.close()


@pytest.mark.parametrize(
    ("fields", "reached"),
    [
        ({}, True),
        ({"sandbox": "read-only"}, False),
        ({"sandbox": "read-only", "network": True}, True),
    ],
)
async def test_the_network_is_the_hosts_only_outside_the_sandbox(workspace, fields, reached):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = str(listener.getsockname()[1])
        [text] = await _texts(workspace, files_server(**fields), [("dial", {"port": port})])
    assert (text == "connected") is reached


async def test_a_sandboxed_server_restarted_after_a_crash_is_sandboxed_again(workspace, layout):
    kernel = open_kernel(workspace)
    try:
        with anyio.fail_after(60):
            async with McpBridge(kernel, [files_server(sandbox="read-only")]) as bridge:
                await bridge.connect_all()
                run = kernel.start_run()
                crashed = await kernel.call(run, "fx.crash", {})
                again = await kernel.call(run, "fx.peek", {"path": layout["outside"]})
    finally:
        kernel.close()
    assert crashed.status is Status.FAILED
    assert again.status is Status.SUCCEEDED
    assert again.structured_output["content"][0]["text"] == "refused: FileNotFoundError"


def _kernel_configured_elsewhere(workspace: Path, tmp_path: Path) -> Any:
    from toolkernel.config import load_config
    from toolkernel.kernel import Kernel

    outside = tmp_path / "etc" / "toolkernel.toml"
    outside.parent.mkdir()
    outside.write_text(OPEN_POLICY)
    return Kernel(load_config(outside, workspace=workspace), workspace_tools=False)


async def test_a_policy_file_a_workspace_sandboxed_server_creates_is_removed(
    workspace, tmp_path, layout
):
    """With no toolkernel.toml to mount read-only, one the server creates goes: during
    a call, between calls (found before the next one) or before the bridge closes."""
    kernel = _kernel_configured_elsewhere(workspace, tmp_path)
    planted = workspace / "toolkernel.toml"
    try:
        with anyio.fail_after(60):
            async with McpBridge(kernel, [files_server(sandbox="workspace")]) as bridge:
                await bridge.connect_all()
                run = kernel.start_run()
                during = await kernel.call(run, "fx.touch", {"path": str(planted)})
                assert not planted.exists()
                ordinary = await kernel.call(run, "fx.touch", {"path": layout["new"]})
                planted.write_text("[policy]\n")  # as a server's background thread could
                between = await kernel.call(run, "fx.echo", {"message": "hi"})
                assert not planted.exists()
                planted.write_text("[policy]\n")
            assert not planted.exists()  # removed when the bridge closed
    finally:
        kernel.close()
    for result in (during, between):
        assert result.status is Status.CANCELLED
        assert str(result.error_code) == "POLICY_VIOLATION"
        assert str(workspace) not in result.safe_message
    assert ordinary.status is Status.SUCCEEDED
    assert Path(layout["new"]).read_text() == "touched"


async def test_policy_files_a_workspace_sandboxed_server_plants_deeper_are_removed(
    workspace, tmp_path
):
    """A runtime started in a subdirectory reads the toolkernel.toml there: one the
    server creates at any depth goes too, and one it changes gets its content back."""
    kernel = _kernel_configured_elsewhere(workspace, tmp_path)
    (workspace / "sub").mkdir()
    nested = workspace / "sub" / "toolkernel.toml"
    kept = workspace / "kept" / "toolkernel.toml"
    kept.parent.mkdir()
    kept.write_text("# the team's own\n")
    try:
        with anyio.fail_after(60):
            async with McpBridge(kernel, [files_server(sandbox="workspace")]) as bridge:
                await bridge.connect_all()
                run = kernel.start_run()
                during = await kernel.call(run, "fx.touch", {"path": str(nested)})
                assert not nested.exists()
                kept.write_text("[policy]\n")  # as a server's background thread could
                between = await kernel.call(run, "fx.echo", {"message": "hi"})
                assert kept.read_text() == "# the team's own\n"
    finally:
        kernel.close()
    for result in (during, between):
        assert result.status is Status.CANCELLED
        assert str(result.error_code) == "POLICY_VIOLATION"
    assert "sub/toolkernel.toml" in during.safe_message
    assert "kept/toolkernel.toml" in between.safe_message

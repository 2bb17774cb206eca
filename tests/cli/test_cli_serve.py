"""`toolkernel serve` (the CLI subcommand, not just the module) speaks MCP over stdio."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from toolkernel.cli import main

pytestmark = pytest.mark.anyio


async def test_the_serve_subcommand_lists_and_governs_calls(tmp_path: Path):
    (tmp_path / "notes.md").write_text("LegacyClient appears here\n")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "toolkernel", "serve", "--workspace", str(tmp_path)],
        cwd=str(tmp_path),
    )
    with anyio.fail_after(60):
        async with Client(params) as client:
            listed = await client.list_tools()
            names = {tool.name for tool in listed.tools}
            assert {"repo.search", "file.read", "memory.read"} <= names
            assert "file.patch" not in names  # writes are denied without a config
            found = await client.call_tool("repo.search", {"query": "LegacyClient"})
            assert not found.is_error
            refused = await client.call_tool("file.read", {"path": "../../etc/passwd"})
            assert refused.is_error
            assert "leaves the workspace" in refused.content[0].text


@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_a_port_out_of_range_is_a_usage_error(capsys, port: str):
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--transport", "http", "--port", port])
    assert exited.value.code == 2
    assert "is not a port" in capsys.readouterr().err


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path):
    # A subprocess: the gateway does not close the socket it failed to bind (yet).
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["serve", "--transport", "http", "--port", str(port), "--workspace", str(tmp_path)]
        completed = subprocess.run(
            [sys.executable, "-m", "toolkernel", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines()[-1] == (
        f"UsageError: cannot listen on 127.0.0.1 port {port}: Address already in use"
    )
    assert "ExceptionGroup" not in completed.stderr


@pytest.mark.parametrize(
    "flags",
    [["--port", "9000"], ["--host", "0.0.0.0"], ["--allow-remote"], ["--allowed-origin", "x"]],
)
def test_http_options_without_the_http_transport_are_a_usage_error(capsys, tmp_path, flags):
    # Served over stdio instead, a user who asked for port 9000 would find nothing there.
    assert main(["serve", *flags, "--workspace", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert flags[0] in err
    assert "--transport http" in err

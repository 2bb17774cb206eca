"""`toolkernel serve` (the CLI subcommand, not just the module) speaks MCP over stdio."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

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

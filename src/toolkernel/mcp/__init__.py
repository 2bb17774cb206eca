"""MCP: downstream servers bridged in as REMOTE_MCP tools, pinned and linted.

``McpBridge`` connects the servers of ``[mcp]`` (``parse_servers``) and registers their
admitted tools; ``PinStore``/``diff_pins`` keep and compare pinned definitions;
``inspect_server`` reports what a server offers and what the bridge would decide.
"""

from __future__ import annotations

from toolkernel.mcp.bridge import (
    ADMISSION_RUN_ID,
    Admission,
    McpBridge,
    RejectReason,
    ServerReport,
    ServerUnavailable,
    admit_tool,
)
from toolkernel.mcp.inspect import InspectedTool, InspectReport, inspect_server, render_inspect
from toolkernel.mcp.pins import Pin, PinCheck, PinStore, PinVerdict, approve_pin, diff_pins
from toolkernel.mcp.servers import MCP_CONFIG_SCHEMA, ServerConfig, ad_hoc_server, parse_servers

__all__ = [
    "ADMISSION_RUN_ID",
    "MCP_CONFIG_SCHEMA",
    "Admission",
    "InspectReport",
    "InspectedTool",
    "McpBridge",
    "Pin",
    "PinCheck",
    "PinStore",
    "PinVerdict",
    "RejectReason",
    "ServerConfig",
    "ServerReport",
    "ServerUnavailable",
    "ad_hoc_server",
    "admit_tool",
    "approve_pin",
    "diff_pins",
    "inspect_server",
    "parse_servers",
    "render_inspect",
]

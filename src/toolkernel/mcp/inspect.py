"""``toolkernel mcp inspect``: what a server offers, and what the bridge would do with it.

Connects once, lists the tools, and for each one reports its lint findings, the
admission decision (with reasons), the risk the kernel would assign (which depends on
the trust level) and its pin hash, compared with the pin file when one is given.
Nothing is registered, pinned or recorded.
"""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, TextIO, cast

import anyio

from toolkernel.definition import TrustLevel
from toolkernel.lint import Finding
from toolkernel.mcp.bridge import (
    Admission,
    ServerConnection,
    ServerUnavailable,
    admit_tool,
    listing_budget,
    unless_taken,
)
from toolkernel.mcp.pins import PinStore
from toolkernel.mcp.servers import AD_HOC_NAME, SandboxMode, ServerConfig, ad_hoc_server
from toolkernel.redaction import Redactor
from toolkernel.terminal import json_text, printable

__all__ = ["InspectReport", "InspectedTool", "inspect_server", "render_inspect"]


@dataclass(frozen=True, slots=True)
class InspectedTool:
    """One tool as the bridge would see it."""

    remote_name: str
    name: str
    decision: Literal["accept", "reject"]
    reasons: tuple[dict[str, str], ...]
    findings: tuple[dict[str, str], ...]
    risk: dict[str, Any]
    pin_hash: str
    pin_status: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": self.remote_name,
            "name": self.name,
            "decision": self.decision,
            "reasons": list(self.reasons),
            "findings": list(self.findings),
            "risk": self.risk,
            "pinHash": self.pin_hash,
            "pinStatus": self.pin_status,
        }


@dataclass(frozen=True, slots=True)
class InspectReport:
    """A server's identity and its tools."""

    server: str
    target: str
    trust: TrustLevel
    server_info: dict[str, Any]
    protocol_version: str
    tools: tuple[InspectedTool, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "target": self.target,
            "trust": str(self.trust),
            "serverInfo": self.server_info,
            "protocolVersion": self.protocol_version,
            "tools": [tool.to_dict() for tool in self.tools],
        }


async def inspect_server(
    target: Sequence[str] | str | ServerConfig,
    *,
    name: str = AD_HOC_NAME,
    trust: TrustLevel = TrustLevel.UNTRUSTED,
    pins: PinStore | None = None,
    sandbox: Callable[[ServerConfig], list[str]] | None = None,
    sandbox_mode: SandboxMode = "none",
    ro_binds: Sequence[str] = (),
) -> InspectReport:
    """Connect to a server (an argv, a URL, or a configured server) and report on it.

    Args:
        name: the namespace of its tools; an argv or URL target left with the default
            name is called "the server" in messages.
        sandbox: builds the argv of a sandboxed server (``sandboxed_argv`` bound to
            the runtime's configuration); needed when the server asks for a sandbox.
        sandbox_mode, ro_binds: the sandbox of an ad-hoc (argv) target.

    Raises:
        ServerUnavailable: the server could not be started or listed.
        ConfigError: the target or name is unusable.
    """
    label = None
    if isinstance(target, ServerConfig):
        config = target
    else:
        label = "the server" if name == AD_HOC_NAME else None
        base = ad_hoc_server(target, name=name)
        config = ServerConfig(
            name=base.name,
            command=base.command,
            url=base.url,
            trust=trust,
            sandbox=sandbox_mode if base.command else "none",
            ro_binds=tuple(ro_binds),
        )
    errlog = _BoundedLog(sys.stderr, STDERR_SHOWN)
    try:
        async with anyio.create_task_group() as group:
            connection = ServerConnection(
                config, group, sandbox=sandbox, label=label, errlog=cast(TextIO, errlog)
            )
            try:
                client = await connection.client()
                listed = await connection.list_tools(client)
                info = client.server_info
                version = client.protocol_version
            finally:
                connection.close()
    except* ServerUnavailable as group_error:
        raise group_error.exceptions[0] from None  # one server: its own error, unwrapped
    finally:
        errlog.finish()
    # The bridge's redactor decides SECRET rejections; its workspace only matters for
    # how paths in the shown text are masked.
    redactor = Redactor(Path.cwd())
    budget = listing_budget()
    seen: set[str] = set()
    inspected = []
    for tool in listed:  # as the bridge admits them: the first of two names wins
        admission = unless_taken(admit_tool(config, tool, redactor=redactor, budget=budget), seen)
        seen.add(admission.name)
        inspected.append(_inspected(admission, pins))
    tools = tuple(inspected)
    return InspectReport(
        server=config.name,
        target=config.describe(),
        trust=config.trust,
        server_info=info.model_dump(mode="json", exclude_none=True) if info else {},
        protocol_version=version,
        tools=tools,
    )


STDERR_SHOWN: Final = 64 * 1024
"""Characters of the inspected server's stderr passed on; a flood is cut there."""


class _BoundedLog(io.TextIOBase):
    """Passes on the first ``limit`` characters written, and counts the rest: an
    untrusted server inspected with ``2>file`` cannot fill the reviewer's disk."""

    def __init__(self, out: TextIO, limit: int) -> None:
        self._out = out
        self._left = limit
        self._dropped = 0
        self._lock = threading.Lock()  # written from the stderr copier's thread

    def write(self, text: str) -> int:
        with self._lock:
            kept = text[: self._left]
            self._left -= len(kept)
            self._dropped += len(text) - len(kept)
        if kept:  # the server's own text: escaped, so that it cannot drive the terminal
            self._out.write("\n".join(printable(line, one_line=False) for line in kept.split("\n")))
        return len(text)

    def flush(self) -> None:
        self._out.flush()

    def finish(self) -> None:
        with self._lock:
            dropped, self._dropped = self._dropped, 0
        if dropped:
            self._out.write(
                f"\n[toolkernel: {dropped} more characters of the server's stderr dropped]\n"
            )
            self._out.flush()


def render_inspect(report: InspectReport, fmt: Literal["text", "json"] = "text") -> str:
    """The report as JSON or as text for a terminal (where everything the server said is
    escaped: a name or a message cannot move the cursor or rewrite a line)."""
    if fmt == "json":
        return json_text(report.to_dict(), indent=2) + "\n"
    info = report.server_info
    name, version = str(info.get("name", "?")), str(info.get("version", ""))
    lines = [
        f"server {report.server}: {name} {version}".rstrip(),
        f"  target: {report.target}",
        f"  protocol {report.protocol_version}, trust {report.trust}, {len(report.tools)} tools",
    ]
    for tool in report.tools:
        risk = ", ".join(k for k in ("mutating", "destructive", "external") if tool.risk.get(k))
        if not tool.risk:  # rejected before its risk was judged: say so, not "read-only"
            risk = "risk not assessed"
        lines.append("")
        lines.append(f"{tool.decision.upper():7} {tool.name}  [{risk or 'read-only'}]")
        pin = f" ({tool.pin_status})" if tool.pin_status else ""
        lines.append(f"        pin {tool.pin_hash}{pin}")
        for reason in tool.reasons:
            lines.append(f"        rejected: {reason['rule']} {reason['message']}")
        for finding in tool.findings:
            where = f" at {finding['pointer']}" if finding["pointer"] else ""
            lines.append(
                f"        {finding['severity']} {finding['rule']}{where}: {finding['message']}"
            )
    return "\n".join(printable(line, one_line=False) for line in lines) + "\n"


def _inspected(admission: Admission, pins: PinStore | None) -> InspectedTool:
    definition = admission.definition
    risk: dict[str, Any] = {}
    if definition is not None:
        risk = {**definition.safety.to_dict(), "readOnly": definition.read_only}
        risk["idempotent"] = definition.idempotent
        risk["network"] = definition.permissions.network
    status = None
    if pins is not None:
        status = str(pins.peek(admission.server.name, admission.tool).verdict)
    return InspectedTool(
        remote_name=admission.remote_name,
        name=admission.name,
        decision="accept" if admission.accepted else "reject",
        reasons=tuple(reason.to_dict() for reason in admission.reasons),
        findings=tuple(
            {
                "rule": f.rule,
                "severity": str(f.severity),
                "pointer": f.pointer,
                "message": f.message,
            }
            for f in admission.findings
        ),
        risk=risk,
        pin_hash=admission.pin_hash,
        pin_status=status,
    )


def _finding(finding: Finding) -> dict[str, str]:
    return {
        "rule": finding.rule,
        "severity": str(finding.severity),
        "pointer": finding.pointer,
        "message": finding.message,
    }

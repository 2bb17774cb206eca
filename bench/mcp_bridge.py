"""Per-call overhead of a bridged MCP call against calling the same server directly.

Run ``python bench/mcp_bridge.py [--calls N]``; it prints a markdown report and writes
the same text to ``bench/results/mcp_bridge.md``.

For each downstream server (the repo's Python fixture server, and the npm reference
server ``server-everything`` when node and ``node_modules`` are present), in one run
and one event loop:

* **direct**: the official SDK's ``Client(..., mode="legacy").call_tool("echo", ...)``
  over stdio to its own server process;
* **bridged**: ``await kernel.call(run, "<server>.echo", ...)`` through ``McpBridge``
  to another process of the same server: the full governed path (ledger REQUEST +
  STARTED + RESULT in the default SQLite ledger, lookup, validation, authorization,
  dispatch with timeout and token, normalize/redact) plus the bridge's translation.
  The server is untrusted (the default), so each call is an EXTERNAL_MUTATION whose
  REQUEST/STARTED are stored before it runs;
* **bridged, group commit**: the same with ``ledger.commit = "group"`` (no gain to
  expect: both of an untrusted call's commits are durable steps);
* **bridged, trusted**: the server marked ``trust = "trusted"``, so its annotations
  are believed: a tool with ``readOnlyHint`` (server-everything's ``echo``) is
  READ_ONLY and its three events go in one commit after the call (with group commit:
  to the writer thread). Tools without the hint stay mutating, as untrusted ones;
* **kernel + native relay**: a NATIVE async tool that calls the direct client,
  through the same kernel, declared as the bridged tool is classified (mutating and
  external like an untrusted tool; read-only like a trusted ``readOnlyHint`` tool):
  the governed path without the bridge, so the difference to the matching bridged
  row is the bridge's own translation cost (plus the noise between two server
  processes, tens of µs).

Servers: the repo's Python fixture server (``echo``), the npm reference server
``server-everything`` (``echo``) and PyPI ``mcp-server-git`` (``git_status`` of a small
repository: a call that does real work).

Rows are measured in interleaved rounds (order rotating each round) after a warm-up;
each call is timed alone with ``perf_counter_ns``. The ratio is bridged median over
direct median (target <= 1.2x).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from toolkernel.codes import Status
from toolkernel.config import Config, LedgerConfig
from toolkernel.definition import ToolDefinition, TrustLevel
from toolkernel.exposure import ExposureRule
from toolkernel.kernel import Kernel
from toolkernel.mcp import McpBridge, ServerConfig
from toolkernel.policy import Action, ApprovalDefaults, Policy

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "mcp" / "fixtures" / "fixture_server.py"
EVERYTHING = ROOT / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist"
RESULT = ROOT / "bench" / "results" / "mcp_bridge.md"


@dataclass
class Row:
    name: str
    call: Callable[[], Awaitable[None]]
    samples: list[float] = field(default_factory=list)


def servers(repo: Path) -> list[tuple[str, tuple[str, ...], str, dict[str, str]]]:
    echo = {"message": "hi"}
    found = [("fixture (Python)", (sys.executable, str(FIXTURE)), "echo", echo)]
    node = shutil.which("node")
    if node and (EVERYTHING / "index.js").is_file():
        argv = (node, str(EVERYTHING / "index.js"), "stdio")
        found.append(("server-everything (node)", argv, "echo", echo))
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        (repo / "a.txt").write_text("a\n")
        argv = (sys.executable, "-m", "mcp_server_git", "--repository", str(repo))
        found.append(("mcp-server-git (Python)", argv, "git_status", {"repo_path": str(repo)}))
    return found


def kernel_for(root: Path, commit: Literal["each", "group"] = "each") -> Kernel:
    policy = Policy(
        network=Action.ALLOW,
        approval=ApprovalDefaults(external=Action.ALLOW, destructive=Action.ALLOW),
    )
    config = Config(
        workspace=root,
        state_dir=root / ".toolkernel",
        policy=policy,
        exposure=(ExposureRule(tools=("*",)),),
        ledger=LedgerConfig(commit=commit),
    )
    return Kernel(config, workspace_tools=False)


async def measure(calls: int, rounds: int) -> list[tuple[str, list[Row]]]:
    results: list[tuple[str, list[Row]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        for index, (label, argv, tool, args) in enumerate(servers(repo)):
            root = Path(tmp) / f"s{index}"
            (root / "each").mkdir(parents=True)
            (root / "group").mkdir()
            (root / "trusted").mkdir()
            (root / "trusted-group").mkdir()
            async with AsyncExitStack() as stack:
                rows = await rows_for(stack, root, argv, tool, args)
                await run_rows(rows, calls, rounds)
            results.append((label, rows))
    return results


async def rows_for(
    stack: AsyncExitStack, root: Path, argv: tuple[str, ...], tool: str, args: dict[str, str]
) -> list[Row]:
    devnull = stack.enter_context(Path(os.devnull).open("w"))  # noqa: SIM115 - the stack closes it
    params = StdioServerParameters(command=argv[0], args=list(argv[1:]))
    direct = await stack.enter_async_context(Client(params, mode="legacy", cache=None))
    untrusted = ServerConfig(name="peer", command=argv)
    trusted = ServerConfig(name="peer", command=argv, trust=TrustLevel.TRUSTED)
    each = stack.enter_context(kernel_for(root / "each"))
    group = stack.enter_context(kernel_for(root / "group", "group"))
    believed = stack.enter_context(kernel_for(root / "trusted"))
    trusted_group = stack.enter_context(kernel_for(root / "trusted-group", "group"))
    for kernel, server in (
        (each, untrusted),
        (group, untrusted),
        (believed, trusted),
        (trusted_group, trusted),
    ):
        bridge = await stack.enter_async_context(McpBridge(kernel, [server], errlog=devnull))
        await bridge.connect_all()

    async def relay(message: str = "", repo_path: str = "") -> str:
        """Calls the server through the SDK client, as a native tool."""
        result = await direct.call_tool(tool, args)
        return str(result.content[0])

    for kernel, name, safety in (
        (each, "native.relay", {"mutating": True, "external": True}),
        (believed, "native.relay", {}),  # READ_ONLY, as a trusted readOnlyHint tool
    ):
        kernel.register(
            ToolDefinition.from_dict(
                {
                    "name": name,
                    "version": "1",
                    "description": "Relays to the SDK client.",
                    "inputSchema": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {k: {"type": "string"} for k in args},
                    },
                    "executionMode": "NATIVE",
                    "safety": safety,
                }
            ),
            relay,
        )
    runs = {id(k): k.start_run(profile="full") for k in (each, group, believed, trusted_group)}

    async def call_direct() -> None:
        result = await direct.call_tool(tool, args)
        assert not result.is_error

    def through(kernel: Kernel, name: str) -> Callable[[], Awaitable[None]]:
        run = runs[id(kernel)]

        async def call() -> None:
            result = await kernel.call(run, name, args)
            assert result.status is Status.SUCCEEDED, result.safe_message

        return call

    return [
        Row("direct SDK client", call_direct),
        Row("bridged (untrusted, SQLite each-commit)", through(each, f"peer.{tool}")),
        Row("bridged (untrusted, SQLite group commit)", through(group, f"peer.{tool}")),
        Row("kernel + native relay, mutating + external", through(each, "native.relay")),
        Row("bridged (trusted, SQLite each-commit)", through(believed, f"peer.{tool}")),
        Row("bridged (trusted, SQLite group commit)", through(trusted_group, f"peer.{tool}")),
        Row("kernel + native relay, read-only", through(believed, "native.relay")),
    ]


async def run_rows(rows: list[Row], calls: int, rounds: int) -> None:
    for row in rows:  # warm-up
        for _ in range(50):
            await row.call()
    per_round = max(1, calls // rounds)
    for number in range(rounds):
        order = rows[number % len(rows) :] + rows[: number % len(rows)]
        for row in order:
            for _ in range(per_round):
                start = time.perf_counter_ns()
                await row.call()
                row.samples.append((time.perf_counter_ns() - start) / 1000)


def machine() -> str:
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return (
        f"{platform.system()} {platform.machine()}, nproc {len(os.sched_getaffinity(0))}, "
        f"CPU {cpu}; Python {platform.python_version()}; load {os.getloadavg()[0]:.2f}"
    )


def report(results: list[tuple[str, list[Row]]], calls: int) -> str:
    lines = [
        "# Bridged MCP call vs direct SDK call",
        "",
        f"- machine: {machine()}",
        f"- {calls} calls per row, interleaved rounds, stdio transport, SDK mcp 2.3.0",
        "",
        "| server | path | median µs | p90 µs | ratio to direct |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for label, rows in results:
        base = statistics.median(rows[0].samples)
        for row in rows:
            median = statistics.median(row.samples)
            p90 = statistics.quantiles(row.samples, n=10)[-1]
            lines.append(
                f"| {label} | {row.name} | {median:.0f} | {p90:.0f} | {median / base:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=20)
    options = parser.parse_args()
    results = anyio.run(measure, options.calls, options.rounds)
    text = report(results, options.calls)
    print(text, end="")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()

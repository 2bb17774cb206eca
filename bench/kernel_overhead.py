"""Per-call overhead of toolkernel's governed path, next to its peers, in one run.

Run ``python bench/kernel_overhead.py``. It prints a markdown report and writes the same
text to ``bench/results/kernel_overhead.md``; a run takes about a minute.
``--profile {sync,async,json}`` instead profiles 2,000 kernel calls with cProfile and
prints the top costs (nothing is written).

Every row calls the same no-op tool, ``echo(text) -> text`` with ``text = "hi"``:

* baselines: a plain function call and a plain ``await`` of the async twin;
* toolkernel: ``await kernel.call(run, "bench.echo", ...)`` — the full governed path
  (ledger REQUEST + STARTED, lookup, validation, authorization, dispatch with timeout
  and token, normalize/redact, ledger RESULT) with the default durable SQLite ledger (a
  file on disk, WAL, ``synchronous=NORMAL``). Rows for the sync tool (run in a worker
  thread, as the kernel must), the async tool, and each with the arguments as a JSON
  string, as providers send them;
* langchain-core: ``@tool``-decorated function, ``tool.invoke({...})`` (a sync tool runs
  inline, no thread) and ``await tool.ainvoke({...})`` of the async twin;
* openai-agents: ``function_tool(...).on_invoke_tool(ToolContext(...), json_args)``
  with a fresh ``ToolContext`` per call (as the runner builds one); its sync tools run
  in ``asyncio.to_thread``;
* MCP Python SDK v2: ``Client(server).call_tool(...)`` against an ``MCPServer`` in the
  same process. ``mode="legacy"`` is the in-memory client session (memory streams,
  JSON-RPC framing, initialize handshake: the v1 ``ClientSession`` path); the default
  mode dispatches directly, without streams or framing. Its sync tools run in
  ``anyio.to_thread``.

Method: one event loop (``anyio.run``, asyncio backend); each row is warmed up, then
measured in interleaved rounds (the row order rotates each round) so that drift in the
machine touches every row alike. Each call is timed alone with ``perf_counter_ns``,
minus the measured timer overhead; calls/s is one over the mean, calls made one at a
time. Every result is checked, outside the timed window.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.metadata
import json
import os
import platform
import pstats
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.to_thread
from agents import FunctionTool as AgentsTool
from agents import function_tool
from agents.tool_context import ToolContext as AgentsToolContext
from annotated_types import MaxLen
from langchain_core.tools import BaseTool
from langchain_core.tools import tool as lc_tool
from mcp import Client
from mcp.server import MCPServer

from toolkernel.calls import ToolCallResult
from toolkernel.cancel import CancellationToken
from toolkernel.codes import Status
from toolkernel.config import Config, LedgerConfig
from toolkernel.context import ToolContext
from toolkernel.definition import ExecutionMode
from toolkernel.dispatch import Invocation
from toolkernel.functions import tool
from toolkernel.kernel import Kernel
from toolkernel.ledger import Event, Ledger, NewEvent, RunSummary, VerifiedRead, VerifyReport
from toolkernel.run import Run

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "bench" / "results" / "kernel_overhead.md"

TEXT = "hi"
ARGS = {"text": TEXT}
ARGS_JSON = json.dumps(ARGS, separators=(",", ":"))
CALLS = 5_000
ROUNDS = 5
WARMUP = 300
PROFILE_CALLS = 2_000
# The targets: toolkernel's p50 over the peer's p50 must stay under these.
LANGCHAIN_TARGET = 1 / 4
MCP_TARGET = 1 / 5


# ---------------------------------------------------------------- the no-op tool


def echo(text: Annotated[str, MaxLen(100)]) -> str:
    """Echo text.

    Args:
        text: what to echo.
    """
    return text


async def aecho(text: Annotated[str, MaxLen(100)]) -> str:
    """Echo text.

    Args:
        text: what to echo.
    """
    return text


# ---------------------------------------------------------------- measuring


@dataclass
class Case:
    """One way of calling the tool: ``call()`` returns the result or an awaitable."""

    key: str
    label: str
    call: Callable[[], Any]
    check: Callable[[Any], bool]
    is_async: bool
    samples: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Stats:
    p50_us: float
    p99_us: float
    calls_per_s: float
    calls: int


class BenchError(Exception):
    """A call returned something other than the echoed text."""


def timer_overhead_ns() -> float:
    samples = []
    clock = time.perf_counter_ns
    for _ in range(20_000):
        t0 = clock()
        samples.append(clock() - t0)
    return statistics.median(samples)


async def measure(case: Case, calls: int, *, keep: bool = True) -> None:
    """Time ``calls`` single calls of ``case``; each result is checked after its timing."""
    clock, call, check = time.perf_counter_ns, case.call, case.check
    samples = case.samples if keep else []
    for _ in range(calls):
        if case.is_async:
            t0 = clock()
            result = await call()
            t1 = clock()
        else:
            t0 = clock()
            result = call()
            t1 = clock()
        samples.append(t1 - t0)
        if not check(result):
            raise BenchError(f"{case.label}: unexpected result {result!r}")


async def run_rounds(cases: list[Case], *, calls: int, rounds: int) -> None:
    for case in cases:
        await measure(case, WARMUP, keep=False)
    per_round = max(1, calls // rounds)
    for round_ in range(rounds):
        shift = round_ % len(cases)
        for case in cases[shift:] + cases[:shift]:
            gc.collect()
            await measure(case, per_round)


def stats(samples: list[int], overhead: float) -> Stats:
    values = sorted(max(s - overhead, 0.0) for s in samples)
    p99 = values[min(len(values) - 1, -(-len(values) * 99 // 100) - 1)]
    mean = statistics.fmean(values)
    return Stats(
        statistics.median(values) / 1000, p99 / 1000, 1e9 / mean if mean else 0.0, len(values)
    )


# ---------------------------------------------------------------- the contenders


def is_echo(result: Any) -> bool:
    return bool(result == TEXT)


def kernel_ok(result: ToolCallResult) -> bool:
    return result.status is Status.SUCCEEDED and result.structured_output == TEXT


def mcp_ok(result: Any) -> bool:
    return not result.is_error and result.structured_content == {"result": TEXT}


class DiscardingLedger(Ledger):
    """Stores nothing: isolates the kernel's own work from the ledger's storage."""

    def append(self, run_id: str, events: Sequence[NewEvent]) -> list[Event]:
        return []

    def events(self, run_id: str, *, after_seq: int = 0) -> list[Event]:
        return []

    def runs(self) -> list[RunSummary]:
        return []

    def find_indexed(self, tool_name: str, key: str) -> Event | None:
        return None

    def verify(self, run_id: str | None = None) -> VerifyReport:
        return VerifyReport(0, 0)

    def read_verified(self, run_id: str | None = None) -> VerifiedRead:
        return VerifiedRead(VerifyReport(0, 0), [])

    def close(self) -> None:
        pass


def make_kernel(workspace: Path, ledger: Ledger | None = None, commit: str = "each") -> Kernel:
    config = Config.default(workspace)
    config = replace(config, ledger=LedgerConfig(commit=commit))  # type: ignore[arg-type]
    kernel = Kernel(config, ledger=ledger, workspace_tools=False)
    kernel.register(tool("bench.echo", idempotent=True, timeout_ms=5000)(echo))
    kernel.register(tool("bench.aecho", idempotent=True, timeout_ms=5000)(aecho))
    return kernel


def exposed_run(kernel: Kernel) -> Run:
    run = kernel.start_run()
    kernel.expose(run)
    return run


def kernel_cases(kernel: Kernel, prefix: str = "tk", note: str = "") -> list[Case]:
    cases = []
    for key, label, name, arguments in (
        (f"{prefix}-sync", f"toolkernel{note}, sync tool (worker thread)", "bench.echo", ARGS),
        (f"{prefix}-async", f"toolkernel{note}, async tool", "bench.aecho", ARGS),
        (
            f"{prefix}-sync-json",
            f"toolkernel{note}, sync tool, JSON-string arguments",
            "bench.echo",
            ARGS_JSON,
        ),
        (
            f"{prefix}-async-json",
            f"toolkernel{note}, async tool, JSON-string arguments",
            "bench.aecho",
            ARGS_JSON,
        ),
    ):
        run = exposed_run(kernel)  # a run per row, all in one ledger file

        def call(run: Run = run, name: str = name, arguments: Any = arguments) -> Awaitable[Any]:
            return kernel.call(run, name, arguments)

        cases.append(Case(key, label, call, kernel_ok, is_async=True))
    return cases


def agents_case(key: str, label: str, agent_tool: AgentsTool) -> Case:
    def call() -> Awaitable[Any]:
        ctx = AgentsToolContext(
            context=None,
            tool_name=agent_tool.name,
            tool_call_id="call_bench",
            tool_arguments=ARGS_JSON,
        )
        return agent_tool.on_invoke_tool(ctx, ARGS_JSON)

    return Case(key, label, call, is_echo, is_async=True)


def langchain_cases() -> list[Case]:
    lc_echo: BaseTool = lc_tool(echo)
    lc_aecho: BaseTool = lc_tool(aecho)
    return [
        Case(
            "lc-invoke",
            "langchain-core `tool.invoke`, sync tool (inline)",
            lambda: lc_echo.invoke(ARGS),
            is_echo,
            is_async=False,
        ),
        Case(
            "lc-ainvoke",
            "langchain-core `await tool.ainvoke`, async tool",
            lambda: lc_aecho.ainvoke(ARGS),
            is_echo,
            is_async=True,
        ),
    ]


def mcp_server() -> MCPServer:
    server = MCPServer("bench")
    server.add_tool(echo, name="echo")
    server.add_tool(aecho, name="aecho")
    return server


async def mcp_cases(stack: AsyncExitStack, server: MCPServer) -> list[Case]:
    legacy = await stack.enter_async_context(Client(server, mode="legacy"))
    direct = await stack.enter_async_context(Client(server))
    cases = []
    for client, kind in ((legacy, "legacy"), (direct, "direct")):
        for name, flavour in (("echo", "sync tool (worker thread)"), ("aecho", "async tool")):

            def call(client: Client = client, name: str = name) -> Awaitable[Any]:
                return client.call_tool(name, ARGS)

            where = (
                "in-memory session (memory streams + JSON-RPC)"
                if kind == "legacy"
                else "direct dispatch (default mode)"
            )
            cases.append(
                Case(
                    f"mcp-{kind}-{name}",
                    f"MCP `Client(server)` {where}, {flavour}",
                    call,
                    mcp_ok,
                    is_async=True,
                )
            )
    return cases


async def component_cases(kernel: Kernel, bare: Kernel) -> list[Case]:
    """Pieces of the kernel path, to see where its time goes (not peers)."""
    bare_run = exposed_run(bare)
    sample = exposed_run(kernel)
    await kernel.call(sample, "bench.aecho", ARGS)
    recorded = kernel.ledger.events(sample.id)[-3:]
    events = [NewEvent(e.type, e.payload, e.tool_call_id) for e in recorded]
    run_id = "run_ledger_only"

    def appends() -> bool:
        kernel.ledger.append_batch([(run_id, events)])  # as the kernel flushes a call
        return True

    adapter = kernel.adapters[ExecutionMode.NATIVE]
    echo_tool = kernel.registry.find("bench.echo")
    assert echo_tool is not None
    context = ToolContext(
        run_id=sample.id,
        tool_call_id="call_bench",
        workspace=kernel.guard.workspace,
        token=CancellationToken(),
    )
    invocation = Invocation(echo_tool, ARGS, context)

    return [
        Case(
            "tk-bare",
            "toolkernel, async tool, ledger writes discarded (no storage)",
            lambda: bare.call(bare_run, "bench.aecho", ARGS),
            kernel_ok,
            is_async=True,
        ),
        Case(
            "ledger",
            "SqliteLedger: one READ_ONLY call's events (REQUEST, STARTED, RESULT) in one commit",
            appends,
            bool,
            is_async=False,
        ),
        Case(
            "native-hop",
            "`NativeAdapter.invoke` of the sync tool: the kernel's worker-thread hop",
            lambda: adapter.invoke(invocation),
            is_echo,
            is_async=True,
        ),
        Case(
            "thread",
            "`anyio.to_thread.run_sync(echo)`: anyio's worker-thread hop, for comparison",
            lambda: anyio.to_thread.run_sync(echo, TEXT),
            is_echo,
            is_async=True,
        ),
    ]


# ---------------------------------------------------------------- report


def machine(ledger_path: Path, load: str) -> list[str]:
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = ", ".join(
        f"{dist} {importlib.metadata.version(dist)}"
        for dist in (
            "toolkernel",
            "langchain-core",
            "openai-agents",
            "mcp",
            "anyio",
            "pydantic",
            "jsonschema-rs",
        )
    )
    with sqlite3.connect(f"{ledger_path.as_uri()}?mode=ro", uri=True) as conn:
        journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
    return [
        f"- machine: {platform.system()} {platform.machine()}, "
        f"nproc {len(os.sched_getaffinity(0))}, CPU {cpu}",
        f"- Python {platform.python_version()} ({sys.implementation.name}), "
        f"SQLite {sqlite3.sqlite_version}",
        f"- libraries: {versions}",
        f"- load average at start (1/5/15 min): {load}; other processes share the machine, "
        "which mostly shows in p99",
        f"- ledger: SQLite file on {filesystem(ledger_path)} (journal_mode={journal}, "
        f"synchronous=NORMAL: the kernel's default `Config`)",
    ]


def filesystem(path: Path) -> str:
    """The type of the filesystem holding ``path`` (so a tmpfs run is not mistaken)."""
    best, kind = "", "unknown filesystem"
    mounts = Path("/proc/mounts")
    if not mounts.exists():
        return kind
    target = str(path.resolve())
    for line in mounts.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        point = parts[1]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, f"{parts[2]} ({parts[0]})"
    return kind


def fmt(value: float) -> str:
    if value < 1:
        return f"{value:.2f}"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def ratio(numerator: float, denominator: float) -> str:
    if not denominator:
        return "n/a"
    value = numerator / denominator
    return f"{value:.2f}" if value < 100 else f"{value:,.0f}"


def report(
    groups: list[tuple[str, list[Case]]],
    results: dict[str, Stats],
    info: list[str],
    calls: int,
    rounds: int,
    overhead: float,
    elapsed: float,
) -> str:
    tk_sync, tk_async = results["tk-sync"].p50_us, results["tk-async"].p50_us
    lines = [
        "# toolkernel per-call overhead vs. peers",
        "",
        "Generated by `.venv/bin/python bench/kernel_overhead.py` on "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC. Every row calls the same no-op tool "
        f'(`echo(text) -> text`, `text="{TEXT}"`), {calls:,} timed calls per row in '
        f"{rounds} interleaved rounds after {WARMUP} warm-up calls, in one asyncio event loop "
        f"(timer overhead {overhead:.0f} ns subtracted; run took {elapsed:.0f} s).",
        "",
        *info,
        "",
        "| call path | p50 µs | p99 µs | calls/s | tk sync p50 ÷ row p50 "
        "| tk async p50 ÷ row p50 |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for title, cases in groups:
        lines.append(f"| **{title}** | | | | | |")
        for case in cases:
            s = results[case.key]
            lines.append(
                f"| {case.label} | {fmt(s.p50_us)} | {fmt(s.p99_us)} | {s.calls_per_s:,.0f} "
                f"| {ratio(tk_sync, s.p50_us)} | {ratio(tk_async, s.p50_us)} |"
            )
    lines += ["", *targets(results), "", *notes()]
    return "\n".join(lines) + "\n"


def targets(results: dict[str, Stats]) -> list[str]:
    # Both commit modes, each flavour against langchain and against both MCP modes.
    pairs = [
        (f"{mode}-{flavour}", peer, limit)
        for mode in ("tk", "tkg")
        for flavour, mcp_tool in (("sync", "echo"), ("async", "aecho"))
        for peer, limit in (
            ("lc-invoke", LANGCHAIN_TARGET),
            (f"mcp-legacy-{mcp_tool}", MCP_TARGET),
            (f"mcp-direct-{mcp_tool}", MCP_TARGET),
        )
    ]
    names = {
        "tk-sync": "toolkernel sync, commit each",
        "tk-async": "toolkernel async, commit each",
        "tkg-sync": "toolkernel sync, group commit",
        "tkg-async": "toolkernel async, group commit",
        "lc-invoke": "langchain-core `tool.invoke`",
        "mcp-legacy-echo": "MCP in-memory session, sync tool",
        "mcp-legacy-aecho": "MCP in-memory session, async tool",
        "mcp-direct-echo": "MCP direct dispatch, sync tool",
        "mcp-direct-aecho": "MCP direct dispatch, async tool",
    }
    lines = [
        "## Targets (issue 2)",
        "",
        "toolkernel's p50 must be under 1/4 of langchain-core's bare `tool.invoke` and under "
        "1/5 of the MCP SDK's in-memory call. Both ledger commit modes are shown: "
        '`commit = "each"` (the default: one SQLite transaction per READ_ONLY call, stored '
        'before the call returns) and `commit = "group"` (a writer thread stores batches).',
        "",
        "| toolkernel row | peer row | toolkernel p50 µs | peer p50 µs | ratio | target "
        "| p50 needed µs | met |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | :---: |",
    ]
    for ours, peer, limit in pairs:
        mine, theirs = results[ours].p50_us, results[peer].p50_us
        met = "yes" if mine < theirs * limit else "**no**"
        lines.append(
            f"| {names[ours]} | {names[peer]} | {fmt(mine)} | {fmt(theirs)} "
            f"| {ratio(mine, theirs)} | < {limit:.2f} | < {fmt(theirs * limit)} | {met} |"
        )
    return lines


def notes() -> list[str]:
    return [
        "Notes:",
        "",
        "- langchain-core's `invoke` runs a sync tool inline (no thread); the sync rows of "
        "toolkernel, openai-agents and MCP hop to a worker thread, so compare sync with sync "
        "and async with async where it matters (the thread hop alone is a component row).",
        '- The MCP "in-memory session" (`mode="legacy"`: memory streams, JSON-RPC, '
        "initialize handshake) is the v1 `ClientSession` path the issue's reference numbers "
        "came from; v2's default in-process `Client(server)` skips streams and framing. Both "
        "are shown; a target counts as met only against both.",
        "- openai-agents builds a fresh `ToolContext` per call, inside the timed window.",
        "- Component rows are pieces of the kernel path, measured in the same run, not peers.",
        "- Reproduce: `.venv/bin/python bench/kernel_overhead.py` (options: `--calls`, "
        "`--rounds`, `--dir` for the ledger's directory, `--profile sync|async|json`).",
    ]


# ---------------------------------------------------------------- main


@contextmanager
def workspace(parent: str | None) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="toolkernel-bench-", dir=parent) as tmp:
        yield Path(tmp)


async def bench(args: argparse.Namespace) -> str:
    started = time.perf_counter()
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    overhead = timer_overhead_ns()
    with workspace(args.dir) as root:
        kernel = make_kernel(root)
        async with AsyncExitStack() as stack:
            stack.callback(kernel.close)
            (root / "group").mkdir()
            grouped = make_kernel(root / "group", commit="group")
            stack.callback(grouped.close)
            ours = kernel_cases(kernel)
            ours_grouped = kernel_cases(grouped, "tkg", ' with `commit = "group"`')
            baselines = [
                Case(
                    "plain",
                    'plain function call `echo("hi")`',
                    lambda: echo(TEXT),
                    is_echo,
                    is_async=False,
                ),
                Case(
                    "plain-async",
                    'plain `await aecho("hi")`',
                    lambda: aecho(TEXT),
                    is_echo,
                    is_async=True,
                ),
            ]
            peers = [
                *langchain_cases(),
                agents_case(
                    "oa-sync",
                    "openai-agents `on_invoke_tool`, sync tool (worker thread)",
                    function_tool(echo, name_override="echo"),
                ),
                agents_case(
                    "oa-async",
                    "openai-agents `on_invoke_tool`, async tool",
                    function_tool(aecho, name_override="aecho"),
                ),
                *await mcp_cases(stack, mcp_server()),
            ]
            (root / "bare").mkdir()
            bare = make_kernel(root / "bare", DiscardingLedger())
            components = await component_cases(kernel, bare)
            groups = [
                ("baseline", baselines),
                ('toolkernel (full governed path, durable SQLite ledger, `commit = "each"`)', ours),
                ("toolkernel, ledger group commit (writer thread, see README)", ours_grouped),
                ("peers", peers),
                ("components of the kernel path", components),
            ]
            cases = [case for _, group in groups for case in group]
            await run_rounds(cases, calls=args.calls, rounds=args.rounds)
            info = machine(kernel.config.ledger_path, load)
    results = {case.key: stats(case.samples, overhead) for case in cases}
    elapsed = time.perf_counter() - started
    return report(groups, results, info, args.calls, args.rounds, overhead, elapsed)


async def profile(args: argparse.Namespace) -> None:
    index = {"sync": 0, "async": 1, "json": 2}[args.profile]
    with workspace(args.dir) as root, make_kernel(root) as kernel:
        case = kernel_cases(kernel)[index]
        await measure(case, WARMUP, keep=False)
        profiler = cProfile.Profile()
        profiler.enable()
        await measure(case, PROFILE_CALLS, keep=False)
        profiler.disable()
    print(f"# cProfile of {PROFILE_CALLS:,} calls: {case.label}\n")
    for order in ("tottime", "cumulative"):
        pstats.Stats(profiler, stream=sys.stdout).sort_stats(order).print_stats(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=CALLS, help="timed calls per row")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds")
    parser.add_argument("--dir", help="where the temporary workspace and ledger go")
    parser.add_argument(
        "--profile",
        choices=("sync", "async", "json"),
        help="profile 2,000 kernel calls instead of benchmarking",
    )
    args = parser.parse_args()
    if args.profile:
        anyio.run(profile, args)
        return
    text = anyio.run(bench, args)
    print(text, end="")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()

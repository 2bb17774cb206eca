"""``toolkernel``: a thin shell over the public API.

Exit codes: 0 success (a call that SUCCEEDED or was PARTIAL), 1 a call with any other
status, a check that found problems or had nothing to check (no ledger), or a ledger
read that verify does not vouch for, 2 a usage or configuration error (a missing
workspace, an unknown profile or run, a ledger that cannot be reached or read). Errors
print as ``ErrorName: message`` on stderr, never as a traceback. Text tables and error
messages show control characters escaped (``\\x1b``): what a model proposed, or someone
wrote into the ledger, is never sent to the terminal raw.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import logging
import os
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from fnmatch import fnmatchcase
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import anyio

from toolkernel.approval import Approver, TerminalApprover, approve_all
from toolkernel.calls import ToolCallResult, new_id
from toolkernel.codes import CATALOG, ErrorCode, Status, safe_field
from toolkernel.config import CONFIG_SCHEMA, Config, load_config
from toolkernel.context import RunState
from toolkernel.definition import ToolDefinition
from toolkernel.errors import LedgerMissing, ProcessStopped, ToolkernelError, UsageError
from toolkernel.kernel import Kernel, open_ledger
from toolkernel.ledger import (
    Event,
    EventType,
    Ledger,
    LedgerError,
    Problem,
    SqliteLedger,
    VerifyReport,
)
from toolkernel.replay import paired
from toolkernel.run import Run, check_run_id
from toolkernel.state import check_placement
from toolkernel.terminal import json_text, printable

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_RUN_HELP = "only this run (exit 2 if the ledger has no such run)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    _open_missing_streams()
    stdout = sys.stdout
    if handler is not _serve:  # serve's stdout is the MCP channel: the SDK owns it
        sys.stdout = _ReaderMayLeave(stdout)
    try:
        with _stopped_like_ctrl_c():
            return handler(args)
    except ToolkernelError as exc:
        print(f"{type(exc).__name__}: {printable(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except _Stopped as stopped:
        print(f"Stopped by {stopped.name}.", file=sys.stderr)
        return 128 + stopped.signum
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`toolkernel replay … | head`): not an error of ours.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115, PTH123 - silences the flush at exit
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - the CLI's last line: never a traceback
        # A task group (serve's, a bridge's) wraps what one of its tasks raised: a
        # configuration error there is still that error, with its message.
        sole = _sole_error(exc)
        if isinstance(sole, ToolkernelError):
            print(f"{type(sole).__name__}: {printable(str(sole))}", file=sys.stderr)
        else:
            print(f"InternalError: {type(exc).__name__}: {printable(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if isinstance(sys.stdout, _ReaderMayLeave):
            sys.stdout.flush()  # here, where a reader that left is seen, not at exit
            sys.stdout = stdout


def _sole_error(exc: BaseException) -> BaseException:
    """``exc``, or the one exception an exception group (of groups) holds."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _open_missing_streams() -> None:
    """A standard stream the caller closed (``<&-``, ``>&-``, ``2>&-``) is None in
    Python: read as empty, written to nowhere (a closed stdout is a reader that left
    before the start). (``print(file=None)`` would write to stdout: a warning in the
    middle of JSON.)"""
    if sys.stdin is None:
        sys.stdin = open(os.devnull)  # noqa: SIM115, PTH123 - for the process's life
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115, PTH123 - for the process's life
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115, PTH123 - for the process's life


class _ReaderMayLeave:
    """stdout for a command whose reader may stop reading (``verify | head``): once
    it has, the rest is discarded and the command still ends with the exit code it
    decided (a broken ledger is still 1, not 0 because nobody read it all)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._leave()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._leave()

    def _leave(self) -> None:
        self._gone = True
        # So that the interpreter's own flush at exit does not fail either.
        with suppress(OSError, ValueError, io.UnsupportedOperation):
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _Stopped(ProcessStopped):
    """SIGTERM or SIGHUP, taken as Ctrl-C is: the call in flight is cancelled and
    recorded (RUNTIME_STOPPED), what it started is stopped, and the command exits."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.name = signal.Signals(signum).name


@contextmanager
def _stopped_like_ctrl_c() -> Iterator[None]:
    """While a command runs, SIGTERM and SIGHUP (a service manager stopping it, a closed
    terminal) interrupt it as SIGINT does, instead of killing it mid-call with nothing
    recorded. Only the main thread can take signals; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        ProcessStopped.underway = True
        raise _Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        ProcessStopped.underway = False  # the calls it stopped are recorded by now


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolkernel", description="The governed tool-calling runtime of a coding agent."
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {importlib.metadata.version('toolkernel')}",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    call = commands.add_parser("call", help="propose one tool call and print its projection")
    call.add_argument("tool")
    call.add_argument(
        "--args",
        default="{}",
        help="the arguments as JSON (default {}); @FILE reads them from FILE, - from stdin",
    )
    call.add_argument("--version", dest="tool_version", help="a specific tool version")
    _common(call)
    call.add_argument("--state", type=_run_state, help="the run state (default from config)")
    call.add_argument("--profile", help="the permission profile (default from config)")
    call.add_argument("--run", dest="run_id", help="continue this run's ledger chain")
    call.add_argument("--idempotency-key")
    call.add_argument("--approve", action="store_true", help="approve calls that need it")
    call.set_defaults(handler=_call)

    tools = commands.add_parser("tools", help="list the tools exposed in a run state")
    _common(tools)
    tools.add_argument("--state", type=_run_state)
    tools.add_argument("--profile")
    tools.add_argument("--format", choices=("table", "json"), default="table")
    tools.add_argument(
        "--all", action="store_true", help="list every registered tool, and why one is hidden"
    )
    tools.set_defaults(handler=_tools)

    ledger = commands.add_parser(
        "ledger",
        help="read and verify the audit ledger",
        description="Read the ledger the configuration names ([ledger] backend); nothing "
        "is created. A --run the ledger does not hold is a usage error: exit 2. show and "
        "replay verify what they present first: problems are named on stderr, exit 1.",
    )
    ledger_commands = ledger.add_subparsers(dest="ledger_command", required=True)
    show = ledger_commands.add_parser(
        "show",
        help="print events; exit 1, naming the problems, if their chain is broken",
        description="Print events. They are verified first: a broken chain is named on "
        'stderr, its events are marked (a CHECK column; "problems" in JSON), exit 1.',
    )
    _common(show)
    show.add_argument("--run", dest="run_id", help=_RUN_HELP)
    show.add_argument("--format", choices=("table", "json"), default="table")
    show.set_defaults(handler=_ledger_show)
    verify = ledger_commands.add_parser(
        "verify",
        help="check every hash chain; exit 1 if broken, or if there is no ledger",
        description="Check every hash chain, head and index entry. Exit 0 only when every "
        "chain is intact and gap-free; 1 when verify finds problems, or no ledger at all "
        "(nothing was recorded there); 2 when the ledger cannot be read.",
    )
    _common(verify)
    verify.add_argument("--run", dest="run_id", help=_RUN_HELP)
    verify.set_defaults(handler=_ledger_verify)
    replay = ledger_commands.add_parser(
        "replay",
        help="rebuild a run's tool messages; refuses a run that fails verification",
        description="Rebuild a run's tool messages from the ledger alone. The run is "
        "verified first: if it fails, its problems are named on stderr and nothing is "
        "rebuilt (exit 1), unless --allow-broken.",
    )
    _common(replay)
    replay.add_argument("--run", dest="run_id", required=True, help=_RUN_HELP)
    replay.add_argument(
        "--allow-broken",
        action="store_true",
        help="rebuild a run that fails verification anyway (still named on stderr, exit 1)",
    )
    replay.set_defaults(handler=_ledger_replay)

    serve = commands.add_parser(
        "serve", help="serve the governed tools (built-in and bridged) as an MCP server"
    )
    serve.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    serve.add_argument("--host", help="HTTP only (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, help="HTTP only (default 8000); 0 picks a free port")
    serve.add_argument(
        "--allow-remote",
        action="store_true",
        help="HTTP on a non-loopback --host: other machines can call the tools, unauthenticated",
    )
    serve.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="HTTP: a web origin (https://app.example.com) whose pages may call the tools; "
        "repeatable. Other Origin headers are refused",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="HTTP: a Host header to answer besides the listening address; repeatable. "
        "With --allow-remote, other Host headers are then refused",
    )
    _common(serve)
    serve.set_defaults(handler=_serve)

    replay_file = commands.add_parser(
        "replay", help="run a recorded conversation's tool calls under this policy"
    )
    replay_file.add_argument("file", type=Path, metavar="FILE", help="JSONL of provider responses")
    replay_file.add_argument(
        "--provider", choices=("openai", "anthropic"), help="default: detected per line"
    )
    replay_file.add_argument(
        "--dry-run", action="store_true", help="execute nothing; report each call's verdict"
    )
    _common(replay_file)
    replay_file.set_defaults(handler=_replay_file)

    demo = commands.add_parser("demo", help="run the end-to-end example and failure drills")
    demo.add_argument("--keep", action="store_true", help="keep the sample repository")
    demo.set_defaults(handler=_demo)

    lint = commands.add_parser("lint", help="lint tool definitions for hygiene and poisoning")
    lint.add_argument(
        "paths", nargs="+", type=_lint_path, metavar="PATH", help="a file, or - for standard input"
    )
    lint.add_argument("--format", choices=("text", "json", "sarif"), default="text")
    lint.set_defaults(handler=_lint)

    mcp = commands.add_parser("mcp", help="inspect downstream MCP servers and their pins")
    mcp_commands = mcp.add_subparsers(dest="mcp_command", required=True)
    inspect = mcp_commands.add_parser(
        "inspect",
        help="list a server's tools with lint findings, trust and pins",
        description="Connect to a server once and report each tool: its lint findings, "
        "whether the bridge would accept it, the risk the kernel would assign and its pin. "
        "Exit 0 when every tool would be accepted, 1 when any would be rejected, 2 when the "
        "server cannot be reached.",
    )
    _common(inspect)
    inspect.add_argument("--name", default="server", help="the server's namespace")
    inspect.add_argument("--trust", choices=("trusted", "untrusted"), default="untrusted")
    inspect.add_argument("--format", choices=("text", "json"), default="text")
    inspect.add_argument(
        "--sandbox",
        choices=("none", "read-only", "workspace"),
        default="none",
        help="start the server's command inside bubblewrap (see [[mcp.servers]] sandbox)",
    )
    inspect.add_argument(
        "--ro-bind",
        action="append",
        default=[],
        metavar="PATH",
        help="with --sandbox: a host path the server may read (repeatable)",
    )
    inspect.add_argument(
        "target",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND... | URL",
        help="the server's command after --, or its streamable HTTP URL",
    )
    inspect.set_defaults(handler=_mcp_inspect)
    for name, helptext, handler in (
        ("diff", "show how a changed tool definition differs from its pin", _mcp_diff),
        ("approve", "approve a changed or new tool definition (re-exposes it)", _mcp_approve),
    ):
        pin_command = mcp_commands.add_parser(name, help=helptext)
        _common(pin_command)
        pin_command.add_argument("server")
        pin_command.add_argument("tool")
        pin_command.set_defaults(handler=handler)
        if name == "approve":
            pin_command.add_argument(
                "--hash",
                help="approve only if the pending definition is this one (mcp diff shows it)",
            )

    codes = commands.add_parser("codes", help="print the error-code taxonomy")
    codes.add_argument("--format", choices=("table", "markdown", "json"), default="table")
    codes.set_defaults(handler=_codes)

    config = commands.add_parser("config", help="configuration helpers")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    schema = config_commands.add_parser("schema", help="print the toolkernel.toml JSON Schema")
    schema.set_defaults(handler=lambda _a: _print_json(CONFIG_SCHEMA))
    check = config_commands.add_parser("check", help="validate a toolkernel.toml")
    _common(check)
    check.set_defaults(handler=_config_check)
    return parser


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workspace",
        type=Path,
        help="the workspace (default: the config file's 'workspace', else its directory "
        "when --config is given, else the current dir)",
    )
    parser.add_argument("--config", type=Path, help="toolkernel.toml (default: in workspace)")


def _run_state(value: str) -> RunState:
    try:
        return RunState(value.upper())
    except ValueError:
        choices = ", ".join(s.value for s in RunState)
        raise argparse.ArgumentTypeError(f"unknown run state {value!r}; use {choices}") from None


def _port(value: str) -> int:
    port = int(value) if value.strip().isdecimal() else -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port: use 1-65535, or 0 for any")
    return port


def _config(args: argparse.Namespace) -> Config:
    config = load_config(args.config, workspace=args.workspace)
    if not config.workspace.is_dir():
        raise UsageError(f"the workspace {config.workspace} is not an existing directory")
    return config


def _run_fields(args: argparse.Namespace, config: Config) -> dict[str, Any]:
    """The run context given on the command line; the configuration fills in the rest."""
    fields: dict[str, Any] = {}
    run_id = getattr(args, "run_id", None)
    if run_id is not None:  # checked before the ledger is opened: "" is no run either
        check_run_id(run_id)
        fields["run_id"] = run_id
    if args.state:
        fields["run_state"] = args.state
    if args.profile is not None:
        config.policy.check_profile(args.profile)  # before the ledger is opened too
        fields["profile"] = args.profile
    return fields


def _call(args: argparse.Namespace) -> int:
    config = _config(args)
    if args.approve:
        approver = approve_all("cli --approve")
    elif sys.stdin.isatty():
        approver = TerminalApprover()
    else:
        approver = None
    fields = _run_fields(args, config)
    arguments = _arguments(args.args, config.max_argument_bytes)
    opened = _open_kernel(config, approver, args.tool)
    if isinstance(opened, ToolCallResult):
        result = opened
    else:
        with opened as kernel:
            run = kernel.start_run(**fields)

            async def propose() -> ToolCallResult:
                async with bridged(kernel, run):
                    try:
                        kernel.expose(run)
                    except LedgerError as exc:  # as kernel.call reports its own calls
                        return _unrecorded(exc, args.tool)
                    return await kernel.call(
                        run,
                        args.tool,
                        arguments,
                        version=args.tool_version,
                        idempotency_key=args.idempotency_key,
                        requested_by="cli",
                    )

            result = anyio.run(propose)
    _print_json(result.projection())
    return EXIT_OK if result.status in (Status.SUCCEEDED, Status.PARTIAL) else EXIT_FAILED


def _arguments(given: str, limit: int) -> str | bytes:
    """``--args`` as given, or read from a file (``@FILE``) or stdin (``-``): a command
    line holds at most 128 KiB per argument. No JSON starts so. What is read is cut
    one byte past ``limit``, which the kernel refuses as too large without more.

    Raises:
        UsageError: the file cannot be read.
    """
    if given == "-":
        return sys.stdin.buffer.read(limit + 1)
    if not given.startswith("@"):
        return given
    try:
        with Path(given[1:]).open("rb") as handle:
            return handle.read(limit + 1)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(f"--args: cannot read '{printable(given[1:])}' ({why})") from exc


def _open_kernel(config: Config, approver: Approver | None, tool: str) -> Kernel | ToolCallResult:
    """The kernel for ``call``; when another process holds the ledger's lock (a passing
    condition), the call's result: LEDGER_UNAVAILABLE, retryable, why on stderr.

    Raises:
        LedgerError: the ledger cannot be opened otherwise (nothing that is a ledger at
            its path, a directory the process may not write: to fix, not to retry).
    """
    try:
        return Kernel(config, approver=approver)
    except LedgerError as exc:
        if _caused_by(exc, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return _unrecorded(exc, tool)
        if _caused_by(exc, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, PermissionError):
            raise LedgerError(
                f"{exc}; if the workspace is not writable, set state_dir (or [ledger] "
                "path) in toolkernel.toml to a directory you can write"
            ) from exc
        raise


def _caused_by(exc: BaseException, *causes: int | type[OSError]) -> bool:
    """Whether one of ``causes`` (SQLite's primary result codes, OS error types) is
    behind ``exc``."""
    codes = {cause for cause in causes if isinstance(cause, int)}
    kinds = tuple(cause for cause in causes if not isinstance(cause, int))
    while exc.__cause__ is not None:
        exc = exc.__cause__
        if isinstance(exc, kinds) or (
            isinstance(exc, sqlite3.Error) and exc.sqlite_errorcode & 0xFF in codes
        ):
            return True
    return False


def _unrecorded(exc: LedgerError, tool_name: str) -> ToolCallResult:
    print(f"toolkernel: {printable(str(exc))}", file=sys.stderr)
    tool = safe_field(str(tool_name))
    return ToolCallResult.from_code(new_id("call"), ErrorCode.LEDGER_UNAVAILABLE, tool=tool)


def _mcp_inspect(args: argparse.Namespace) -> int:
    from toolkernel.definition import TrustLevel
    from toolkernel.mcp import PinStore, inspect_server, render_inspect

    target: list[str] | str = [part for part in args.target if part != "--"]
    if not target:
        raise UsageError("give the server's command after --, or its URL")
    if len(target) == 1 and target[0].startswith(("http://", "https://")):
        target = target[0]
        if args.sandbox != "none":
            raise UsageError("--sandbox starts a server's command; a URL is not started here")
    if args.ro_bind and args.sandbox == "none":
        raise UsageError("--ro-bind is for a sandboxed server: add --sandbox read-only")
    from toolkernel.mcp.sandboxed import sandboxed_argv
    from toolkernel.pathguard import PathGuard

    config = _config(args)
    pins = PinStore.in_state_dir(config.state_dir)
    guard = PathGuard(config.workspace, forbidden=config.forbidden_paths)
    report = anyio.run(
        lambda: inspect_server(
            target,
            name=args.name,
            trust=TrustLevel(args.trust),
            pins=pins,
            sandbox=partial(sandboxed_argv, config, guard),
            sandbox_mode=args.sandbox,
            ro_binds=[str(Path(p).absolute()) for p in args.ro_bind],
        )
    )
    sys.stdout.write(render_inspect(report, args.format))
    # As lint exits 1 on an error finding: a CI step can gate on a server's tools.
    return EXIT_FAILED if any(tool.decision == "reject" for tool in report.tools) else EXIT_OK


def _mcp_diff(args: argparse.Namespace) -> int:
    from toolkernel.mcp import PinStore, diff_pins

    store = PinStore.in_state_dir(_config(args).state_dir)
    with _rejection_explained(args):
        sys.stdout.write(diff_pins(store, args.server, args.tool))
    return EXIT_OK


def _mcp_approve(args: argparse.Namespace) -> int:
    from toolkernel.mcp import approve_pin

    with _rejection_explained(args):
        pin = approve_pin(_config(args).state_dir, args.server, args.tool, expected=args.hash)
    print(f"approved {args.server}.{args.tool} at {pin.hash}")
    print("a running toolkernel serve exposes it again within a second")
    return EXIT_OK


@contextmanager
def _rejection_explained(args: argparse.Namespace) -> Iterator[None]:
    """When nothing awaits approval because the bridge rejected the tool outright (a
    poisoned description is never offered for approval), say so and why."""
    from toolkernel.mcp import PinStore

    try:
        yield
    except UsageError as missing:
        store = PinStore.in_state_dir(_config(args).state_dir)
        if store.pending(args.server, args.tool) is not None:
            raise  # a definition awaits approval: an older rejection is not the story
        rejection = _latest_rejection(args, args.server, args.tool)
        if rejection is None:
            raise
        reasons = "; ".join(
            printable(f"{r.get('rule')}: {r.get('message')} at {r.get('pointer') or '/'}")
            for r in rejection.payload.get("reasons", [])
        )
        raise UsageError(
            f"{missing}: the bridge rejected its definition at {rejection.at}, so it is "
            f"never shown and cannot be approved ({reasons})"
        ) from None


def _latest_rejection(args: argparse.Namespace, server: str, tool: str) -> Event | None:
    """The latest rejection of ``server``'s ``tool``, in any run: ``mcp inspect`` and
    ``serve`` record one in the admission run, ``tools`` and ``call`` in their own. Runs
    that cannot be read are passed over: this only adds an explanation."""
    found: list[Event] = []
    try:
        with _stored_ledger(args) as ledger:
            if ledger is None:
                return None
            for run in ledger.runs():
                with suppress(LedgerError):
                    found.extend(
                        event
                        for event in ledger.events(run.run_id)
                        if event.type is EventType.REMOTE_TOOL_REJECTED
                        and event.payload.get("server") == server
                        and tool in (event.payload.get("tool"), event.payload.get("name"))
                    )
    except LedgerError:
        return None
    # A stable sort: of two rejections stored at once, the later one in its run wins.
    return sorted(found, key=lambda event: event.at)[-1] if found else None


def _tools(args: argparse.Namespace) -> int:
    config = _config(args)
    fields = _run_fields(args, config)
    with Kernel(config) as kernel:
        run = kernel.start_run(**fields)

        async def listing() -> list[tuple[ToolDefinition, str | None]]:
            async with bridged(kernel, run):
                return kernel.exposure_report(run.context)

        report = anyio.run(listing)
    shown = report if args.all else [(d, why) for d, why in report if why is None]
    if args.format == "json":
        if args.all:
            listed = [
                {"tool": d.to_dict(), "exposed": why is None, "reason": why} for d, why in shown
            ]
            return _print_json(listed)
        return _print_json([d.to_dict() for d, _ in shown])
    header = ["TOOL", "VERSION", "MODE", "GROUP", "TITLE"]
    rows = [
        [d.name, d.version, str(d.execution_mode), str(d.concurrency_group), d.title]
        for d, _ in shown
    ]
    if args.all:
        header.append("EXPOSED")
        for row, (_, why) in zip(rows, shown, strict=True):
            row.append("yes" if why is None else f"no: {why}")
    _table(header, rows)
    hidden = sorted(d.name for d, why in report if why is not None)
    if hidden and not args.all:
        print(
            f"{len(hidden)} more tools are registered and not exposed now: "
            f"{printable(', '.join(hidden))}; `toolkernel tools --all` says why.",
            file=sys.stderr,
        )
    return EXIT_OK


@asynccontextmanager
async def bridged(kernel: Kernel, run: Run) -> AsyncIterator[None]:
    """Connect the configured downstream MCP servers for as long as the block runs."""
    if not kernel.config.mcp_servers:
        yield
        return
    from toolkernel.mcp import McpBridge

    async with McpBridge(kernel, kernel.config.mcp_servers) as bridge:
        await bridge.connect_all(run)
        yield


@contextmanager
def _stored_ledger(args: argparse.Namespace) -> Iterator[Ledger | None]:
    """The ledger the configuration names, opened for reading; ``None`` while nothing at
    all is at its SQLite path (nothing was recorded in the workspace yet). A SQLite file
    is only read, never created, migrated or switched to WAL: a user who may only read it
    can verify it, and a copy stays as it is.

    Raises:
        LedgerError: the ledger cannot be reached or read; a dangling link, a FIFO or an
            empty file at its path is not a ledger.
    """
    config = _config(args)
    check_placement(config)  # a configuration the kernel would refuse is refused here too
    if config.ledger.backend != "sqlite":
        try:
            opened = open_ledger(config, read_only=True)
        except LedgerMissing:
            yield None
            return
        with opened as ledger:
            yield ledger
    elif _nothing_at(config.ledger_path):
        yield None
    else:
        with SqliteLedger(config.ledger_path, read_only=True) as stored:
            yield stored


def _nothing_at(path: Path) -> bool:
    """Whether nothing, not even a dangling link, is at ``path``."""
    try:
        path.lstat()
    except FileNotFoundError:
        return True
    except OSError:
        return False  # opening it says why
    return False


def _absent(args: argparse.Namespace) -> str:
    config = _config(args)
    if config.ledger.backend != "sqlite":
        return f"no ledger in PostgreSQL schema {config.ledger.schema!r}"
    return f"no ledger at {config.ledger_path}"


def _empty(args: argparse.Namespace) -> str:
    """As ``_absent``, for a ledger that exists and holds no run."""
    config = _config(args)
    if config.ledger.backend != "sqlite":
        return f"no run in the ledger in PostgreSQL schema {config.ledger.schema!r}"
    return f"no run in the ledger at {config.ledger_path}"


def _holding(ledger: Ledger | None, run_id: str, args: argparse.Namespace) -> Ledger:
    """``ledger``, if it holds ``run_id``."""
    if ledger is None:
        raise UsageError(f"{_absent(args)}, so no run {run_id!r}")
    if run_id not in {r.run_id for r in ledger.runs()} and not ledger.verify(run_id).runs_checked:
        # Neither events nor a head: a mistyped id. A head without events is a run whose
        # events were deleted, which the caller's verify names.
        raise UsageError(f"the ledger has no run {run_id!r}")
    return ledger


def _ledger_show(args: argparse.Namespace) -> int:
    with _stored_ledger(args) as ledger:
        if args.run_id is not None:
            ledger = _holding(ledger, args.run_id, args)
        if ledger is None:
            # As verify: an empty listing of the wrong path must not pass for a clean one.
            print(printable(f"{_absent(args)}: nothing recorded there yet"), file=sys.stderr)
            if args.format == "json":
                _print_json([])
            return EXIT_FAILED
        read = ledger.read_verified(args.run_id)
    report, events = read.report, read.events
    if report.ok and report.runs_checked == 0:  # made, never written to: as no ledger
        print(printable(f"{_empty(args)}: nothing recorded there yet"), file=sys.stderr)
        if args.format == "json":
            _print_json([])
        return EXIT_FAILED
    _warn_unverified(report)
    for why in read.left_out.values():
        print(f"  not shown: {printable(why)}", file=sys.stderr)
    if args.format == "json":
        found = _by_event(report.problems)
        _print_json([_event_json(e, found.get((e.run_id, e.seq))) for e in events])
    else:
        print_ledger_table(events, problems=report.problems)
    return EXIT_OK if report.ok else EXIT_FAILED


def _warn_unverified(report: VerifyReport) -> None:
    """Name on stderr the problems verify found in what is about to be presented."""
    if report.ok:
        return
    count = len(report.problems)
    print(
        f"warning: the ledger fails verification ({count} problem{'s' if count > 1 else ''}); "
        "what follows cannot be trusted:",
        file=sys.stderr,
    )
    for problem in report.problems:
        print(f"  {_problem_line(problem)}", file=sys.stderr)


def _problem_line(problem: Problem) -> str:
    where = f"seq {problem.seq}" if problem.seq is not None else "run"
    return printable(f"{problem.run_id} {where}: {problem.kind}: {problem.detail}")


def _by_event(problems: Sequence[Problem]) -> dict[tuple[str, int], list[Problem]]:
    found: dict[tuple[str, int], list[Problem]] = {}
    for problem in problems:
        if problem.seq is not None:
            found.setdefault((problem.run_id, problem.seq), []).append(problem)
    return found


def _event_json(event: Event, problems: Sequence[Problem] | None) -> dict[str, Any]:
    shown = {
        "runId": event.run_id,
        "seq": event.seq,
        "type": str(event.type),
        "at": event.at,
        "toolCallId": event.tool_call_id,
        "payload": event.payload,
        "prevHash": event.prev_hash,
        "hash": event.hash,
    }
    if problems:
        shown["problems"] = [{"kind": p.kind, "detail": p.detail} for p in problems]
    return shown


def print_ledger_table(
    events: Sequence[Any], out: TextIO | None = None, *, problems: Sequence[Problem] = ()
) -> None:
    """The ledger as the seed shows it: seq, event, tool, and a short summary. Events of
    more than one run start with their run, or every run's seq 1 would look alike. With
    ``problems`` (what verify found), a CHECK column names those of each event, and
    every event its run, which the problems name (and a run left out would not)."""
    header: tuple[str, ...] = ("SEQ", "EVENT", "TOOL", "SUMMARY")
    rows: list[tuple[str, ...]] = [(str(e.seq), str(e.type), *_shown(e.payload)) for e in events]
    if problems:
        found = _by_event(problems)
        header = ("SEQ", "CHECK", *header[1:])
        rows = [
            (row[0], ",".join(p.kind for p in found.get((e.run_id, e.seq), [])), *row[1:])
            for e, row in zip(events, rows, strict=True)
        ]
    if problems or len({e.run_id for e in events}) > 1:
        header = ("RUN", *header)
        rows = [(e.run_id, *row) for e, row in zip(events, rows, strict=True)]
    _table(header, rows, out=out)


def _shown(payload: dict[str, Any]) -> tuple[str, str]:
    """``_summary``, or a note for a payload not shaped as its event's (verify says why)."""
    try:
        return _summary(payload)
    except (KeyError, TypeError, AttributeError, ValueError):
        return "", "(payload not as this event writes it: run toolkernel ledger verify)"


def _summary(payload: dict[str, Any]) -> tuple[str, str]:
    tool = str(payload.get("toolName") or payload.get("tool") or "")
    if "result" in payload:
        result = payload["result"]
        code = f"/{result['errorCode']}" if result.get("errorCode") else ""
        return tool, f"{result['status']}{code} {_clip(result.get('safeMessage', ''), 70)}"
    if "arguments" in payload and "argumentsHash" in payload:
        return tool, _clip(json.dumps(payload.get("arguments"), ensure_ascii=False), 80)
    if "tools" in payload:
        names = ", ".join(t["name"] for t in payload["tools"])
        return "", _clip(f"{len(payload['tools'])} tools: {names}", 80)
    if "executionMode" in payload:
        flag = " flagged for review" if payload.get("flaggedForReview") else ""
        return tool, f"{payload['executionMode']}{flag}"
    if "progress" in payload:
        return "", f"progress {payload['progress']}/{payload.get('total')}"
    if "approver" in payload:
        return "", f"by {payload['approver']}"
    if "reasons" in payload:
        reasons = [
            f"{r.get('rule')}: {r.get('message', '')}" if isinstance(r, dict) else str(r)
            for r in payload["reasons"]
        ]
        return str(payload.get("name") or tool), _clip("; ".join(reasons), 80)
    if "oldHash" in payload:
        return str(payload.get("name", "")), "definition changed; held until re-approved"
    return tool, _clip(json.dumps(payload, ensure_ascii=False), 80)


def _ledger_verify(args: argparse.Namespace) -> int:
    with _stored_ledger(args) as ledger:
        if ledger is None:
            if args.run_id is not None:
                raise UsageError(f"{_absent(args)}, so no run {args.run_id!r} to verify")
            # Not "intact": a reviewer pointed at the wrong path must not get a pass.
            print(printable(f"{_absent(args)}: nothing recorded there yet, nothing verified"))
            return EXIT_FAILED
        report = ledger.verify(args.run_id)
    if args.run_id is not None and report.runs_checked == 0:
        raise UsageError(f"the ledger has no run {args.run_id!r}: nothing to verify")
    if report.ok and report.runs_checked == 0:
        # A ledger file made but never written to is the wrong path as much as none.
        print(printable(f"{_empty(args)}: nothing recorded there yet, nothing verified"))
        return EXIT_FAILED
    for problem in report.problems:
        print(_problem_line(problem))
    for run_id, call_id in report.unfinished:
        print(
            printable(
                f"{run_id} {call_id}: unfinished (no RESULT: still running, or its process died)"
            )
        )
    status = "intact" if report.ok else f"BROKEN ({len(report.problems)} problems)"
    unfinished = f", {len(report.unfinished)} unfinished calls" if report.unfinished else ""
    print(f"{report.runs_checked} runs, {report.events_checked} events{unfinished}: {status}")
    return EXIT_OK if report.ok else EXIT_FAILED


def _ledger_replay(args: argparse.Namespace) -> int:
    with _stored_ledger(args) as ledger:
        read = _holding(ledger, args.run_id, args).read_verified(args.run_id)
    report = read.report
    _warn_unverified(report)
    if not report.ok and not args.allow_broken:
        refused = f"replay refused: run {args.run_id} fails verification"
        print(f"{printable(refused)} (--allow-broken rebuilds it anyway)", file=sys.stderr)
        return EXIT_FAILED
    if args.run_id in read.left_out:
        print(f"replay stopped: {printable(read.left_out[args.run_id])}", file=sys.stderr)
        return EXIT_FAILED
    try:
        # What was verified above is what is paired: a broken run only with --allow-broken.
        for exchange in paired(read.events, args.run_id):
            print(json_text(exchange.to_dict()))
    except LedgerError as exc:
        if report.ok:
            raise  # a verified RESULT replay cannot read: an error, not a broken run
        print(f"replay stopped: {printable(str(exc))}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK if report.ok else EXIT_FAILED


def _serve(args: argparse.Namespace) -> int:
    from toolkernel.mcp.gateway import serve

    if args.transport != "http":
        # Served over stdio instead, whoever asked for a port would find nothing there.
        given = [
            flag
            for flag, value in (
                ("--host", args.host is not None),
                ("--port", args.port is not None),
                ("--allow-remote", args.allow_remote),
                ("--allowed-origin", args.allowed_origin),
                ("--allowed-host", args.allowed_host),
            )
            if value
        ]
        if given:
            raise UsageError(f"{', '.join(given)}: HTTP only; add --transport http")
    host = "127.0.0.1" if args.host is None else args.host
    port = 8000 if args.port is None else args.port
    # stdout carries JSON-RPC on the stdio transport: everything else goes to stderr.
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="toolkernel serve: %(message)s"
    )
    # The HTTP client logs each request to a bridged http server at INFO, with the URL
    # and any token in its query: noise at best, a leaked credential at worst. (The mcp
    # SDK's client is httpx2; httpx where another library brings it.)
    for client in ("httpx", "httpx2"):
        logging.getLogger(client).setLevel(logging.WARNING)
    try:
        return serve(
            args.config,
            args.workspace,
            args.transport,
            host,
            port,
            allow_remote=args.allow_remote,
            allowed_hosts=args.allowed_host,
            allowed_origins=args.allowed_origin,
        )
    except* OSError as group:
        if args.transport != "http":
            raise
        error = group.exceptions[0]
        while isinstance(error, ExceptionGroup):
            error = error.exceptions[0]
        reason = error.strerror or str(error)
        raise UsageError(f"cannot listen on {host} port {port}: {reason}") from group


def _replay_file(args: argparse.Namespace) -> int:
    from toolkernel.replay_cli import run_replay

    return run_replay(
        args.file,
        provider=args.provider,
        dry_run=args.dry_run,
        workspace=args.workspace,
        config_path=args.config,
    )


def _demo(args: argparse.Namespace) -> int:
    from toolkernel.demo import run_demo

    return run_demo(keep=args.keep)


def _lint_path(text: str) -> Path:
    from toolkernel.lint.report import path_argument

    return path_argument(text)


def _lint(args: argparse.Namespace) -> int:
    from toolkernel.lint import run_lint

    report, code = run_lint(args.paths, args.format)
    sys.stdout.write(report)  # an unreadable file is a finding (F001), in the report
    return code


def _codes(args: argparse.Namespace) -> int:
    rows = [
        (str(code), str(info.status), "yes" if info.retryable else "no", info.template)
        for code, info in CATALOG.items()
    ]
    if args.format == "json":
        return _print_json(
            [
                {"code": c, "status": s, "retryable": r == "yes", "template": t}
                for c, s, r, t in rows
            ]
        )
    if args.format == "markdown":
        print("| code | status | retryable | safe message template |")
        print("| --- | --- | --- | --- |")
        for row in rows:
            print("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
        return EXIT_OK
    _table(("CODE", "STATUS", "RETRYABLE", "TEMPLATE"), rows)
    return EXIT_OK


def _config_check(args: argparse.Namespace) -> int:
    config = _config(args)
    label = printable(str(config.source or "defaults"))
    for warning in (
        *_unmatched_patterns(config),
        *_commands_not_found(config),
        *_allowed_and_denied(config),
    ):
        print(f"{label}: warning: {printable(warning)}", file=sys.stderr)
    print(f"{label}: valid (workspace {printable(str(config.workspace))})")
    return EXIT_OK


def _unmatched_patterns(config: Config) -> list[str]:
    """The tool-name patterns of ``config`` that match no tool it registers: a typo in a
    deny rule would otherwise do nothing. Bridged tools are not known until their server
    runs, so a pattern in a configured server's namespace is taken on trust."""
    with (
        tempfile.TemporaryDirectory() as scratch,
        Kernel(config, ledger=SqliteLedger(Path(scratch) / "ledger.db")) as kernel,
    ):
        names = [tool.name for tool in kernel.registry.latest()]
    servers = [server.name for server in config.mcp_servers]
    policy = config.policy
    keyed = [
        *((f"policy.rules.{i}.tools", p) for i, r in enumerate(policy.rules) for p in r.tools),
        *(("rate_limits", p) for p in policy.rate_limits),
        *((f"exposure.{i}.tools", p) for i, r in enumerate(config.exposure) for p in r.tools),
        *(("budget.costs", p) for p in policy.budget.costs),
    ]
    return [
        f"key '{key}': {pattern!r} matches no tool"
        for key, pattern in keyed
        if not any(fnmatchcase(name, pattern) for name in names)
        and not any(fnmatchcase(server, pattern.partition(".")[0]) for server in servers)
    ]


def _commands_not_found(config: Config) -> list[str]:
    """A warning per stdio server whose program cannot be found here: the gateway would
    go on without its tools, saying so only when it starts."""
    warnings = []
    for index, server in enumerate(config.mcp_servers):
        if not server.command:
            continue  # a URL
        program = server.command[0]
        if "/" in program:
            place = (server.cwd or config.workspace) / program
            found = place.is_file() and os.access(place, os.X_OK)
        else:
            found = shutil.which(program) is not None
        if not found:
            warnings.append(
                f"key 'mcp.servers.{index}.command': {program!r} is not found (or not "
                f"executable) here; server {server.name!r} would not start"
            )
    return warnings


def _allowed_and_denied(config: Config) -> list[str]:
    policy = config.policy
    return [
        f"key 'policy.path_allow': {pattern!r} is in policy.path_deny too; path_deny wins"
        for pattern in policy.path_allow
        if pattern in policy.path_deny
    ]


def _print_json(value: Any) -> int:
    print(json_text(value))
    return EXIT_OK


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    shown = [[printable(cell) for cell in row] for row in (header, *rows)]
    widths = [min(max(len(row[i]) for row in shown), 60) for i in range(len(header) - 1)]
    for row in shown:
        cells = [_clip(cell, widths[i]).ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        print("  ".join([*cells, row[-1]]).rstrip(), file=out)


def _clip(text: str, limit: int) -> str:
    text = printable(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


if __name__ == "__main__":
    sys.exit(main())

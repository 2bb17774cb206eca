"""``toolkernel serve``: the kernel's projected tools as a governed MCP server.

::

    MCP client ──tools/list──▶ kernel.expose(run)         TOOLS_EXPOSED
               ──tools/call──▶ kernel.call(run, …)         the whole governed pipeline
                               approval? → elicitation      (gateway_approval)
               ◀─────────────  CallToolResult               (gateway_render)
               ──notifications/cancelled──▶ run.cancel_call(id, USER_CANCELLED)
               ◀──notifications/progress── on_progress      (when a progressToken was sent)
               ◀──notifications/tools/list_changed── a tool registered or withdrawn
                                                    (a bridged server changed its tools)

One run per client session: per process over stdio, per streamable HTTP session (one
the SDK created; a run is forgotten when its session ends), and one shared run for
requests without a session (the 2026-07-28 per-request protocol). Refusals and
failures are tool results with ``isError``, never protocol errors; that includes a
call whose ``arguments`` is not an object. A ``tools/list`` the audit ledger cannot
record (TOOLS_EXPOSED) is an error answer: its message says only that, and the
operator's log says why (``_ledger_failures_hidden``). Over HTTP, requests a web page
could have sent are refused by Host and Origin (``_Allowed``). Over stdio nothing but
JSON-RPC goes to stdout, and every request gets an answer, a line that is no valid
request included; at the end of stdin the calls still running are cancelled, and every
request read is answered before the gateway stops (``_StdioTransport``). Logs go to
stderr.
"""

from __future__ import annotations

import importlib.metadata
import ipaddress
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import CancelledError
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    asynccontextmanager,
    contextmanager,
    suppress,
)
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final, Literal

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import mcp_types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server import Server, ServerRequestContext
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult
from mcp.server.lowlevel import NotificationOptions
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toolkernel.approval import Approver
from toolkernel.calls import ToolCallResult, new_id
from toolkernel.cancel import CancellationToken
from toolkernel.codes import CATALOG, ErrorCode
from toolkernel.daemon import in_daemon_thread
from toolkernel.definition import ExecutionMode
from toolkernel.errors import LedgerError, UsageError
from toolkernel.kernel import Kernel
from toolkernel.mcp.gateway_approval import (
    APPROVAL_INPUT,
    AnsweredApprover,
    ElicitingApprover,
    answer_binding,
    approval_form,
    cannot_ask,
)
from toolkernel.mcp.gateway_render import RUN_META, render_result, render_tool
from toolkernel.run import Run
from toolkernel.terminal import printable

if TYPE_CHECKING:  # imported when serving over HTTP
    import uvicorn

__all__ = [
    "Gateway",
    "KernelExtension",
    "Transport",
    "bridged",
    "build_server",
    "main",
    "serve",
]

Transport = Literal["stdio", "http"]
KernelExtension = Callable[[Kernel], AbstractAsyncContextManager[object]]
"""Something that lives as long as the server and adds to its kernel (the MCP bridge)."""

SERVER_NAME: Final = "toolkernel"
MAX_SESSIONS: Final = 256
"""HTTP sessions open at once; while that many are, a new one is refused (503)."""
SHARED_RUN: Final = "-"
"""The key of the run shared by requests without a session (stdio, 2026-07-28)."""
PROGRESS_BUFFER: Final = 64
"""Progress updates waiting to be sent; more are dropped (progress is best-effort)."""

ANNOUNCE_TIMEOUT_S: Final = 5.0
"""How long telling one client that the tools changed may take before it is skipped."""

_BACKLOG: Final = 128
_CLIENT_GONE: Final = (BrokenPipeError, ConnectionResetError)
"""Writing to stdout failed because the client closed its end (a pipe or a socket)."""
_STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # HUP: terminal closed
_MAX_CONNECTIONS: Final = 4 * MAX_SESSIONS
_STOP_GRACE_S: Final = 5

_log = logging.getLogger("toolkernel.serve")
_Context = ServerRequestContext[Any, Any]


class Gateway:
    """The MCP handlers over one kernel: runs per session, governed calls.

    Args:
        kernel: the kernel to serve. Without an approver of its own, calls that need
            approval ask the user of the client they came from.
    """

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        # Set when the server is being shut down (a signal): the calls that cuts short
        # are recorded RUNTIME_STOPPED, not as a client's cancel.
        self.stopping = False
        # Per live session, and SHARED_RUN: as many as the SDK keeps sessions open.
        self._runs: dict[str, Run] = {}
        # Per session that listed tools, the session object of its last tools/list:
        # told when the tools change (it notifies over the connection, not the request).
        self._listeners: dict[str, Any] = {}

    def run_for(self, ctx: _Context) -> Run:
        """The run of the request's session, started on first use.

        A session's run is forgotten when the session ends (its ledger stays);
        requests without a session share one run.
        """
        key, connection = _session_of(ctx)
        run = self._runs.get(key)
        if run is None:
            run = self._runs[key] = self.kernel.start_run()
            if connection is not None:
                connection.exit_stack.callback(self._forget, key)
            _log.info("session %s: run %s", key, run.id)
        return run

    def cancel_calls(self, reason: ErrorCode) -> None:
        """Cancel the calls in flight of every session, and every later one."""
        for run in self._runs.values():
            run.cancel(reason)

    def _forget(self, key: str) -> None:
        """The session ended (the client's DELETE, its idle timeout, shutdown)."""
        run = self._runs.pop(key, None)
        self._listeners.pop(key, None)
        if run is not None:
            _log.info("session %s ended: run %s", key, run.id)

    def input_schema(self, name: str) -> dict[str, Any] | None:
        """A tool's input schema, for the SDK's check of a 2026-07-28 call's
        ``Mcp-Param-*`` headers. Without it the SDK lists the tools for every such call,
        and each listing is a TOOLS_EXPOSED event in the run."""
        tool = self.kernel.registry.find(name)
        return None if tool is None else dict(tool.definition.input_schema)

    async def list_tools(
        self, ctx: _Context, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if params is not None and params.cursor is not None:
            # The list is one page, so no cursor was ever given out (MCP: -32602).
            raise MCPError(types.INVALID_PARAMS, _NO_CURSOR)
        run = self.run_for(ctx)
        self._listeners[_session_of(ctx)[0]] = ctx.session
        definitions = self.kernel.expose(run)
        return types.ListToolsResult(
            tools=[render_tool(d) for d in definitions], _meta={RUN_META: run.id}
        )

    async def call_tool(
        self, ctx: _Context, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        run = self.run_for(ctx)
        arguments = params.arguments or {}
        proposed: dict[str, Any] | str = arguments
        stop = CancellationToken()  # the client cancelled: stop waiting for its user
        # Without an approver of the kernel's, the client's user is asked, if it can be.
        approver: Approver | None = cannot_ask if self.kernel.approver is None else None
        if isinstance(ctx.params, _ArgumentsNotObject):
            # Refused by validation, which comes before approval: nobody is asked.
            proposed = ctx.params.arguments_text
        elif self.kernel.approver is None and _can_elicit(ctx):
            if ctx.session.can_send_request:
                approver = ElicitingApprover(ctx.session, ctx.request_id, stop)
            else:
                answer = _approval_answer(params, arguments)
                if answer is not None:
                    approver = AnsweredApprover(answer)
                else:
                    needed = self._approval_input(run, params.name, arguments)
                    if needed is not None:
                        return needed
        result = await self._governed(ctx, run, params.name, proposed, approver, stop)
        tool = self.kernel.registry.find(params.name, None)
        return render_result(result, tool, run_id=run.id)

    async def _governed(
        self,
        ctx: _Context,
        run: Run,
        name: str,
        arguments: dict[str, Any] | str,
        approver: Approver | None,
        stop: CancellationToken,
    ) -> ToolCallResult:
        """``kernel.call`` shielded from the client's cancel, which cancels the call instead.

        A client's ``notifications/cancelled`` interrupts this handler. The call itself
        must finish through the kernel so that its CANCELLED result is recorded; so it
        runs shielded, and the interrupt becomes ``run.cancel_call(id, USER_CANCELLED)``.
        """
        call_id = new_id("call")
        done = anyio.Event()
        relay = _ProgressRelay(ctx) if _progress_token(ctx) is not None else None

        async def cancel_when_interrupted() -> None:
            try:
                await done.wait()
            finally:
                if not done.is_set():
                    why = ErrorCode.RUNTIME_STOPPED if self.stopping else ErrorCode.USER_CANCELLED
                    stop.cancel(why)
                    run.cancel_call(call_id, why)

        async with anyio.create_task_group() as group:
            group.start_soon(cancel_when_interrupted)
            if relay is not None:
                group.start_soon(relay.forward)
            with anyio.CancelScope(shield=True):
                try:
                    # One the ledger cannot record is LEDGER_UNAVAILABLE (the kernel logs why).
                    result = await self.kernel.call(
                        run,
                        name,
                        arguments,
                        tool_call_id=call_id,
                        on_progress=relay.push if relay else None,
                        approver=approver,
                        requested_by=_requester(ctx),
                    )
                finally:
                    done.set()
                    if relay is not None:
                        relay.close()
        return result

    async def announce_changes(self) -> None:
        """Until cancelled: send ``notifications/tools/list_changed`` to every session
        that listed tools, each time the kernel's tools change (a bridged server added,
        changed or withdrew one). Changes that come together make one notification."""
        loop = anyio.lowlevel.current_token()
        loop_thread = threading.get_ident()
        changed = [anyio.Event()]

        def mark() -> None:
            if threading.get_ident() == loop_thread:
                changed[0].set()
            else:  # a tool registered from another thread
                with suppress(RuntimeError):  # the loop is gone: nobody to tell
                    anyio.from_thread.run_sync(changed[0].set, token=loop)

        stop = self.kernel.on_tools_changed(mark)
        try:
            while True:
                await changed[0].wait()
                changed[0] = anyio.Event()
                await anyio.lowlevel.checkpoint()  # let a burst of changes finish first
                for key, session in list(self._listeners.items()):
                    with anyio.move_on_after(ANNOUNCE_TIMEOUT_S):
                        try:
                            await session.send_tool_list_changed()
                        except Exception as exc:  # noqa: BLE001 - a gone client is no error
                            _log.debug("tools/list_changed not delivered to %s: %s", key, exc)
                            self._listeners.pop(key, None)
        finally:
            stop()

    def _approval_input(
        self, run: Run, name: str, arguments: dict[str, Any]
    ) -> types.InputRequiredResult | None:
        """For a 2026-07-28 client: the approval form to fill in, if the call needs one."""
        explained = self.kernel.explain(run, name, arguments)
        if explained.get("outcome") != "NEEDS_APPROVAL":
            return None
        tool = self.kernel.registry.find(name, None)
        form = approval_form(
            name,
            tool.definition.version if tool else None,
            arguments,
            explained.get("approvalReasons", ()),
        )
        return types.InputRequiredResult(
            input_requests={APPROVAL_INPUT: types.ElicitRequest(params=form)},
            request_state=answer_binding(name, arguments),
        )


_NO_CURSOR: Final = "Unknown cursor: the tools are listed on one page; list them without one."


class _ProgressRelay:
    """Carries a call's progress from the kernel (any thread) to the client."""

    def __init__(self, ctx: _Context) -> None:
        self._ctx = ctx
        self._send, self._receive = anyio.create_memory_object_stream[
            tuple[float, float | None, str | None]
        ](PROGRESS_BUFFER)
        self._thread = threading.get_ident()
        self._loop = anyio.lowlevel.current_token()
        self._last: float | None = None  # the progress last passed on

    def push(
        self, _call_id: str, progress: float, total: float | None, message: str | None
    ) -> None:
        item = (progress, total, message)
        if threading.get_ident() == self._thread:
            self._offer(item)
        else:  # a synchronous tool reporting from its worker thread
            anyio.from_thread.run_sync(self._offer, item, token=self._loop)

    def _offer(self, item: tuple[float, float | None, str | None]) -> None:
        # MCP: progress must increase with each notification; a tool (or a bridged
        # server) that reports otherwise has the update dropped here. A full or
        # finished relay drops it too. The ledger has every report all the same.
        if self._last is not None and item[0] <= self._last:
            return
        with suppress(anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._send.send_nowait(item)
            self._last = item[0]

    def close(self) -> None:
        self._send.close()

    async def forward(self) -> None:
        async with self._receive:
            async for progress, total, message in self._receive:
                try:
                    await self._ctx.session.report_progress(progress, total, message)
                except Exception as exc:  # noqa: BLE001 - progress must never fail the call
                    _log.debug("progress not delivered: %s", exc)


class _GatewayServer(Server[Any]):
    """The SDK's low-level server, advertising ``tools.listChanged`` to handshake-era
    clients (stdio and stateful HTTP sessions alike)."""

    def create_initialization_options(
        self, notification_options: NotificationOptions | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        options = notification_options or NotificationOptions(tools_changed=True)
        return super().create_initialization_options(options, *args, **kwargs)


class _ArgumentsNotObject(dict[str, Any]):
    """``tools/call`` params whose ``arguments`` is JSON but no object (an array, a
    string holding JSON text): the SDK would answer with a protocol error, and the
    call would never reach the ledger. They reach the handler with empty arguments
    and the original kept as JSON text, which the kernel refuses and records
    (INVALID_ARGUMENTS/ARGUMENTS_NOT_OBJECT): a string is never read as JSON text.
    """

    def __init__(self, params: Mapping[str, Any], arguments: object) -> None:
        super().__init__(params, arguments={})
        self.arguments_text = json.dumps(arguments)


async def _take_any_arguments(ctx: _Context, call_next: CallNext) -> HandlerResult:
    """Server middleware (it runs before the SDK validates params): see
    ``_ArgumentsNotObject``. The same on every transport."""
    params = ctx.params
    if ctx.method == "tools/call" and params is not None:
        arguments = params.get("arguments")
        if arguments is not None and not isinstance(arguments, Mapping):
            ctx = replace(ctx, params=_ArgumentsNotObject(params, arguments))
    return await call_next(ctx)


_UNRECORDED: Final = (
    "The runtime could not record this request in its audit ledger, so it is not "
    "answered. Repeat it later; if it keeps failing, tell the user."
)


async def _ledger_failures_hidden(ctx: _Context, call_next: CallNext) -> HandlerResult:
    """Server middleware: a request the audit ledger could not record fails with a
    safe message and the code LEDGER_UNAVAILABLE; the operator is told why.

    A LedgerError's own text names the ledger's host path, and the SDK would send it
    as the error message. ``tools/list`` meets it (TOOLS_EXPOSED); a call's failure to
    record is already a tool result (``Gateway._governed``), so this catches what any
    other handler, now or later, lets through.
    """
    try:
        return await call_next(ctx)
    except LedgerError as exc:
        _log.error("%s could not be recorded: %s", printable(ctx.method[:100]), printable(str(exc)))
        code = ErrorCode.LEDGER_UNAVAILABLE
        data = {"errorCode": str(code), "retryable": CATALOG[code].retryable}
        raise MCPError(types.INTERNAL_ERROR, _UNRECORDED, data) from exc


def build_server(kernel: Kernel, gateway: Gateway | None = None) -> Server[Any]:
    """An MCP server (low-level SDK ``Server``) serving ``kernel``'s projected tools.

    Pass the ``gateway`` whose ``announce_changes()`` runs beside the server: then
    ``tools.listChanged`` is advertised. Without one, it is not (nobody would announce).
    """
    server_class = Server if gateway is None else _GatewayServer
    gateway = gateway or Gateway(kernel)
    server = server_class(
        SERVER_NAME,
        version=_version(),
        title="toolkernel gateway",
        instructions=(
            "Tools served by toolkernel: every call is validated, authorized, sandboxed "
            "where it runs code, and recorded in an audit ledger. A refused or failed "
            "call comes back as a result with isError and a message saying what to do next."
        ),
        on_list_tools=gateway.list_tools,
        on_call_tool=gateway.call_tool,
        get_tool_input_schema=gateway.input_schema,
    )
    server.middleware.extend([_ledger_failures_hidden, _take_any_arguments])
    return server


def serve(
    config_path: Path | None,
    workspace: Path | None,
    transport: Transport = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    allow_remote: bool = False,
    allowed_hosts: Sequence[str] = (),
    allowed_origins: Sequence[str] = (),
    extensions: Sequence[KernelExtension] = (),
) -> int:
    """Serve the kernel for ``toolkernel.toml`` over stdio or streamable HTTP (``/mcp``).

    Returns when stdin closes or on SIGINT/SIGTERM; a second signal while it stops
    kills the bridged servers rather than wait for them (``_Stop``). The ``[mcp]``
    servers of the configuration are bridged in (``bridged``); further ``extensions``
    live as long as the server too. HTTP binds a loopback address unless
    ``allow_remote``: the gateway does not authenticate its clients. A request carrying
    an Origin header is answered only when that is the listening address or one of
    ``allowed_origins``; the Host header must name the listening address or one of
    ``allowed_hosts`` (on a remote address without ``allowed_hosts``, any Host is taken).

    Raises:
        ToolkernelError: the configuration is invalid (ConfigError and the like),
            ``host`` is not a loopback address and ``allow_remote`` is false, or an
            allowed host or origin is malformed (UsageError).
    """
    if transport == "http":
        check_host(host, allow_remote=allow_remote)
    listen = _Listen(
        host.strip("[]"),  # "[::1]" names the same address as "::1"
        port,
        hosts=tuple(
            _pattern(h, _HOST, "--allowed-host", "mcp.example.com:8000") for h in allowed_hosts
        ),
        origins=tuple(
            _pattern(o, _ORIGIN, "--allowed-origin", "https://app.example.com")
            for o in allowed_origins
        ),
    )
    kernel = Kernel.from_config(config_path, workspace=workspace)
    try:
        anyio.run(_serve, kernel, transport, listen, [bridged, *extensions])
    finally:
        kernel.close()
    return 0


async def _serve(
    kernel: Kernel,
    transport: Transport,
    listen: _Listen,
    extensions: Sequence[KernelExtension],
) -> None:
    gateway = Gateway(kernel)
    # The signals are watched from outside what they stop: a second one must still find
    # the gateway's handler while the bridged servers are being stopped.
    async with anyio.create_task_group() as watching:
        with anyio.CancelScope() as stoppable:
            stop = _Stop(gateway, stoppable)
            # From the start: connecting the bridged servers may take a while too.
            if threading.current_thread() is threading.main_thread():
                watching.start_soon(_stop_on_signal, stop)
            async with _extended(kernel, extensions), anyio.create_task_group() as group:
                server = build_server(kernel, gateway)
                group.start_soon(gateway.announce_changes)
                if transport == "stdio":
                    await _serve_stdio(server, gateway)
                else:
                    await _serve_http(server, listen, stop)
                group.cancel_scope.cancel()
        watching.cancel_scope.cancel()


class _Stop:
    """What SIGINT and SIGTERM do to ``serve``, from its start until it returns.

    The first stops it: calls in flight end CANCELLED/RUNTIME_STOPPED, and the bridged
    servers are stopped as the MCP specification says (stdin closed, a grace period,
    SIGTERM, SIGKILL), which a server that ignores SIGTERM and outlives its stdin makes
    take seconds. The second hurries that up: every call still in flight is cancelled
    (RUNTIME_STOPPED) and the bridged servers' processes are killed at once
    (``McpBridge.kill_servers``). Its default action would end the gateway in the
    middle of stopping them, with a server and what it started left running. A third
    has the default action: a way out, should anything else hang.
    """

    def __init__(self, gateway: Gateway, scope: anyio.CancelScope) -> None:
        self.gateway = gateway
        self.http: uvicorn.Server | None = None  # while uvicorn serves: it stops itself
        self.hurried = False
        self._scope = scope

    def on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if not self.gateway.stopping:
            _log.info("stopping on %s", name)
            self.gateway.stopping = True
            if self.http is not None:
                # A 2026-07-28 call runs in its HTTP request's own task, which uvicorn
                # waits for: cancelled here, it ends RUNTIME_STOPPED as a session's does.
                self.gateway.cancel_calls(ErrorCode.RUNTIME_STOPPED)
                # Not ``should_exit`` alone: sse-starlette ends its event streams (a
                # call's answer, a session's stream) from its patch of this method.
                self.http.handle_exit(signum, None)
            else:
                self._scope.cancel()
            return
        _log.info("stopping now on %s: the bridged MCP servers are killed", name)
        self.hurried = True
        # Before the kill: a call of a killed server would end FAILED (connection lost).
        self.gateway.cancel_calls(ErrorCode.RUNTIME_STOPPED)
        from toolkernel.mcp.bridge import McpBridge  # imported already if anything is bridged

        bridge = self.gateway.kernel.adapters.get(ExecutionMode.REMOTE_MCP)
        if isinstance(bridge, McpBridge):
            bridge.kill_servers()


async def _stop_on_signal(stop: _Stop) -> None:
    """``stop`` on SIGINT or SIGTERM, until it has hurried: a later one finds the
    default handler."""
    with anyio.open_signal_receiver(*_STOP_SIGNALS) as signals:
        async for signum in signals:
            stop.on_signal(signum)
            if stop.hurried:
                return


async def _serve_stdio(server: Server[Any], gateway: Gateway) -> None:
    """Until stdin closes, or until cancelled (SIGINT/SIGTERM): the kernel is closed after."""
    _log.info("serving %s over stdio", printable(str(gateway.kernel.config.workspace)))
    with _claimed_stdio() as (wire_in, wire_out):
        # The end of stdin is the client going away: its calls still running are cancelled.
        transport = _StdioTransport(
            wire_in,
            wire_out,
            on_end=lambda: gateway.cancel_calls(ErrorCode.USER_CANCELLED),
            max_line=_max_request_bytes(gateway.kernel.config.max_argument_bytes),
        )
        try:
            await transport.serve(server)
        except* _CLIENT_GONE:
            # Writing an answer found stdout closed: the client went away, as when it
            # closes stdin. The session ends; calls still running were cancelled.
            _log.info("the client closed its end of stdout: stopping")


@contextmanager
def _claimed_stdio() -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """The client's stdin and stdout, for the transport alone.

    As the SDK's ``stdio_server`` does: while serving, fd 0 is the null device and fd 1
    is stderr, so a tool or a child that reads stdin gets EOF rather than the client's
    requests, and one that prints cannot garble the answers. The duplicates are never
    closed: a thread may still block on them.
    """
    wire_in, wire_out = os.dup(0), os.dup(1)  # not inherited by children
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, 0)
        try:
            os.dup2(2, 1)
        except OSError:  # no stderr either
            os.dup2(null, 1)
    finally:
        os.close(null)
    try:
        yield os.fdopen(wire_in, "rb", closefd=False), os.fdopen(wire_out, "wb", closefd=False)
    finally:
        if sys.stdout is not None:  # what a tool printed goes where the rest of it went
            with suppress(OSError, ValueError):
                sys.stdout.flush()
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)


class _StdioTransport:
    """MCP's stdio transport: newline-delimited JSON-RPC, one message a line each way.

    The gateway's own, not the SDK's ``stdio_server``, which left clients waiting for
    answers that never came: it dropped the lines it could not read as a message,
    where JSON-RPC prescribes an error answer (``_refusal``), split a line at a bare CR
    (JSON whitespace), and at the end of stdin ended the session at once, cutting off
    the answers of requests already done. Here every request read is answered before
    the server sees the end (``_drain``); the calls still running are cancelled first
    (``on_end``) and answered CANCELLED, as the ledger records them.
    """

    def __init__(
        self,
        wire_in: BinaryIO,
        wire_out: BinaryIO,
        *,
        on_end: Callable[[], None],
        max_line: int,
    ) -> None:
        self._in = wire_in
        self._out = wire_out
        self._on_end = on_end
        self._max_line = max_line
        self._send_answer, self._answers = anyio.create_memory_object_stream[SessionMessage]()
        self._send_request, self._requests = anyio.create_memory_object_stream[
            SessionMessage | Exception
        ]()
        self._send_refusal = self._send_answer.clone()
        # Requests read and not answered, by id: a refused duplicate counts too, as its
        # refusal is an answer with that id.
        self._unanswered: Counter[types.RequestId] = Counter()
        self._answer_written = anyio.Event()

    async def serve(self, server: Server[Any]) -> None:
        """Until stdin closes and the requests read are answered, or the server stops."""
        async with anyio.create_task_group() as writing:
            writing.start_soon(self._write)
            async with anyio.create_task_group() as reading:
                reading.start_soon(self._read)
                options = server.create_initialization_options()
                await server.run(self._requests, self._send_answer, options)
                reading.cancel_scope.cancel()

    async def _read(self) -> None:
        """Until stdin closes: its lines to the server (``_take``), then ``_drain``."""
        send_line, lines = anyio.create_memory_object_stream[bytes | _TooLong]()
        token = anyio.lowlevel.current_token()
        reader = threading.Thread(
            target=_read_stdin,
            args=(self._in, send_line, token, self._max_line),
            name="stdin",
            daemon=True,
        )
        reader.start()
        async with self._send_request, self._send_refusal, lines:
            with suppress(anyio.BrokenResourceError):  # the server stopped reading
                async for line in lines:
                    if isinstance(line, _TooLong):
                        await self._refuse("", self._too_long(line.start))
                        continue
                    await self._take(line.decode("utf-8", errors="replace"))
                await self._drain()

    def _too_long(self, start: bytes) -> types.JSONRPCError:
        """The refusal of a line over the limit, with the request's id when its start
        shows one (a client waits for that answer; with a null id it would wait on)."""
        members = _top_level_members(start.decode("utf-8", errors="replace"))
        why = f"Invalid Request: longer than {self._max_line:,} bytes"
        return _error_answer(_request_id(members), types.INVALID_REQUEST, why)

    async def _take(self, line: str) -> None:
        """Pass a line on to the server as a message, or answer it here."""
        if not line.strip():
            return
        try:
            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValidationError as exc:
            answer = _refusal(line, exc)
            unreadable = _unreadable_response(line) if answer is None else None
            if unreadable is not None:
                # An answer to a request of ours (elicitation/create) that is not one:
                # passed on as an error answer, so what waits for it ends now.
                await self._send_request.send(SessionMessage(unreadable))
                return
            await self._refuse(line, answer)
            return
        if isinstance(message, types.JSONRPCNotification) and "id" in _top_level_members(line):
            # An "id" MCP does not allow (a fraction, true, null) made the SDK read a
            # request as a notification, which nobody answers.
            await self._refuse(line, _error_answer(None, types.INVALID_REQUEST, _BAD_ID))
            return
        if isinstance(message, types.JSONRPCRequest) and message.id in self._unanswered:
            # Two requests open under one id: the answers and a cancel could not tell
            # them apart (a call nobody can stop). The second is refused.
            self._expect_answer(message)
            why = f"Invalid Request: id {message.id!r} is in use by a request not answered yet"
            await self._refuse(line, _error_answer(message.id, types.INVALID_REQUEST, why))
            return
        self._expect_answer(message)
        await self._send_request.send(SessionMessage(message))

    async def _refuse(self, line: str, answer: types.JSONRPCError | None) -> None:
        if answer is None:
            _log.debug("dropped a line that is no JSON-RPC message: %s", printable(line[:200]))
            return
        _log.warning("answered a line that is no JSON-RPC request: %s", answer.error.message)
        await self._send_refusal.send(SessionMessage(answer))

    def _expect_answer(self, message: types.JSONRPCMessage) -> None:
        if isinstance(message, types.JSONRPCRequest):
            self._unanswered[message.id] += 1
        elif (
            isinstance(message, types.JSONRPCNotification)
            and message.method == "notifications/cancelled"  # never answered (MCP)
        ):
            cancelled = (message.params or {}).get("requestId")
            if isinstance(cancelled, str | int):
                self._answered(cancelled)

    def _answered(self, request_id: types.RequestId) -> None:
        if self._unanswered[request_id] > 1:
            self._unanswered[request_id] -= 1
        else:
            self._unanswered.pop(request_id, None)

    async def _drain(self) -> None:
        """stdin has closed: cancel the calls still running, and let every request read
        be answered before the server sees the end, which would cancel what it still
        runs and drop the answers it has not written yet."""
        self._on_end()
        with anyio.move_on_after(_END_GRACE_S):
            while self._unanswered:
                self._answer_written = anyio.Event()
                await self._answer_written.wait()

    async def _write(self) -> None:
        async with self._answers:
            async for item in self._answers:
                # A daemon thread: a client that stops reading leaves it blocked in
                # write(), which must not keep SIGTERM from stopping the server.
                await in_daemon_thread(self._put, _wire_line(item.message), name="stdout")
                if isinstance(item.message, types.JSONRPCResponse | types.JSONRPCError):
                    if item.message.id is not None:
                        self._answered(item.message.id)
                    self._answer_written.set()

    def _put(self, line: bytes) -> None:
        self._out.write(line)
        self._out.flush()


_END_GRACE_S: Final = 5.0
"""At the end of stdin, how long the requests read may take to be answered. The calls
still running are cancelled then: only a tool that ignores its cancellation takes long."""


def _read_stdin(
    wire: BinaryIO,
    lines: MemoryObjectSendStream[bytes | _TooLong],
    token: anyio.lowlevel.EventLoopToken,
    max_line: int,
) -> None:
    """A daemon thread's work: stdin's lines, split at "\\n" alone (a binary file's
    lines), into ``lines``; a line longer than ``max_line`` is read past, not kept,
    and stands as a ``_TooLong`` with its first bytes (a client cannot make the server
    hold gigabytes).

    In an anyio worker thread, a cancellation would wait for it and the interpreter
    join it at exit: while the client kept stdin open, SIGTERM could not stop the
    server. This thread, blocked until the client writes or closes stdin, does not hold
    up the exit.
    """
    # RuntimeError: the loop has finished; the others: it stopped taking lines.
    with suppress(RuntimeError, CancelledError, anyio.BrokenResourceError, OSError):
        try:
            while line := wire.readline(max_line + 1):
                item: bytes | _TooLong = line
                if len(line) > max_line:
                    _skip_line(wire, line)
                    item = _TooLong(line[:_KEPT_OF_TOO_LONG])
                anyio.from_thread.run(lines.send, item, token=token)
        finally:  # stdin closed (or broke): the session ends
            anyio.from_thread.run_sync(lines.close, token=token)


@dataclass(frozen=True)
class _TooLong:
    """A line over the limit, read past: its start, where a request's id usually is."""

    start: bytes


_KEPT_OF_TOO_LONG: Final = 4096
_SKIP_CHUNK: Final = 1024 * 1024


def _skip_line(wire: BinaryIO, read: bytes) -> None:
    """Read past the rest of a line of which ``read`` was the start."""
    while read and not read.endswith(b"\n"):
        read = wire.readline(_SKIP_CHUNK)


def _max_request_bytes(max_argument_bytes: int) -> int:
    """The longest request the gateway reads: a call's arguments at their cap, four
    times over for JSON escapes, and room for the rest of the message."""
    return 4 * max_argument_bytes + 64 * 1024


def _wire_line(message: types.JSONRPCMessage) -> bytes:
    try:
        text = message.model_dump_json(by_alias=True, exclude_unset=True)
    except PydanticSerializationError:
        # A lone surrogate has no UTF-8 form: the id of a request that held one (see
        # _refusal). JSON's escape for it is how the client wrote it.
        data = message.model_dump(mode="json", by_alias=True, exclude_unset=True)
        text = json.dumps(data, separators=(",", ":"))
    return text.encode() + b"\n"


_UNREADABLE: Final = (
    "The request could not be read as JSON-RPC (a lone surrogate escape such as \\ud800, "
    "nesting too deep, or a number too long?)."
)
_BATCH: Final = (
    "Invalid Request: JSON-RPC batches are not supported (MCP dropped them in protocol "
    "2025-06-18); send each request on a line of its own."
)
_BAD_ID: Final = 'Invalid Request: "id" must be a string or an integer.'


def _refusal(line: str, error: ValidationError) -> types.JSONRPCError | None:
    """The error answer JSON-RPC prescribes to a line the SDK's reader refuses, or None
    when there must be none (a notification, or a response to the server).

    The answer carries the request's id when the line shows one MCP allows (a string,
    even one holding a lone surrogate, or an integer), else null. The SDK's reader
    refuses as not JSON what Python's would read (a lone surrogate escape, deep
    nesting, a long integer): ``_top_level_members`` finds the id all the same.
    """
    details = error.errors(include_url=False, include_input=False)
    unparsed = bool(details) and details[0]["type"] == "json_invalid"
    if not unparsed and line.lstrip().startswith("["):
        return _error_answer(None, types.INVALID_REQUEST, _BATCH)
    members = _top_level_members(line)
    if "method" in members and "id" not in members:
        return None  # a notification
    if _is_response(members):
        return None  # not answered to the client (see _unreadable_response)
    if unparsed and not members:
        return _error_answer(None, types.PARSE_ERROR, "Parse error: the line is not JSON.")
    why = _UNREADABLE if unparsed else f"Invalid Request: {_not_a_request(details)}."
    return _error_answer(_request_id(members), types.INVALID_REQUEST, why)


def _unreadable_response(line: str) -> types.JSONRPCError | None:
    """A line the SDK refused that answers a request of the server's (it has an id and
    a result or an error, and no method), as an error answer to that id; else None."""
    members = _top_level_members(line)
    request_id = _request_id(members)
    if not _is_response(members) or request_id is None:
        return None
    return _error_answer(request_id, types.INVALID_REQUEST, _UNREADABLE_ANSWER)


def _is_response(members: Mapping[str, Any]) -> bool:
    """Whether a message's top-level members make it an answer (no method, a result or
    an error)."""
    return "method" not in members and ("result" in members or "error" in members)


def _request_id(members: Mapping[str, Any]) -> types.RequestId | None:
    """The message's id when it is one MCP allows (a string or an integer), else None."""
    request_id = members.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return None
    return request_id


_UNREADABLE_ANSWER: Final = "Invalid Request: the client's answer could not be read"


def _not_a_request(details: Sequence[Any]) -> str:
    """What the SDK found wrong with a JSON value as a request (its first complaint)."""
    for detail in details:
        where = detail["loc"]
        if where[:1] == ("JSONRPCRequest",):
            field = ".".join(map(str, where[1:]))
            return f'"{field}": {detail["msg"]}' if field else str(detail["msg"])
    return "not a JSON-RPC request"


def _error_answer(
    request_id: types.RequestId | None, code: int, message: str
) -> types.JSONRPCError:
    error = types.ErrorData(code=code, message=message)
    return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)


_SPACE: Final = re.compile(r"[ \t\n\r]*")
_NESTING: Final = re.compile(r'["\[\]{}]')
_UNNESTED: Final = object()
"""Where ``_top_level_members`` found an object or array: skipped, not read."""


def _top_level_members(text: str) -> dict[str, Any]:
    """The members of the JSON object ``text``, with nested values left unread.

    Python's JSON reader recurses into nested values and gives up past its recursion
    limit, and refuses integers of more than 4,300 digits: a request's ``id`` and
    ``method`` must be found all the same. Objects and arrays are skipped by counting
    brackets (an ``id`` inside ``params`` is not the request's); scalars are decoded,
    an integer too long to convert becoming ``None``. Reading stops at the first thing
    that is not a member (the end of the object, or what makes the line not JSON):
    the members before it are all there is to go on.
    """
    pos = _after_space(text, 0)
    members: dict[str, Any] = {}
    if not text.startswith("{", pos):
        return members
    pos += 1
    with suppress(ValueError):  # not JSON from here on
        while True:
            pos = _after_space(text, pos)
            if not text.startswith('"', pos):
                break
            key, pos = _SCALARS.raw_decode(text, pos)  # a string: the member's name
            pos = _after_space(text, pos)
            if not text.startswith(":", pos):
                break
            pos = _after_space(text, pos + 1)
            if text.startswith(("{", "["), pos):
                value, pos = _UNNESTED, _skip_nested(text, pos)
            else:
                value, pos = _SCALARS.raw_decode(text, pos)
            members[key] = value
            pos = _after_space(text, pos)
            if not text.startswith(",", pos):
                break
            pos += 1
    return members


def _after_space(text: str, pos: int) -> int:
    found = _SPACE.match(text, pos)
    return found.end() if found else pos


def _skip_nested(text: str, pos: int) -> int:
    """Where the object or array starting at ``pos`` ends, found without recursing."""
    depth = 0
    while (found := _NESTING.search(text, pos)) is not None:
        pos = found.end()
        if found.group() == '"':
            # Skipped, not decoded: brackets in it do not count, and a string JSON would
            # refuse (a bad escape, a raw tab) must not hide the id that follows.
            skipped = _ANY_STRING.match(text, found.start())
            if skipped is None:
                raise ValueError("unterminated string")
            pos = skipped.end()
        elif found.group() in "[{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return pos
    raise ValueError("unterminated object or array")


def _int_or_none(digits: str) -> int | None:
    try:
        return int(digits)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
        return None


_SCALARS: Final = json.JSONDecoder(parse_int=_int_or_none)
_ANY_STRING: Final = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


async def _serve_http(server: Server[Any], listen: _Listen, stop: _Stop) -> None:
    import uvicorn

    class Uvicorn(uvicorn.Server):
        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            # The gateway's own handler (_Stop) tells uvicorn to stop: uvicorn's would
            # re-raise the signal after its graceful shutdown, ending the process
            # before the bridged servers are stopped and the kernel is closed.
            yield

    host = listen.host
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, listen.port))
        sock.listen(_BACKLOG)  # connections wait in the backlog until uvicorn accepts them
    except OSError:
        sock.close()
        raise
    bound = sock.getsockname()[1]
    app = server.streamable_http_app(
        host=host,
        # Host and Origin are checked in front of the SDK, which cannot take any Host
        # while checking Origin (a remote address without --allowed-host).
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_sessions=MAX_SESSIONS,  # and no more runs: a session's run ends with it
        # Room for the largest arguments the kernel takes, escaped, and the envelope:
        # the SDK keeps a session's last message while it idles, so its default (4 MiB)
        # let a client pin 100 MiB a session with bodies the kernel refuses anyway.
        max_request_body_size=_max_request_bytes(stop.gateway.kernel.config.max_argument_bytes),
    )
    guarded = _allowed(host, bound, hosts=listen.hosts, origins=listen.origins).guard(app)
    # Tests and scripts wait for this line to learn the port (``--port 0`` picks one).
    _log.warning("listening on http://%s:%d/mcp", _bracketed(host), bound)
    config = uvicorn.Config(
        guarded,
        log_level="warning",
        lifespan="on",
        # Past this many connections at once, 503: not every descriptor the process has
        # (held idle, they locked every client out and flooded the log).
        limit_concurrency=_MAX_CONNECTIONS,
        # A request still being sent (a body trickling in) does not hold a stop.
        timeout_graceful_shutdown=_STOP_GRACE_S,
    )
    noisy = [logging.getLogger(name) for name in _RACE_LOGGERS]
    for logger in noisy:
        logger.addFilter(_without_ended_session_tracebacks)
    gateway = stop.gateway

    def without_stopped_responses(record: logging.LogRecord) -> bool:
        # Stopping ends the responses still streaming (a call's, a session's stream) on
        # purpose; uvicorn would log each as an error. _Stop has said what happens.
        return not (gateway.stopping and record.msg == _UNFINISHED_RESPONSE)

    uvicorn_log = logging.getLogger(_RACE_LOGGERS[1])
    uvicorn_log.addFilter(without_stopped_responses)
    try:
        with sock:
            stop.http = Uvicorn(config)
            await stop.http.serve(sockets=[sock])
    finally:
        stop.http = None
        uvicorn_log.removeFilter(without_stopped_responses)
        for logger in noisy:
            logger.removeFilter(_without_ended_session_tracebacks)


# A client that cancels a call and closes its session at once races its two requests:
# the cancel notification reaches a session the DELETE just ended, and the SDK and
# uvicorn each log a traceback for it. Nothing is lost (the call is recorded
# cancelled); the operator gets one line instead.
_RACE_LOGGERS: Final = ("mcp.server.streamable_http", "uvicorn.error")
_AFTER_RESPONSE: Final = "after response already completed"
_UNFINISHED_RESPONSE: Final = "ASGI callable returned without completing response."


def _without_ended_session_tracebacks(record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    if error is None or not _ended_session(error):
        return True
    if record.name == _RACE_LOGGERS[0]:  # one line for the pair of tracebacks
        _log.info("a request for a session that had just ended was dropped")
    return False


def _ended_session(error: BaseException | None) -> bool:
    """Whether ``error`` (or what it was raised from) is a write to a session's closed
    stream, or uvicorn's complaint about answering after that."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, anyio.ClosedResourceError | anyio.BrokenResourceError):
            return True
        if isinstance(error, RuntimeError) and _AFTER_RESPONSE in str(error):
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


@asynccontextmanager
async def bridged(kernel: Kernel) -> AsyncIterator[object]:
    """The ``KernelExtension`` that bridges the configured ``[mcp]`` servers in."""
    servers = kernel.config.mcp_servers
    if not servers:
        yield None
        return
    from toolkernel.mcp.bridge import McpBridge

    async with McpBridge(kernel, servers) as bridge:
        reports = await bridge.connect_all()
        # Every session's run starts as the configuration says.
        hidden = {
            d.name: why
            for d, why in kernel.exposure_report(kernel.start_run().context)
            if why is not None
        }
        for report in reports:
            _log.info(
                "bridged %s: %s; %d tools accepted, %d rejected, %d held",
                report.server,
                "connected"
                if report.connected
                else f"unavailable ({printable(report.error or '')})",
                len(report.accepted),
                len(report.rejected),
                len(report.held),
            )
            unseen: dict[str, list[str]] = {}
            for name in report.accepted:
                if name in hidden:
                    unseen.setdefault(hidden[name], []).append(name)
            if unseen:
                # Accepted and never listed: a user would look for the fault in the server.
                _log.warning(
                    "bridged %s: clients are not shown %s",
                    report.server,
                    printable("; ".join(f"{', '.join(n)} ({why})" for why, n in unseen.items())),
                )
        yield bridge


@asynccontextmanager
async def _extended(kernel: Kernel, extensions: Sequence[KernelExtension]) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        for extend in extensions:
            await stack.enter_async_context(extend(kernel))
        yield


def _version() -> str:
    try:
        return importlib.metadata.version("toolkernel")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def _session_of(ctx: _Context) -> tuple[str, Connection | None]:
    """The request's session id and connection, or ``SHARED_RUN`` without a session.

    The id is the one the SDK gave the connection, never the request's
    ``Mcp-Session-Id`` header: the SDK checks that header against its live sessions
    on the handshake-era path only, and a 2026-07-28 request may carry any value.
    """
    # ServerRequestContext does not carry the connection (yet: the SDK's TODO L54).
    connection = getattr(ctx.session, "_connection", None)
    if isinstance(connection, Connection) and connection.session_id:
        return connection.session_id, connection
    return SHARED_RUN, None


def _can_elicit(ctx: _Context) -> bool:
    capabilities = ctx.session.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    # An empty ``elicitation: {}`` (2025-06-18) means form mode.
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def _approval_answer(
    params: types.CallToolRequestParams, arguments: dict[str, Any]
) -> types.ElicitResult | None:
    answer = (params.input_responses or {}).get(APPROVAL_INPUT)
    if not isinstance(answer, types.ElicitResult):
        return None
    if params.request_state != answer_binding(params.name, arguments):
        return None  # an answer about other arguments approves nothing: ask again
    return answer


def _progress_token(ctx: _Context) -> types.ProgressToken | None:
    return ctx.meta.get("progress_token") if ctx.meta else None


def check_host(host: str, *, allow_remote: bool) -> None:
    """Refuse an HTTP address other machines can reach, unless explicitly allowed.

    Anyone who reaches the gateway can call its tools (governed, but unauthenticated),
    so listening beyond this machine is an explicit, logged choice.

    Raises:
        UsageError: ``host`` is not a loopback address and ``allow_remote`` is false.
    """
    if host == "localhost" or _is_loopback(host):
        return
    if not allow_remote:
        raise UsageError(
            f"--host {host} would let other machines call the tools, and the gateway does "
            "not authenticate clients. Serve on 127.0.0.1 (and tunnel, or put an "
            "authenticating proxy in front), or pass --allow-remote to accept the risk."
        )
    _log.warning("serving on %s without authentication (--allow-remote)", host)


@dataclass(frozen=True)
class _Listen:
    """Where the HTTP gateway listens, and the Host and Origin patterns added to it."""

    host: str
    port: int
    hosts: tuple[str, ...] = ()
    origins: tuple[str, ...] = ()


_HOST: Final = re.compile(r"(?:\[[0-9a-f:.]+\]|[a-z0-9_.-]+)(?::(?:[0-9]{1,5}|\*))?")
_ORIGIN: Final = re.compile(r"[a-z][a-z0-9+.-]*://" + _HOST.pattern)
_ANY_PORT: Final = re.compile(r"(.+):[0-9]{1,5}")


def _pattern(value: str, shape: re.Pattern[str], option: str, example: str) -> str:
    """``value`` of ``option``, lowercased, once it has the ``shape`` of a Host or Origin."""
    pattern = value.strip().lower()
    if not shape.fullmatch(pattern):
        raise UsageError(
            f"{option} {value!r} is not of the form {example} (no path; :* for any port)"
        )
    return pattern


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True)
class _Allowed:
    """The Host and Origin headers the HTTP gateway answers (DNS rebinding protection).

    A request without Origin (not from a web page) passes; one with any Origin not
    listed, ``null`` included, is refused (403), as is a Host not listed (421).
    ``hosts`` None takes any Host: the name remote clients use is not known here. A
    pattern ending in ``:*`` takes any port.
    """

    hosts: tuple[str, ...] | None
    origins: tuple[str, ...]

    def refusal(self, headers: Headers) -> Response | None:
        host = headers.get("host", "")
        if self.hosts is not None and not _matches(host, self.hosts):
            _log.warning("refused a request for Host %r", host[:100])
            return Response("Invalid Host header", status_code=421)
        origin = headers.get("origin")
        if origin is not None and not _matches(origin, self.origins):
            _log.warning("refused a request from Origin %r", origin[:100])
            return Response("Invalid Origin header", status_code=403)
        return None

    def guard(self, app: ASGIApp) -> ASGIApp:
        """``app`` answering only the HTTP requests this allows; to a page of an allowed
        origin with the CORS headers a browser needs to let it call and read (a
        preflight is answered here)."""

        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            headers = Headers(scope=scope)
            refused = self.refusal(headers)
            if refused is not None:
                await refused(scope, receive, send)
                return
            origin = headers.get("origin")
            if origin is None:
                await app(scope, receive, send)
            elif scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
                await _preflight(origin, headers)(scope, receive, send)
            else:
                await app(scope, receive, _with_cors(send, origin))

        return guarded


# What a page may send and read: the MCP transport's own headers besides the usual.
_CORS_REQUEST_HEADERS: Final = (
    "accept, authorization, content-type, last-event-id, mcp-protocol-version, mcp-session-id"
)
_CORS_EXPOSED: Final = "mcp-protocol-version, mcp-session-id"


def _preflight(origin: str, headers: Headers) -> Response:
    """The answer to a browser's preflight from an allowed ``origin``."""
    return Response(
        status_code=204,
        headers={
            "access-control-allow-origin": origin,
            "access-control-allow-methods": "GET, POST, DELETE",
            "access-control-allow-headers": _CORS_REQUEST_HEADERS,
            "access-control-max-age": "600",
            "vary": "Origin",
        },
    )


def _with_cors(send: Send, origin: str) -> Send:
    """``send`` adding to the response the headers that let a page of ``origin`` read it."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [
                *message.get("headers", []),
                (b"access-control-allow-origin", origin.encode("latin-1")),
                (b"access-control-expose-headers", _CORS_EXPOSED.encode()),
                (b"vary", b"Origin"),
            ]
        await send(message)

    return sending


def _allowed(
    host: str, port: int, *, hosts: Sequence[str] = (), origins: Sequence[str] = ()
) -> _Allowed:
    """What the gateway listening on ``host``:``port`` answers besides ``hosts`` and
    ``origins``. On a loopback address: the loopback names, with any port or none (a
    page on a rebound name sends that name, never these; port 80, a tunnel or a proxy
    sends another port or none). Elsewhere: the address with its port (none on port
    80), and any Host unless ``hosts`` are given."""
    named = _bracketed(host.lower())
    if host == "localhost" or _is_loopback(host):
        names = [named, "127.0.0.1", "localhost", "[::1]"]
        own = [f"{name}{suffix}" for name in names for suffix in ("", ":*")]
        return _Allowed(
            hosts=(*own, *hosts), origins=(*(f"http://{name}" for name in own), *origins)
        )
    own = [f"{named}:{port}", named] if port == 80 else [f"{named}:{port}"]
    return _Allowed(
        hosts=(*own, *hosts) if hosts else None,
        origins=(*(f"http://{name}" for name in own), *origins),
    )


def _matches(value: str, patterns: Sequence[str]) -> bool:
    value = value.lower()
    if value in patterns:
        return True
    with_port = _ANY_PORT.fullmatch(value)
    return with_port is not None and f"{with_port.group(1)}:*" in patterns


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name other than localhost: it may resolve anywhere
        return False


def _requester(ctx: _Context) -> str:
    params = ctx.session.client_params
    name = params.client_info.name if params is not None else "client"
    return f"mcp:{name}"[:64]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m toolkernel.mcp.gateway``: ``toolkernel serve`` with the same options."""
    from toolkernel.cli import main as cli_main  # the CLI imports this module

    return cli_main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())

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

One run per client session: per process over stdio, per ``Mcp-Session-Id`` over
streamable HTTP. Refusals and failures are tool results with ``isError``, never
protocol errors. Over stdio nothing but JSON-RPC goes to stdout; logs go to stderr.
"""

from __future__ import annotations

import importlib.metadata
import io
import ipaddress
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import CancelledError
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    asynccontextmanager,
    contextmanager,
    suppress,
)
from pathlib import Path
from types import FrameType
from typing import Any, BinaryIO, Final, Literal

import anyio
import anyio.from_thread
import anyio.lowlevel
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.lowlevel import NotificationOptions
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from toolkernel.approval import Approver
from toolkernel.calls import ToolCallResult, new_id
from toolkernel.cancel import CancellationToken
from toolkernel.codes import ErrorCode, Status, safe_message
from toolkernel.errors import LedgerError, UsageError
from toolkernel.kernel import Kernel
from toolkernel.mcp.gateway_approval import (
    APPROVAL_INPUT,
    AnsweredApprover,
    ElicitingApprover,
    answer_binding,
    approval_form,
    how_to_approve,
)
from toolkernel.mcp.gateway_render import RUN_META, render_result, render_tool
from toolkernel.mcp.streams import FilteredReadStream
from toolkernel.run import Run

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
MAX_RUNS: Final = 256
"""HTTP sessions remembered at once; the oldest run is forgotten (its ledger stays)."""
PROGRESS_BUFFER: Final = 64
"""Progress updates waiting to be sent; more are dropped (progress is best-effort)."""

ANNOUNCE_TIMEOUT_S: Final = 5.0
"""How long telling one client that the tools changed may take before it is skipped."""

_BACKLOG: Final = 128
_CLIENT_GONE: Final = (BrokenPipeError, ConnectionResetError)
"""Writing to stdout failed because the client closed its end (a pipe or a socket)."""
_STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)

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
        self._runs: OrderedDict[str, Run] = OrderedDict()
        # Per session that listed tools, the session object of its last tools/list:
        # told when the tools change (it notifies over the connection, not the request).
        self._listeners: OrderedDict[str, Any] = OrderedDict()

    def run_for(self, ctx: _Context) -> Run:
        """The run of the request's session, started on first use."""
        key = _session_key(ctx)
        run = self._runs.get(key)
        if run is None:
            run = self.kernel.start_run()
            self._runs[key] = run
            if len(self._runs) > MAX_RUNS:
                self._runs.popitem(last=False)
            _log.info("session %s: run %s", key, run.id)
        else:
            self._runs.move_to_end(key)
        return run

    async def list_tools(
        self, ctx: _Context, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        run = self.run_for(ctx)
        key = _session_key(ctx)
        self._listeners[key] = ctx.session
        self._listeners.move_to_end(key)
        if len(self._listeners) > MAX_RUNS:
            self._listeners.popitem(last=False)
        definitions = self.kernel.expose(run)
        return types.ListToolsResult(
            tools=[render_tool(d) for d in definitions], _meta={RUN_META: run.id}
        )

    async def call_tool(
        self, ctx: _Context, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        run = self.run_for(ctx)
        arguments = params.arguments or {}
        stop = CancellationToken()  # the client cancelled: stop waiting for its user
        approver: Approver | None = None
        if self.kernel.approver is None and _can_elicit(ctx):
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
        result = await self._governed(ctx, run, params.name, arguments, approver, stop)
        if (
            approver is None
            and result.status is Status.DENIED
            and result.error_code is ErrorCode.APPROVAL_REQUIRED
        ):
            how = how_to_approve(params.name)
            message = safe_message(ErrorCode.APPROVAL_REQUIRED, tool=params.name, how=how)
            result = result.with_(safe_message=message)
        tool = self.kernel.registry.find(params.name, None)
        return render_result(result, tool, run_id=run.id)

    async def _governed(
        self,
        ctx: _Context,
        run: Run,
        name: str,
        arguments: dict[str, Any],
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
                    result = await self.kernel.call(
                        run,
                        name,
                        arguments,
                        tool_call_id=call_id,
                        on_progress=relay.push if relay else None,
                        approver=approver,
                        requested_by=_requester(ctx),
                    )
                except LedgerError as exc:
                    # The audit ledger cannot record (its database is down, the disk is
                    # full): the client gets a tool error it can act on, the operator
                    # one line saying why.
                    _log.error("call %s of %s could not be recorded: %s", call_id, name, exc)
                    result = ToolCallResult.from_code(
                        call_id, ErrorCode.LEDGER_UNAVAILABLE, tool=name
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


class _ProgressRelay:
    """Carries a call's progress from the kernel (any thread) to the client."""

    def __init__(self, ctx: _Context) -> None:
        self._ctx = ctx
        self._send, self._receive = anyio.create_memory_object_stream[
            tuple[float, float | None, str | None]
        ](PROGRESS_BUFFER)
        self._thread = threading.get_ident()
        self._loop = anyio.lowlevel.current_token()

    def push(
        self, _call_id: str, progress: float, total: float | None, message: str | None
    ) -> None:
        item = (progress, total, message)
        if threading.get_ident() == self._thread:
            self._offer(item)
        else:  # a synchronous tool reporting from its worker thread
            anyio.from_thread.run_sync(self._offer, item, token=self._loop)

    def _offer(self, item: tuple[float, float | None, str | None]) -> None:
        # A full or finished relay drops the update; the ledger has it all the same.
        with suppress(anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._send.send_nowait(item)

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


def build_server(kernel: Kernel, gateway: Gateway | None = None) -> Server[Any]:
    """An MCP server (low-level SDK ``Server``) serving ``kernel``'s projected tools.

    Pass the ``gateway`` whose ``announce_changes()`` runs beside the server: then
    ``tools.listChanged`` is advertised. Without one, it is not (nobody would announce).
    """
    server_class = Server if gateway is None else _GatewayServer
    gateway = gateway or Gateway(kernel)
    return server_class(
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
    )


def serve(
    config_path: Path | None,
    workspace: Path | None,
    transport: Transport = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    allow_remote: bool = False,
    extensions: Sequence[KernelExtension] = (),
) -> int:
    """Serve the kernel for ``toolkernel.toml`` over stdio or streamable HTTP (``/mcp``).

    Returns when stdin closes or on SIGINT/SIGTERM. The ``[mcp]`` servers of the
    configuration are bridged in (``bridged``); further ``extensions`` live as long as
    the server too. HTTP binds a loopback address unless ``allow_remote``: the gateway
    does not authenticate its clients.

    Raises:
        ToolkernelError: the configuration is invalid (ConfigError and the like), or
            ``host`` is not a loopback address and ``allow_remote`` is false.
    """
    if transport == "http":
        check_host(host, allow_remote=allow_remote)
    kernel = Kernel.from_config(config_path, workspace=workspace)
    try:
        anyio.run(_serve, kernel, transport, host, port, [bridged, *extensions])
    finally:
        kernel.close()
    return 0


async def _serve(
    kernel: Kernel,
    transport: Transport,
    host: str,
    port: int,
    extensions: Sequence[KernelExtension],
) -> None:
    gateway = Gateway(kernel)
    async with anyio.create_task_group() as stoppable:

        def stop() -> None:
            gateway.stopping = True
            stoppable.cancel_scope.cancel()

        # Over stdio a signal stops the server from the start (connecting the bridged
        # servers may take a while too); over HTTP, uvicorn catches signals itself.
        if transport == "stdio" and threading.current_thread() is threading.main_thread():
            stoppable.start_soon(_stop_on_signal, stop)
        async with _extended(kernel, extensions), anyio.create_task_group() as group:
            server = build_server(kernel, gateway)
            group.start_soon(gateway.announce_changes)
            if transport == "stdio":
                await _serve_stdio(server, kernel)
            else:
                await _serve_http(server, host, port, gateway)
            group.cancel_scope.cancel()
        stoppable.cancel_scope.cancel()


async def _stop_on_signal(stop: Callable[[], None]) -> None:
    """``stop`` on SIGINT or SIGTERM; a second one finds the default handler."""
    with anyio.open_signal_receiver(*_STOP_SIGNALS) as signals:
        async for signum in signals:
            _log.info("stopping on %s", signal.Signals(signum).name)
            stop()


async def _serve_stdio(server: Server[Any], kernel: Kernel) -> None:
    """Until stdin closes, or until cancelled (SIGINT/SIGTERM): the kernel is closed after."""
    _log.info("serving %s over stdio", kernel.config.workspace)
    with _claimed_stdin() as wire:
        try:
            async with stdio_server(stdin=_StdinLines(wire)) as (read_stream, write_stream):
                readable = _AnswerUnreadable(read_stream, write_stream)
                await server.run(readable, write_stream, server.create_initialization_options())
        except* _CLIENT_GONE:
            # Writing an answer found stdout closed: the client went away, as when it
            # closes stdin. The session ends; calls still running were cancelled.
            _log.info("the client closed its end of stdout: stopping")


@contextmanager
def _claimed_stdin() -> Iterator[BinaryIO]:
    """The client's stdin, for the transport alone.

    As the SDK's ``stdio_server`` does with a stdin it opens itself: while serving, fd 0
    is the null device, so a tool or a child that reads stdin gets EOF rather than the
    client's requests. The duplicate is never closed: a reader may still block on it.
    """
    wire = os.dup(0)  # not inherited by children
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    try:
        yield os.fdopen(wire, "rb", closefd=False)
    finally:
        os.dup2(wire, 0)


class _StdinLines(anyio.AsyncFile[str]):
    """stdin's lines for the SDK's ``stdio_server``, read by a daemon thread.

    The SDK reads them in an anyio worker thread, which a cancellation waits for and
    the interpreter joins at exit: while the client kept stdin open, SIGTERM could not
    stop the server. A cancelled ``readline`` here returns at once; the thread, blocked
    until the client writes or closes stdin, does not hold up the exit.
    """

    def __init__(self, wire: BinaryIO) -> None:
        super().__init__(io.TextIOWrapper(wire, encoding="utf-8", errors="replace"))
        self._send, self._receive = anyio.create_memory_object_stream[str]()
        self._reader: threading.Thread | None = None

    async def readline(self) -> str:
        """The next line, or "" once stdin is closed."""
        if self._reader is None:
            loop = anyio.lowlevel.current_token()
            self._reader = threading.Thread(
                target=self._read, args=(loop,), name="stdin", daemon=True
            )
            self._reader.start()
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            return ""

    def _read(self, loop: anyio.lowlevel.EventLoopToken) -> None:
        # RuntimeError: the loop has finished; the others: it stopped taking lines.
        with suppress(RuntimeError, CancelledError, anyio.BrokenResourceError):
            try:
                for line in self.wrapped:
                    anyio.from_thread.run(self._send.send, line, token=loop)
            finally:  # stdin closed (or broke): the session ends
                anyio.from_thread.run_sync(self._send.close, token=loop)


class _AnswerUnreadable(FilteredReadStream):
    """The stdio read stream, answering requests the SDK cannot read.

    A line that is JSON the SDK's strict parser refuses (a lone surrogate escape such
    as ``"\\ud800"``, nesting deeper than it takes, an integer longer than it takes)
    reaches the session as an exception, which drops it: a request would never be
    answered and its client would wait forever. When the line shows a request id, it
    gets an INVALID_REQUEST error answer.
    """

    def __init__(self, inner: Any, writer: Any) -> None:
        super().__init__(inner)
        self._writer = writer

    async def receive(self) -> Any:
        while True:
            item = await self._inner.receive()
            request_id = _unreadable_request_id(item)
            if request_id is None:
                return item
            _log.warning("answered request %r that could not be read: %s", request_id, item)
            error = types.ErrorData(
                code=types.INVALID_REQUEST,
                message="The request could not be read as JSON-RPC (a lone surrogate "
                "escape such as \\ud800, nesting too deep, or a number too long?).",
            )
            answer = types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)
            await self._writer.send(SessionMessage(answer))


def _unreadable_request_id(item: object) -> str | int | None:
    """The id of a request the SDK could not parse, if the raw line shows one."""
    if not isinstance(item, ValidationError) or not item.error_count():
        return None
    error = item.errors(include_url=False)[0]
    if error.get("type") != "json_invalid":
        return None  # read as JSON, refused as JSON-RPC: its input is a part, not the line
    raw = error.get("input")
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    if not isinstance(raw, str):
        return None
    members = _top_level_members(raw)
    if "method" not in members:
        return None
    request_id = members.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return None  # a notification, or no usable id
    return request_id


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


async def _serve_http(server: Server[Any], host: str, port: int, gateway: Gateway) -> None:
    import uvicorn

    class Uvicorn(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            gateway.stopping = True
            super().handle_exit(sig, frame)

        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn re-raises the signal after its graceful shutdown, which would end
            # the process before the kernel (and its ledger) is closed: return instead.
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in _STOP_SIGNALS}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    host = host.strip("[]")  # "[::1]" names the same address as "::1"
    app = server.streamable_http_app(host=host, transport_security=_rebinding_guard(host))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(_BACKLOG)  # connections wait in the backlog until uvicorn accepts them
    except OSError:
        sock.close()
        raise
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    # Tests and scripts wait for this line to learn the port (``--port 0`` picks one).
    _log.warning("listening on http://%s:%d/mcp", shown, bound)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    with sock:
        await Uvicorn(config).serve(sockets=[sock])


@asynccontextmanager
async def bridged(kernel: Kernel) -> AsyncIterator[object]:
    """The ``KernelExtension`` that bridges the configured ``[mcp]`` servers in."""
    servers = kernel.config.mcp_servers
    if not servers:
        yield None
        return
    from toolkernel.mcp.bridge import McpBridge

    async with McpBridge(kernel, servers) as bridge:
        for report in await bridge.connect_all():
            _log.info(
                "bridged %s: %s; %d tools accepted, %d rejected, %d held",
                report.server,
                "connected" if report.connected else f"unavailable ({report.error})",
                len(report.accepted),
                len(report.rejected),
                len(report.held),
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


def _session_key(ctx: _Context) -> str:
    headers = getattr(ctx.request, "headers", None)
    session_id = headers.get("mcp-session-id") if headers is not None else None
    return str(session_id) if session_id else "-"


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


def _rebinding_guard(host: str) -> TransportSecuritySettings | None:
    """Host and Origin checks for a loopback address, whichever one it is.

    The SDK turns them on only for 127.0.0.1, localhost and ::1; 127.0.0.2 or a
    spelled-out ::1 would otherwise take requests a web page rebound to them.
    """
    if not (host == "localhost" or _is_loopback(host)):
        return None  # --allow-remote: the Host a remote client uses is not known here
    named = f"[{host}]" if ":" in host else host
    hosts = [named, "127.0.0.1", "localhost", "[::1]"]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{h}:*" for h in hosts],
        allowed_origins=[f"http://{h}:*" for h in hosts],
    )


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

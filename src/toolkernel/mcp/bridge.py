"""The bridge: downstream MCP servers as REMOTE_MCP tools of a kernel.

Admission, per remote tool, in this order (the first failing step decides):

1. **allowlist** — a server's ``tools`` list names what may be bridged (rule ``ALLOWLIST``);
2. **linter** — any error-severity finding rejects the tool (``P…`` poisoning rules;
   ``D…`` rules are warnings for MCP tools, so only poisoning rejects in practice);
3. **definition** — it must convert to a valid ToolDefinition (rule ``DEFINITION``),
   hold no secret where masking it would change the tool (rule ``SECRET``: in its
   name, a property name, an ``enum`` value, …) and not take a name already used by
   another tool (rule ``NAME_COLLISION``);
4. **pin** — its definition must match its pin (see ``pins.py``). A changed definition
   is held back and recorded as REMOTE_TOOL_CHANGED; a new tool of a ``pin = "strict"``
   server waits for approval (rule ``PIN_APPROVAL``). One approved by another process
   (``toolkernel mcp approve`` while a gateway runs) is exposed within ``PIN_POLL_S``.

A rejected tool is never registered, so the model never sees it; each rejection is a
REMOTE_TOOL_REJECTED event with its reasons. Nothing about one server stops another.

Conversion decisions:

* Names are ``<server>.<remote name>`` with every character outside ``[A-Za-z0-9_-]``
  replaced by ``_``.
* The input schema's top level is closed (``additionalProperties: false``) whatever
  the server said: the model may send only the declared properties. Such tools are
  tagged ``mcp:schema-closed``; pins hash the definition as the server gave it.
* Annotations are believed only from ``trust = "trusted"`` servers, read with the MCP
  defaults (not read-only, destructive, open-world). An untrusted tool is mutating and
  external (so it needs the network permission and is never READ_ONLY); a hint that
  makes it *more* dangerous (``destructiveHint: true``) is still taken.

Results: ``isError`` becomes FAILED/TOOL_ERROR (the tool ran and reported a failure of
its own; repeating the call would not help), with its content as output. Transport and
protocol failures are FAILED/REMOTE_ERROR; a lost connection is retryable and the
server is restarted on the next call; an error answer is not retryable (the message
says which). With an ``outputSchema`` the output is the ``structuredContent``, which
the kernel holds to that schema (OUTPUT_CONTRACT_VIOLATION); otherwise it is
``{"content": [...]}``. Images, audio and binary resources go to the artifact store
and appear as ``{"artifact": id}``.

Connecting: starting a server (spawn and ``initialize``) and listing its tools are each
bounded by ``ServerConfig.start_timeout_s``. ``connect_all`` starts every server at
once, so servers that hang cost the longest of their timeouts, not the sum; it admits
their tools afterwards, in the configured order, so the ledger does not depend on which
server answered first. A failure says what happened (``command 'x' not found``, ``it
did not answer initialize within 10 s``, ...) to the operator; the model is only told
that the server could not be started. The lines a stdio server writes on stdout that
are not JSON-RPC are logged once per start, in place of the SDK's traceback a line;
``MAX_BAD_LINES`` of them in a row disconnect it as broken. What it writes on stderr
goes through a pipe of its own to the bridge's ``errlog``: servers never share our
stderr, which one of them could make non-blocking for all (Node.js does).

Stopping: when a connection closes, the SDK stops its stdio server (stdin closed,
grace, SIGTERM and SIGKILL to its process group); then what an unsandboxed server
started is stopped too, in its group or not (``server_tree``), so that nothing of it
outlives the bridge. ``kill_servers`` kills them all at once, for a shutdown in a hurry.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import fcntl
import io
import json
import logging
import os
import re
import select
import socket
import stat
import sys
import threading
from collections import Counter
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self, TextIO

import anyio
import anyio.abc
import anyio.to_thread
import mcp_types as types
from mcp import Client
from mcp.client import Transport
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from toolkernel.artifacts import ArtifactStore
from toolkernel.calls import ArtifactRef
from toolkernel.cancel import CancellationToken
from toolkernel.canonical import sha256_of
from toolkernel.codes import ErrorCode, safe_field, safe_message
from toolkernel.definition import ExecutionMode, ToolDefinition
from toolkernel.dispatch import Invocation, ToolOutput
from toolkernel.errors import (
    ConfigError,
    DefinitionError,
    SandboxUnavailable,
    ToolFailed,
    ToolkernelError,
    UsageError,
)
from toolkernel.kernel import Kernel
from toolkernel.ledger import EventType, NewEvent
from toolkernel.lint import Finding, Severity, TextBudget, document_budget, lint_definition
from toolkernel.mcp.pins import PinStore, PinVerdict, command, pinned_view
from toolkernel.mcp.sandboxed import SANDBOX_ENV, sandboxed_argv
from toolkernel.mcp.server_tree import ServerTree
from toolkernel.mcp.servers import ServerConfig
from toolkernel.mcp.streams import FilteredReadStream
from toolkernel.redaction import Redactor
from toolkernel.run import Run
from toolkernel.tools.adapter import config_files
from toolkernel.tools.planted import QUARANTINE_DIRNAME, Planted, PolicySnapshot

if TYPE_CHECKING:  # the SDK's stream protocols, for annotations only (a private module)
    from mcp.client._transport import ReadStream, TransportStreams

__all__ = [
    "ADMISSION_RUN_ID",
    "Admission",
    "McpBridge",
    "RejectReason",
    "ServerConnection",
    "ServerReport",
    "ServerUnavailable",
    "admit_tool",
    "list_remote_tools",
    "listing_budget",
    "namespaced",
    "unless_taken",
]

ADMISSION_RUN_ID: Final = "mcp-admission"
"""The ledger run that admission events go to when no run is given."""
MAX_LIST_PAGES: Final = 100
"""Pages of a server's tools/list read at most; one that goes on fails to start."""
MAX_BAD_LINES: Final = 100
"""Lines in a row that a stdio server may write on stdout that are not JSON-RPC; at
this many it is taken for broken and disconnected."""
CLIENT_INFO: Final = types.Implementation(name="toolkernel", version="0.1")
STDERR_FLUSH_S: Final = 2.0
"""How long a stopped stdio server's last stderr output is waited for."""
PIN_POLL_S: Final = 1.0
"""How often a bridge that holds tools back looks whether the pin file changed (a
``stat``): an approval made by another process takes effect within this time."""
RECONNECT_FIRST_S: Final = 1.0
RECONNECT_MAX_S: Final = 60.0
"""A server that could not be started when the bridge connected is tried again after
``RECONNECT_FIRST_S``, then after twice the wait each time, up to ``RECONNECT_MAX_S``,
until it is up: its tools are bridged then, as if it had been up from the start."""

_log = logging.getLogger(__name__)
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")
_SDK_STDIO_LOG: Final = logging.getLogger("mcp.client.stdio")
_SDK_PARSE_ERROR: Final = "Failed to parse JSONRPC message from server"
_SDK_CLOSED: Final = "Connection closed"
_SDK_STREAM_LOST: Final = "SSE stream "
_STDERR_CHUNK: Final = 65_536
# Why a bridged tool the model may have used is gone, for the model (Kernel.unregister).
_HELD: Final = (
    "Its server changed its definition; it is withdrawn until an operator approves the change."
)
_HELD_NEW: Final = "It is new on its server and withheld until an operator approves it."
_LEFT_OUT_SHOWN: Final = 10  # tools named in the line that lists those off the allowlist
_REJECTED: Final = "Its server's new definition was refused as unsafe; it is withdrawn."
_RETRY_ADVICE: Final = "It may work if called again."
_NO_RETRY_ADVICE: Final = "Calling it again the same way will not help."


class ServerUnavailable(ToolkernelError):
    """A downstream server could not be started or reached."""


@dataclass(frozen=True, slots=True)
class RejectReason:
    """Why a remote tool was not admitted: a lint rule id or a bridge rule."""

    rule: str
    message: str
    pointer: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "message": self.message, "pointer": self.pointer}


@dataclass(frozen=True, slots=True)
class Admission:
    """What the bridge decided about one remote tool, before pinning."""

    server: ServerConfig
    tool: Mapping[str, Any]
    name: str
    definition: ToolDefinition | None
    findings: tuple[Finding, ...] = ()
    reasons: tuple[RejectReason, ...] = ()

    @property
    def accepted(self) -> bool:
        return self.definition is not None and not self.reasons

    @property
    def remote_name(self) -> str:
        return str(self.tool.get("name", ""))

    @property
    def pin_hash(self) -> str:
        return sha256_of(pinned_view(self.tool))


def unless_taken(admission: Admission, seen: Collection[str], *, taken: bool = False) -> Admission:
    """``admission``, or its refusal when an earlier tool of the listing (``seen``) or
    another tool (``taken``) already has its name: two remote names can map to one
    (``a b`` and ``a_b``), and the first keeps it."""
    name = admission.name
    if not admission.accepted or not (taken or name in seen):
        return admission
    reason = RejectReason("NAME_COLLISION", f"another tool is already named {name}")
    return Admission(admission.server, admission.tool, name, None, admission.findings, (reason,))


def _collided(admission: Admission) -> bool:
    return any(reason.rule == "NAME_COLLISION" for reason in admission.reasons)


@dataclass(frozen=True, slots=True)
class ServerReport:
    """The state of one server after connecting or refreshing it."""

    server: str
    connected: bool
    error: str | None = None
    accepted: tuple[str, ...] = ()
    rejected: tuple[str, ...] = ()
    held: tuple[str, ...] = ()


PING_TIMEOUT_S: Final = 2.0
"""After a call timed out or was cancelled, how long its server has to answer a
request before it counts as stuck and is restarted."""


def reconnect_waits() -> Iterator[float]:
    """The waits before each new try to start a server that was down: from
    ``RECONNECT_FIRST_S``, doubling, up to ``RECONNECT_MAX_S``."""
    wait = RECONNECT_FIRST_S
    while True:
        yield wait
        wait = min(wait * 2, RECONNECT_MAX_S)


def namespaced(server: str, remote_name: str) -> str:
    """``git`` + ``git status`` → ``git.git_status``."""
    local = _UNSAFE_NAME.sub("_", remote_name)[: 127 - len(server)] or "_"
    return f"{server}.{local}"


def listing_budget() -> TextBudget:
    """The text the lint reads in one server's ``tools/list``, all its tools together:
    each tool has its own cap too, and a listing of many large ones must not stall the
    bridge for minutes (the largest of real listings holds about 32,000 characters)."""
    return document_budget("server's tools/list")


def admit_tool(
    server: ServerConfig,
    tool: Mapping[str, Any],
    *,
    redactor: Redactor | None = None,
    budget: TextBudget | None = None,
) -> Admission:
    """Allowlist, lint and convert one tool of ``server`` (as listed by ``tools/list``).

    With ``redactor``, the text of the definition the model will be shown (titles and
    descriptions, the schemas' too) is masked like any output: a server's definition
    is untrusted content. The pin and the lint see it as the server sent it.
    ``budget`` is the text the lint may read in the whole listing (``listing_budget``):
    a tool past it is rejected (``P114``) rather than read.
    """
    remote = str(tool.get("name", ""))
    name = namespaced(server.name, remote)
    if not (server.allows(remote) or server.allows(name.split(".", 1)[1])):
        reason = RejectReason("ALLOWLIST", f"not on the allowlist of server {server.name}")
        return Admission(server, tool, name, None, reasons=(reason,))
    findings = tuple(lint_definition(tool, kind="mcp", within=budget))
    errors = tuple(
        RejectReason(f.rule, f.message, f.pointer) for f in findings if f.severity is Severity.ERROR
    )
    if errors:
        return Admission(server, tool, name, None, findings, errors)
    try:
        shown = tool if redactor is None else _masked_tool(tool, redactor)
        definition = ToolDefinition.from_dict(_definition_data(server, name, shown))
    except DefinitionError as exc:
        reason = RejectReason("DEFINITION", f"field '{exc.field}': {exc.problem}"[:300])
        return Admission(server, tool, name, None, findings, (reason,))
    except _Unmaskable as exc:
        why = "a secret where masking it would change what calls are named or checked against"
        reason = RejectReason("SECRET", why, exc.pointer[:300])
        return Admission(server, tool, name, None, findings, (reason,))
    return Admission(server, tool, name, definition, findings)


def _definition_data(server: ServerConfig, name: str, tool: Mapping[str, Any]) -> dict[str, Any]:
    remote = str(tool.get("name", ""))
    annotations = tool.get("annotations") or {}
    schema, closed = _closed(tool.get("inputSchema"))
    safety, idempotent = _risk(server, annotations)
    tags = ["mcp", server.source]
    if closed:
        tags.append("mcp:schema-closed")
    title = tool.get("title") or annotations.get("title") or name
    data: dict[str, Any] = {
        "name": name,
        "version": "1",
        "title": str(title)[:200],
        "description": tool.get("description")
        or f"Tool '{remote[:64]}' of MCP server {server.name} (it gives no description).",
        "inputSchema": schema,
        "executionMode": str(ExecutionMode.REMOTE_MCP),
        "permissions": {"network": safety["external"]},
        "safety": safety,
        "timeoutMs": server.timeout_ms,
        "idempotent": idempotent,
        "tags": tags,
    }
    if tool.get("outputSchema") is not None:
        data["outputContract"] = {"schema": tool["outputSchema"]}
    return data


# Schema values a call is checked against: masking them would change the schema.
_VALIDATED: Final = frozenset({"enum", "const", "pattern", "required", "type", "format"})
# References, not text: left as they are.
_REFERENCES: Final = frozenset({"$ref", "$schema", "$id", "$anchor", "$dynamicRef"})
# What the redactor may find in an identifier without it being a secret: an enum of
# item ids reads as high-entropy text, a pattern as a path.
_NOT_SECRETS: Final = frozenset({"high-entropy", "host-path", "workspace-path"})
_DESCRIPTION_MAX: Final = 4000


class _Unmaskable(Exception):
    """A secret where masking would change what calls are checked against."""

    def __init__(self, pointer: str) -> None:
        super().__init__(pointer)
        self.pointer = pointer


def _masked_tool(tool: Mapping[str, Any], redactor: Redactor) -> dict[str, Any]:
    """``tool`` as the model may see it: every text of it masked like output (titles,
    descriptions, examples, defaults, comments, at any depth of its schemas).

    Raises:
        _Unmaskable: a secret (a token or key of a known form) in the tool's name (the
            model is shown it and calls it by it), in a property name or in a value
            calls are validated against (``enum``, ``const``, ``pattern``, …).
    """
    if _holds_secret(str(tool.get("name", "")), redactor):
        raise _Unmaskable("/name")
    shown = dict(_masked(tool, redactor, ""))
    description, masked = tool.get("description"), shown.get("description")
    if (
        isinstance(description, str)
        and isinstance(masked, str)
        and len(masked) > _DESCRIPTION_MAX >= len(description)  # masks can be longer
    ):
        shown["description"] = masked[:_DESCRIPTION_MAX]
    return shown


def _masked(value: Any, redactor: Redactor, pointer: str) -> Any:
    if isinstance(value, str):
        return redactor.redact_text(value, Counter())
    if isinstance(value, list):
        return [_masked(item, redactor, f"{pointer}/{i}") for i, item in enumerate(value)]
    if not isinstance(value, Mapping):
        return value
    shown: dict[str, Any] = {}
    for key, item in value.items():
        where = f"{pointer}/{key}"
        if _holds_secret(key, redactor):  # a property name: what calls are checked for
            raise _Unmaskable(where)
        if key in _REFERENCES:
            shown[key] = item
        elif key in _VALIDATED:
            if any(_holds_secret(text, redactor) for text in _strings(item)):
                raise _Unmaskable(where)
            shown[key] = item
        else:
            shown[key] = _masked(item, redactor, where)
    return shown


def _holds_secret(text: str, redactor: Redactor) -> bool:
    """Whether ``text`` holds a secret of a known form (a token, a key)."""
    found: Counter[str] = Counter()
    redactor.redact_text(text, found)
    return any(kind not in _NOT_SECRETS for kind in found)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)


def _closed(schema: Any) -> tuple[Any, bool]:
    """The input schema with its top level closed; True when that changed it.

    A property a top-level ``anyOf``/``oneOf``/``allOf`` branch declares is declared at
    the top level too (as ``{}``: its branch still says what it may be), or closing
    would refuse every call that uses it ("at least one of a or b").
    """
    if not isinstance(schema, Mapping):
        return schema, False
    closed = {"type": "object", **schema, "additionalProperties": False}
    declared = schema.get("properties", {})
    branches = _branch_properties(schema)
    if isinstance(declared, Mapping) and not branches.keys() <= declared.keys():
        closed["properties"] = {**branches, **declared}
    return closed, closed != schema


def _branch_properties(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The names of the properties the top-level combinators' branches declare, in
    the branch or in the local definition it refers to (``{"$ref": "#/$defs/X"}``)."""
    names: dict[str, Any] = {}
    for keyword in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(keyword)
        for branch in branches if isinstance(branches, list) else ():
            branch = _local_target(schema, branch)
            properties = branch.get("properties") if isinstance(branch, Mapping) else None
            if isinstance(properties, Mapping):
                names.update((name, {}) for name in properties if isinstance(name, str))
    return names


def _local_target(schema: Mapping[str, Any], branch: Any) -> Any:
    """What a branch's ``$ref`` to ``#/$defs/X`` (or ``#/definitions/X``) names, else
    the branch itself."""
    ref = branch.get("$ref") if isinstance(branch, Mapping) else None
    for prefix, key in (("#/$defs/", "$defs"), ("#/definitions/", "definitions")):
        defs = schema.get(key)
        if isinstance(ref, str) and ref.startswith(prefix) and isinstance(defs, Mapping):
            return defs.get(ref.removeprefix(prefix), branch)
    return branch


def _risk(server: ServerConfig, hints: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """Safety fields and idempotency, believing the hints only from trusted servers."""
    if server.trusted:
        read_only = hints.get("readOnlyHint") is True
        mutating = not read_only
        destructive = mutating and hints.get("destructiveHint") is not False
        external = hints.get("openWorldHint") is not False
        idempotent = read_only or hints.get("idempotentHint") is True
    else:
        mutating, external, idempotent = True, True, False
        destructive = hints.get("destructiveHint") is True
    safety = {
        "mutating": mutating,
        "destructive": destructive,
        "external": external,
        "trust": str(server.trust),
        "source": server.source,
    }
    return safety, idempotent


class ServerConnection:
    """One server's client session, owned by a task of the bridge's task group.

    The SDK's client is an async context manager, so a dedicated task enters it and
    keeps it open until ``close`` (or until it is found dead and replaced). ``label``
    names the server in messages (default ``MCP server <name>``).
    """

    def __init__(
        self,
        config: ServerConfig,
        group: anyio.abc.TaskGroup,
        *,
        errlog: TextIO | None = None,
        on_tools_changed: Callable[[str], Coroutine[Any, Any, None]] | None = None,
        sandbox: Callable[[ServerConfig], list[str]] | None = None,
        label: str | None = None,
    ) -> None:
        self.config = config
        self.label = label or f"MCP server {config.name}"
        self.generation = 0
        self._group = group
        self._errlog = errlog
        self._on_tools_changed = on_tools_changed
        self._sandbox = sandbox  # the argv that runs a sandboxed server's command
        self._client: Client | None = None
        self._stop: anyio.Event | None = None
        self._start: _Start | None = None
        self._lock = anyio.Lock()
        # Every start whose processes may still run: the live one, and older ones
        # that are still being stopped.
        self._trees: set[ServerTree] = set()
        self._judging: anyio.Event | None = None  # set when check_stuck has decided

    async def client(self) -> Client:
        """The live client, starting the server first when needed; while a call that
        timed out has the server checked (``check_stuck``), after the verdict.

        Raises:
            ServerUnavailable: the server could not be started or initialized.
        """
        client = self._client
        if client is not None and self._judging is None:
            # The common case, without the lock's checkpoint (a trip through the event
            # loop on every call). One loop runs the bridge, so nothing can change
            # ``_client`` between this check and the return.
            return client
        if self._judging is not None:
            await self._judging.wait()
        async with self._lock:
            if self._client is None:
                self.close()
                self._stop = anyio.Event()
                start = _Start(self.label, self._stop)
                try:
                    with anyio.fail_after(self.config.start_timeout_s):
                        self._client = await self._group.start(self._own, start)
                except Exception as exc:  # any failure to start means "unavailable"
                    why = start.fault or _start_failure(self.config, exc)
                    raise ServerUnavailable(f"{self.label} could not be started: {why}") from exc
                self._start = start
                self.generation += 1
            return self._client

    async def list_tools(self, client: Client) -> list[dict[str, Any]]:
        """The tools ``client``'s server lists (every page), within its timeout.

        Raises:
            ServerUnavailable: the server did not list them.
        """
        try:
            with anyio.fail_after(self.config.start_timeout_s):
                return await list_remote_tools(client)
        except (MCPError, ValidationError, TimeoutError, EndlessListing) as exc:
            if isinstance(exc, MCPError) and _connection_lost(exc):
                self.discard(client)
            fault = self._start.fault if self._start is not None else None
            why = fault or _listing_failure(self.config, exc)
            raise ServerUnavailable(f"{self.label} did not list its tools: {why}") from exc

    def check_stuck(self, client: Client) -> None:
        """Have ``client``'s server stopped, in the background, if it does not answer a
        request within ``PING_TIMEOUT_S`` (a call of it timed out or was cancelled).
        The call returns meanwhile; the next one waits for the verdict, so that it
        goes to a fresh server rather than wait out its timeout on a stuck one."""
        if self._judging is not None:
            return
        judged = self._judging = anyio.Event()

        async def judge() -> None:
            try:
                await _drop_if_stuck(client, self)
            finally:
                self._judging = None
                judged.set()

        self._group.start_soon(judge)

    def discard(self, client: Client) -> bool:
        """Forget a client whose connection failed; the next call starts a new one.

        Returns:
            Whether ``client`` was still the live one (not closed or replaced already).
        """
        if self._client is not client:
            return False
        self.close()
        return True

    def close(self) -> None:
        self._client = None
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def kill(self) -> None:
        """SIGKILL an unsandboxed server's processes now, what it started too, rather
        than wait for it to stop (a shutdown in a hurry); a call of it in flight fails.
        A sandboxed server is left to the SDK's escalation: it takes its sandbox along."""
        for tree in self._trees:
            tree.kill()

    async def _own(self, start: _Start, *, task_status: anyio.abc.TaskStatus[Client]) -> None:
        client: Client | None = None
        argv = list(self.config.command)
        tree: ServerTree | None = None
        if self.config.sandbox != "none":
            if self._sandbox is None:
                raise SandboxUnavailable(f"nothing can sandbox MCP server {self.config.name}")
            # Raises rather than start it unsandboxed; lists the workspace: off the loop.
            argv = await anyio.to_thread.run_sync(self._sandbox, self.config)
        elif not self.config.url:
            tree = ServerTree(self.label)
            self._trees.add(tree)
        try:
            async with self._new_client(argv, start, tree) as client:
                task_status.started(client)
                try:
                    await start.stop.wait()
                finally:
                    # Stopped or cancelled: forgotten before the SDK closes it, so that a
                    # request failing meanwhile is not taken for the server's fault.
                    self.discard(client)
        except Exception as exc:
            if client is None:
                raise
            # The process died or the connection broke: calls see it as REMOTE_ERROR.
            # One line for the operator; the SDK's task groups nest the cause deep.
            _log.info("%s: connection ended: %s", self.label, self._cause(exc))
            _log.debug("%s: connection ended", self.label, exc_info=True)
        finally:
            if tree is not None:
                self._trees.discard(tree)
        if client is not None and start.fault is not None:
            _log.warning("%s was disconnected: %s", self.label, start.fault)
            self.discard(client)

    def _cause(self, exc: BaseException) -> str:
        """The innermost first exception, in a line: its URL's query (a token) left out."""
        exc = _innermost(exc)
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if self.config.url:
            text = text.replace(self.config.url, self.config.describe())
        return _shown(text)

    def _new_client(self, argv: list[str], start: _Start, tree: ServerTree | None) -> Client:
        config = self.config
        target: Any
        if config.url:
            target = config.url
        else:
            env = config.child_env()
            if config.sandbox != "none":
                env |= SANDBOX_ENV
            if tree is not None:
                env |= tree.environment
            params = StdioServerParameters(
                command=argv[0],
                args=argv[1:],
                env=env,
                cwd=config.cwd,
            )
            _SDK_STDIO_LOG.addFilter(_without_parse_tracebacks)  # idempotent
            target = _parsed_only(_stdio(params, self._errlog, tree), start)
        return Client(
            target,
            mode="legacy",
            cache=None,
            client_info=CLIENT_INFO,
            message_handler=self._on_message,
        )

    async def _on_message(self, message: Any) -> None:
        changed = getattr(message, "method", None) == "notifications/tools/list_changed"
        if changed and self._on_tools_changed is not None:
            self._group.start_soon(self._on_tools_changed, self.config.name)


@asynccontextmanager
async def _stdio(
    params: StdioServerParameters, errlog: TextIO | None, tree: ServerTree | None
) -> AsyncIterator[TransportStreams]:
    """The SDK's stdio transport, with the server's stderr on an open file description
    of its own: ``errlog`` (default: our stderr) opened anew, or where that cannot be
    (a socket, an in-memory stream), a pipe a thread copies to ``errlog``. With
    ``tree`` (an unsandboxed server), what the server started is stopped with it.

    Children are not given our stderr itself: they would share its open file
    description, and one that makes it non-blocking (Node.js does) would make every
    other writer's burst, and ours, fail with EAGAIN whenever the pipe is full.
    """
    own = _reopened(errlog or sys.stderr)
    if own is not None:  # the server writes there itself: nothing to copy
        with own:
            async with _swept(stdio_client(params, errlog=own), tree) as streams:
                yield streams
        return
    stderr = _ChildStderr(errlog)
    try:
        async with _swept(stdio_client(params, errlog=stderr.child_end), tree) as streams:
            stderr.spawned()
            yield streams
    finally:
        # After the sweep: a process the server left behind holds the pipe open.
        with anyio.CancelScope(shield=True):
            await stderr.close()


@asynccontextmanager
async def _swept(transport: Transport, tree: ServerTree | None) -> AsyncIterator[TransportStreams]:
    """``transport`` (the SDK's stdio client), and once it has stopped the server
    (stdin closed, grace, its process group signalled), ``tree`` swept of whatever the
    server left running: the SDK signals only a server that outlived its grace, and
    only its process group."""
    try:
        async with transport as streams:
            if tree is not None:
                tree.spawned()
            yield streams
    finally:
        if tree is not None:
            with anyio.CancelScope(shield=True):
                await tree.sweep()


def _reopened(errlog: TextIO) -> TextIO | None:
    """The pipe, terminal or append-only file behind ``errlog`` opened again (through
    /proc): the same place, a description of its own. None for anything else: a
    socket or an in-memory stream cannot be opened again, and a file we write at our
    own offset (``2>serve.log``) would overwrite what the server appends."""
    try:
        descriptor = errlog.fileno()
        mode = os.fstat(descriptor).st_mode
        appending = stat.S_ISREG(mode) and fcntl.fcntl(descriptor, fcntl.F_GETFL) & os.O_APPEND
        if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or appending):
            return None
        errlog.flush()
        flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
        reopened = os.open(f"/proc/self/fd/{descriptor}", flags)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return None
    return os.fdopen(reopened, "w", encoding="utf-8")


class _ChildStderr:
    """A stdio server's stderr: a pipe of its own, copied to ``errlog`` as it comes
    (for an ``errlog`` that cannot be opened again; see ``_stdio``).

    A thread of its own waits on the pipe and writes what comes: Python servers log a
    line per request, and the event loop (and the calls on it) never wakes for them;
    a slow reader of our stderr holds back only the server that writes, as a full pipe
    would. A second pipe wakes the thread to stop, so that a process the server left
    behind, holding its stderr, does not keep the thread and the pipe alive.
    """

    def __init__(self, errlog: TextIO | None) -> None:
        read_fd, write_fd = os.pipe()
        self.child_end: TextIO = os.fdopen(write_fd, "w", encoding="utf-8")
        self._errlog = errlog
        self._stop_read, self._stop_write = os.pipe()
        self._copier = threading.Thread(
            target=self._copy, args=(read_fd,), name="mcp-server-stderr", daemon=True
        )
        self._copier.start()

    def spawned(self) -> None:
        """The child has its copy of the write end: close ours, so that the pipe ends
        when the server (and whatever it started) has exited."""
        self.child_end.close()

    async def close(self) -> None:
        """Wait until what the server wrote is copied, at most ``STDERR_FLUSH_S``, then
        stop the thread (a process the server started may keep the pipe open)."""
        self.child_end.close()
        await anyio.to_thread.run_sync(self._copier.join, STDERR_FLUSH_S, abandon_on_cancel=True)
        with suppress(OSError):
            os.write(self._stop_write, b"x")
        await anyio.to_thread.run_sync(self._copier.join, abandon_on_cancel=True)
        os.close(self._stop_write)

    def _copy(self, fd: int) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        errlog = self._errlog or sys.stderr
        poller = select.poll()  # not select(): descriptors past 1024 are fine
        poller.register(fd, select.POLLIN)
        poller.register(self._stop_read, select.POLLIN)
        try:
            while True:
                ready = {ready_fd for ready_fd, _ in poller.poll()}
                if fd not in ready:
                    break  # told to stop, and nothing is left to copy
                chunk = os.read(fd, _STDERR_CHUNK)
                if not chunk:
                    break
                with suppress(OSError, ValueError):  # our stderr is gone: nobody reads it
                    errlog.write(decoder.decode(chunk))
                    errlog.flush()
        except OSError:
            pass  # the pipe broke: the server is gone
        finally:
            os.close(fd)
            os.close(self._stop_read)


def _without_parse_tracebacks(record: logging.LogRecord) -> bool:
    # The SDK logs each line that is not JSON-RPC with a traceback and without naming
    # the server (165,214 of them in 33 s for `yes`); _Start reports them per server.
    return record.msg != _SDK_PARSE_ERROR


@dataclass(slots=True)
class _Start:
    """One start of a server: what stops it, and its stdout lines that did not parse."""

    label: str
    stop: anyio.Event
    bad: int = 0
    in_a_row: int = 0
    fault: str | None = None

    def parsed(self) -> None:
        self.in_a_row = 0

    def unparsed(self, error: ValueError) -> None:
        """Count a line that is not JSON-RPC; at MAX_BAD_LINES in a row, the server is
        broken: ``fault`` says why and its connection stops."""
        self.bad += 1
        self.in_a_row += 1
        if self.bad == 1:
            _log.warning("%s wrote non-JSON-RPC output on stdout: %s", self.label, _line(error))
        if self.in_a_row >= MAX_BAD_LINES and self.fault is None:
            self.fault = (
                f"it wrote {MAX_BAD_LINES} lines in a row on stdout that are not JSON-RPC "
                f"(the last: {_line(error)})"
            )
            self.stop.set()


class _ParsedOnly(FilteredReadStream):
    """A stdio server's read stream without the SDK's parse errors (a ``ReadStream``).

    Once the server is broken (``_Start.fault``) the stream ends, so the session sees
    the connection close: a pending request fails with CONNECTION_CLOSED. When the
    server's stdout ends, its start is stopped (the connection is forgotten).
    """

    def __init__(self, inner: ReadStream[SessionMessage | Exception], start: _Start) -> None:
        super().__init__(inner)
        self._start = start

    async def receive(self) -> SessionMessage | Exception:
        while self._start.fault is None:
            try:
                item: SessionMessage | Exception = await self._inner.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                # The server closed its stdout: it exited (or is about to). Its
                # connection is dropped now, so the next call starts a new server
                # rather than fail on this one.
                self._start.stop.set()
                raise
            if isinstance(item, SessionMessage):
                self._start.parsed()
                return item
            if not isinstance(item, ValueError):  # another transport fault: the session's
                return item
            self._start.unparsed(item)
        raise anyio.EndOfStream


@asynccontextmanager
async def _parsed_only(transport: Transport, start: _Start) -> AsyncIterator[TransportStreams]:
    async with transport as (read, write):
        yield _ParsedOnly(read, start), write


def _line(error: ValueError) -> str:
    """The stdout line a parse error is about, quoted and cut for a terminal."""
    value: Any = str(error)
    if isinstance(error, ValidationError) and error.error_count():
        value = error.errors(include_url=False)[0].get("input", value)
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return repr(text if len(text) <= 60 else text[:60] + "…")


@dataclass(frozen=True, slots=True)
class _Route:
    server: str
    remote: str
    structured: bool


@dataclass(frozen=True, slots=True)
class _Listing:
    """What connecting to a server and listing its tools gave: the tools, each with its
    admission as far as the tool alone decides it (lint, allowlist), or why not."""

    generation: int = 0
    tools: Sequence[Mapping[str, Any]] = ()
    error: str | None = None
    judged: Sequence[Admission] = ()


@dataclass
class _ServerState:
    connection: ServerConnection
    listed_generation: int = 0
    names: set[str] = field(default_factory=set)
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    # A refresh asked for by list_changed that has not begun listing yet: it will see
    # whatever changed meanwhile too, so later notifications add no refresh of their own.
    refresh_waiting: object | None = None  # a token of the waiting refresh
    reconnecting: bool = False  # down when connected: tried again until it is up


class McpBridge:
    """Bridges downstream servers into ``kernel`` and is its REMOTE_MCP adapter.

    ::

        async with McpBridge(kernel, servers) as bridge:
            await bridge.connect_all(run)
            ...  # kernel.call(run, "git.git_status", {...})

    Args:
        kernel: the kernel to register tools on; the bridge installs itself as its
            REMOTE_MCP adapter.
        servers: the configured downstream servers.
        pins: the pin store; defaults to ``<state_dir>/mcp-pins.json``.
        errlog: where stdio servers' stderr is copied to (default: ours).
    """

    def __init__(
        self,
        kernel: Kernel,
        servers: Iterable[ServerConfig],
        *,
        pins: PinStore | None = None,
        errlog: TextIO | None = None,
    ) -> None:
        self.kernel = kernel
        self.servers = {server.name: server for server in servers}
        # Secrets we hand a server (env, env_allow) come back in its errors and output.
        for server in self.servers.values():
            for secret in server.secrets():
                kernel.redactor.add_secret(secret)
        self.pins = pins or PinStore.in_state_dir(kernel.config.state_dir)
        self.errlog = errlog
        self.run_id = ADMISSION_RUN_ID
        self._states: dict[str, _ServerState] = {}
        self._routes: dict[str, _Route] = {}
        self._held: dict[tuple[str, str], Admission] = {}
        self._pins_seen = -1  # the pin store's version when held tools were last checked
        self._reported: set[tuple[str, str, str]] = set()
        self._group: anyio.abc.TaskGroup | None = None
        self._closing = False
        # The workspace's policy files when the bridge opened: while a server with the
        # workspace writable runs, any it creates, at any depth, is removed and any it
        # changes is put back, before and after each of its calls (planted.py).
        self._policy = PolicySnapshot({})
        self._policy_listing: Callable[[], tuple[Path, ...]] | None = None

    async def __aenter__(self) -> Self:
        if any(config.sandbox == "workspace" for config in self.servers.values()):
            workspace = self.kernel.guard.workspace
            listing = partial(config_files, workspace)
            existing = await anyio.to_thread.run_sync(listing)
            self._policy = PolicySnapshot.take(
                self.kernel.policy_files,
                workspace,
                existing,
                quarantine=self.kernel.config.state_dir / QUARANTINE_DIRNAME,
            )
            self._policy_listing = listing
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        for name, config in self.servers.items():
            connection = ServerConnection(
                config,
                self._group,
                errlog=self.errlog,
                on_tools_changed=self._refresh_quietly,
                sandbox=partial(
                    sandboxed_argv,
                    self.kernel.config,
                    self.kernel.guard,
                    host_code=self.kernel.host_code,
                ),
            )
            self._states[name] = _ServerState(connection)
        self.kernel.adapters[ExecutionMode.REMOTE_MCP] = self
        self._group.start_soon(self._watch_pins)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._closing = True
        for name in list(self._routes):
            self._withdraw(name)
        for state in self._states.values():
            state.connection.close()
        assert self._group is not None
        self._group.cancel_scope.cancel()  # background refreshes; servers shut down shielded
        # The body's own exception propagates as it is, not wrapped in a group.
        await self._group.__aexit__(None, None, None)
        with anyio.CancelScope(shield=True):  # the servers are gone: nothing recreates it
            planted = await self._restore_policy(True)
        if planted:
            names = ", ".join(str(path) for path in planted.found)
            _log.warning("a server with the workspace writable changed %s; undone", names)
        return None

    def kill_servers(self) -> None:
        """SIGKILL every unsandboxed stdio server's processes now, with what each
        started, instead of waiting for them to stop: for a shutdown in a hurry (a
        second SIGINT or SIGTERM to ``serve``). Their calls in flight fail; a server
        is started again on its next call unless the bridge is closing."""
        for state in self._states.values():
            state.connection.kill()

    async def _restore_policy(self, watched: bool) -> Planted:
        """Undo what servers with the workspace writable did to any toolkernel.toml."""
        if not watched or self._policy_listing is None:
            return Planted()
        return await self._policy.restore_async(self._policy_listing)

    # -- admission ------------------------------------------------------------------

    async def connect_all(self, run: Run | str | None = None) -> list[ServerReport]:
        """Connect every server and register its admitted tools.

        The servers are started and listed concurrently; their tools are admitted
        afterwards, in the configured order, as are the reports. Admission events go
        to ``run`` (or to the ``mcp-admission`` run). A server that cannot start is
        reported and skipped; the others go on. It is tried again in the background,
        less and less often (``reconnect_waits``), and its tools are bridged once it
        is up.
        """
        if run is not None:
            self.run_id = run if isinstance(run, str) else run.id
        listings: dict[str, _Listing] = {}

        async def list_one(name: str) -> None:
            listings[name] = await self._listing(name)

        async with AsyncExitStack() as locks:
            # Every lock is held until all are admitted: a refresh a server asks for
            # while the others start must not be overtaken by this older listing.
            for name in self.servers:
                await locks.enter_async_context(self._states[name].lock)
            async with anyio.create_task_group() as group:
                for name in self.servers:
                    group.start_soon(list_one, name)
            reports = [self._admitted(name, listings[name]) for name in self.servers]
        assert self._group is not None
        for report in reports:
            if not report.connected:
                self._group.start_soon(self._reconnect, report.server)
        return reports

    async def _reconnect(self, server: str) -> None:
        """Until ``server`` is up or the bridge closes: list its tools again after each
        of ``reconnect_waits``."""
        state = self._states[server]
        if state.reconnecting:
            return
        state.reconnecting = True
        try:
            for wait in reconnect_waits():
                await anyio.sleep(wait)
                try:
                    report = await self.refresh(server)
                except Exception:  # noqa: BLE001 - a background retry must not end the bridge
                    _log.exception("starting MCP server %s again failed", server)
                    continue
                if report.connected:
                    _log.info(
                        "MCP server %s is up: %d tools accepted, %d rejected, %d held",
                        server,
                        len(report.accepted),
                        len(report.rejected),
                        len(report.held),
                    )
                    return
        finally:
            state.reconnecting = False

    async def refresh(self, server: str) -> ServerReport:
        """List ``server``'s tools again and admit, hold or withdraw each."""
        state = self._states[server]
        async with state.lock:
            state.refresh_waiting = None  # a change notified from now on needs a new one
            return self._admitted(server, await self._listing(server))

    async def _listing(self, server: str) -> _Listing:
        """Start ``server`` when needed and list its tools; the caller holds its lock."""
        connection = self._states[server].connection
        try:
            client = await connection.client()
            generation = connection.generation
            tools = await connection.list_tools(client)
        except ServerUnavailable as exc:
            return _Listing(error=str(exc))
        # Linting a hostile server's definitions can take a while: not on the event loop.
        config, redactor = self.servers[server], self.kernel.redactor
        budget = listing_budget()
        judged = await anyio.to_thread.run_sync(
            lambda: [admit_tool(config, tool, redactor=redactor, budget=budget) for tool in tools]
        )
        return _Listing(generation, tools, judged=judged)

    def _admitted(self, server: str, listing: _Listing) -> ServerReport:
        """Admit, hold or withdraw the tools of ``listing``; the caller holds the lock."""
        if listing.error is not None:
            _log.warning("%s", listing.error)
            return ServerReport(server, connected=False, error=listing.error[:300])
        state = self._states[server]
        state.listed_generation = listing.generation
        return self._admit_all(state, self.servers[server], listing.judged)

    async def approve_pin(self, server: str, tool: str) -> ToolDefinition | None:
        """Approve the definition of ``server``'s ``tool`` (its remote name) that this
        bridge holds, and expose it now; returns its definition when it is registered.

        Only that definition is approved: if another gateway on the same state
        directory recorded a different one as pending meanwhile, nothing is.

        Raises:
            UsageError: this bridge holds no definition of that tool, or the one
                pending is not the one it holds.
        """
        held = self._held.get((server, tool))
        if held is None:
            raise UsageError(f"no changed or new definition of {server}.{tool} is held here")
        self.pins.approve(server, tool, expected=held.pin_hash)
        return held.definition if self._release((server, tool)) else None

    def release_approved(self) -> list[str]:
        """Expose the held tools whose definition was approved elsewhere since (by
        ``toolkernel mcp approve`` while this bridge runs); returns their names.

        The bridge does this by itself every ``PIN_POLL_S`` seconds while it holds any.

        Raises:
            ConfigError: the pin file cannot be read.
        """
        # The store's version, not reload's answer: a refresh of another server may
        # have read the change first.
        self.pins.reload()
        if self.pins.version == self._pins_seen:
            return []
        self._pins_seen = self.pins.version
        held = [(key, admission.name) for key, admission in self._held.items()]
        return [name for key, name in held if self._release(key)]

    def _release(self, key: tuple[str, str]) -> bool:
        """Expose a held tool if its definition now matches its pin: what was pending
        may have been replaced meanwhile (by another gateway), and another stays held."""
        admission = self._held[key]
        if admission.definition is None:
            return False
        if self.pins.peek(key[0], admission.tool).verdict is not PinVerdict.MATCH:
            return False
        name = admission.name
        if self.kernel.registry.find(name) is not None and name not in self._routes:
            return False  # another tool took the name meanwhile
        del self._held[key]
        self._expose(admission)  # the kernel tells its listeners: tools changed
        self.kernel.ledger.append(self.run_id, self._exposed_again(admission))
        return True

    def _exposed_again(self, admission: Admission) -> list[NewEvent]:
        """REMOTE_TOOL_CHANGED with ``exposed``: a withheld definition is shown again
        (approved, or the server went back to its pin). A later change is recorded
        anew, even to a definition recorded before."""
        name = admission.name
        self._reported = {seen for seen in self._reported if seen[1] != name}
        payload = {
            **_identity(admission),
            "oldHash": None,
            "newHash": admission.pin_hash,
            "exposed": True,
            "approve": None,
        }
        return [NewEvent(EventType.REMOTE_TOOL_CHANGED, payload)]

    async def _watch_pins(self) -> None:
        """Until the bridge closes: release held tools approved from outside."""
        while True:
            await anyio.sleep(PIN_POLL_S)
            if not self._held:
                continue
            try:
                released = self.release_approved()
            except ConfigError as exc:  # reported once per change of the file
                _log.warning("%s", exc)
                continue
            except Exception:  # noqa: BLE001 - a bug here must not take the bridge down
                _log.exception("looking for tools approved elsewhere failed")
                continue
            for name in released:
                _log.info("%s was approved; it is exposed again", name)

    def _admit_all(
        self, state: _ServerState, config: ServerConfig, judged: Sequence[Admission]
    ) -> ServerReport:
        events: list[NewEvent] = []
        accepted: list[str] = []
        rejected: list[str] = []
        held: list[str] = []
        seen: set[str] = set()
        left_out: list[str] = []  # off the allowlist: the user's choice, not a warning
        pinned: dict[str, list[str]] = {}  # the server's pinned remote names, by local name
        for remote in self.pins.pinned(config.name):
            pinned.setdefault(namespaced(config.name, remote), []).append(remote)
        # Trust on first use is the server's first listing: a tool it adds later (an
        # update, a list_changed) was never seen by whoever trusted it, so it waits.
        trusted_before = bool(pinned)
        was_held = {key for key in self._held if key[0] == config.name}
        for key in was_held:
            del self._held[key]  # held again below if still held; a stale one never returns
        for judgement in judged:
            admission = self._admit(judgement, seen)
            tool = admission.tool
            seen.add(admission.name)
            if not admission.accepted:
                if not _collided(admission):  # the name is another tool's, which stays
                    self._withdraw(admission.name, _REJECTED)
                rejected.append(admission.remote_name)
                reported = self._rejected_event(admission, admission.reasons)
                if reported and _off_allowlist(admission):
                    left_out.append(admission.remote_name)
                elif reported:
                    _log.warning("%s was refused: %s", _shown(admission.name), _why(admission))
                events.extend(reported)
                continue
            # A tool that takes the name the model knows another tool of the server by
            # ("git status" for git_status) is that tool changed: never pinned on sight.
            renamed = self._renamed(admission, pinned)
            strict = config.pin == "strict" or renamed is not None or trusted_before
            try:
                check = self.pins.check(config.name, tool, strict=strict)
            except ConfigError as exc:
                # The pins cannot be read (a file broken by hand): nothing is exposed
                # unchecked. Held, it is exposed again once the file reads and the
                # definition matches its pin.
                self._withdraw(admission.name, _HELD)
                self._held[(config.name, admission.remote_name)] = admission
                held.append(admission.remote_name)
                reason = RejectReason("PIN_FILE", f"the pins cannot be read: {exc}")
                events.extend(self._rejected_event(admission, (reason,)))
                continue
            if check.exposed:
                self._expose(admission)
                accepted.append(admission.name)
                if (config.name, admission.remote_name) in was_held:
                    events.extend(self._exposed_again(admission))
                continue
            changed = check.verdict is PinVerdict.CHANGED
            self._withdraw(admission.name, _HELD if changed or renamed else _HELD_NEW)
            self._held[(config.name, admission.remote_name)] = admission
            held.append(admission.remote_name)
            if changed:
                reported = self._changed_event(admission, check.old_hash, check.hash)
                if reported:
                    _log.warning(
                        "%s changed its definition and is withheld until approved: %s",
                        _shown(admission.name),
                        _shown(str(reported[0].payload["approve"])),
                    )
                events.extend(reported)
            else:
                review = command("diff", config.name, admission.remote_name)
                if renamed is not None:
                    why = (
                        f"it takes the name {admission.name} that the server's tool "
                        f"{renamed!r} had, and awaits approval"
                    )
                elif config.pin == "strict":
                    why = "a new tool of a strict server awaits approval"
                else:
                    why = "a tool the server did not offer when it was first pinned awaits approval"
                why += f": review it with {review}, then toolkernel mcp approve"
                _log.warning(
                    "%s is new and withheld until approved: %s",
                    _shown(admission.name),
                    _shown(review),
                )
                reason = RejectReason("PIN_APPROVAL", why)
                events.extend(self._rejected_event(admission, (reason,)))
        if left_out:
            shown = ", ".join(_shown(name) for name in left_out[:_LEFT_OUT_SHOWN])
            more = (
                f" and {len(left_out) - _LEFT_OUT_SHOWN} more"
                if len(left_out) > _LEFT_OUT_SHOWN
                else ""
            )
            _log.info(
                "%s: %d tools not on its allowlist are left out: %s%s",
                _shown(config.name),
                len(left_out),
                shown,
                more,
            )
        for gone in state.names - seen:
            self._withdraw(gone)
        state.names = seen
        if events:
            self.kernel.ledger.append(self.run_id, events)
        return ServerReport(config.name, True, None, tuple(accepted), tuple(rejected), tuple(held))

    def _renamed(self, admission: Admission, pinned: Mapping[str, list[str]]) -> str | None:
        """Another remote name of the server that the model knows by the same name as
        ``admission`` (routed to now, or pinned: ``pinned`` by local name), if any."""
        name = admission.name
        route = self._routes.get(name)
        if route is not None and route.remote != admission.remote_name:
            return route.remote
        others = [other for other in pinned.get(name, ()) if other != admission.remote_name]
        return others[0] if others else None

    def _admit(self, admission: Admission, seen: set[str]) -> Admission:
        """``admission`` (of the tool alone), unless its name is taken."""
        name = admission.name
        taken = self.kernel.registry.find(name) is not None and name not in self._routes
        return unless_taken(admission, seen, taken=taken)

    def _expose(self, admission: Admission) -> None:
        """Register the admitted tool in place of the one of its name. The same
        definition on the same route is left registered: a server that lists its tools
        again unchanged (on its own list_changed, or after a restart) changes nothing,
        and the kernel's listeners are not told that it did."""
        assert admission.definition is not None
        name = admission.name
        structured = admission.definition.output_contract.schema is not None
        route = _Route(admission.server.name, admission.remote_name, structured)
        registered = self.kernel.registry.find(name)
        if (
            self._routes.get(name) == route
            and registered is not None
            and registered.definition == admission.definition
        ):
            return
        self.kernel.unregister(name)
        self.kernel.register(admission.definition)
        self._routes[name] = route

    def _withdraw(self, name: str, reason: str = "") -> None:
        if self._routes.pop(name, None) is not None:
            self.kernel.unregister(name, reason=reason)
        elif reason in (_HELD, _HELD_NEW):  # never exposed here: a call still learns why
            self.kernel.withhold(name, reason)

    def _rejected_event(
        self, admission: Admission, reasons: Sequence[RejectReason]
    ) -> list[NewEvent]:
        payload = {
            **_identity(admission),
            "reasons": [reason.to_dict() for reason in reasons],
        }
        return self._once("rejected", admission, payload, EventType.REMOTE_TOOL_REJECTED)

    def _changed_event(self, admission: Admission, old: str | None, new: str) -> list[NewEvent]:
        payload = {
            **_identity(admission),
            "oldHash": old,
            "newHash": new,
            "exposed": False,
            "approve": command("diff", admission.server.name, admission.remote_name),
        }
        return self._once("changed", admission, payload, EventType.REMOTE_TOOL_CHANGED)

    def _once(
        self, kind: str, admission: Admission, payload: dict[str, Any], event: EventType
    ) -> list[NewEvent]:
        key = (kind, admission.name, admission.pin_hash)
        if key in self._reported:
            return []
        self._reported.add(key)
        return [NewEvent(event, payload)]

    async def _refresh_quietly(self, server: str) -> None:
        """``refresh`` for a server's list_changed: one waiting refresh serves a burst
        of them (a server that sends thousands makes one or two listings, not one each)."""
        state = self._states[server]
        if state.refresh_waiting is not None:
            return
        state.refresh_waiting = mine = object()
        try:
            await self.refresh(server)
        except Exception:  # noqa: BLE001 - a background refresh must not end the bridge
            _log.exception("refreshing the tools of MCP server %s failed", server)
        finally:
            if state.refresh_waiting is mine:  # it never began (cancelled): not waiting
                state.refresh_waiting = None

    # -- the REMOTE_MCP adapter ------------------------------------------------------

    async def invoke(self, invocation: Invocation) -> ToolOutput:
        """Call the remote tool behind ``invocation`` (the kernel's Adapter protocol)."""
        name = invocation.tool.name
        route = self._routes.get(name)
        if route is None:
            raise _remote_failure(name, "the tool is no longer bridged", retryable=False)
        state = self._states[route.server]
        connection = state.connection
        try:
            client = await connection.client()
        except ServerUnavailable as exc:
            raise _remote_failure(name, "its server could not be started", retryable=True) from exc
        if connection.generation != state.listed_generation:
            await self.refresh(route.server)  # a restarted server may offer other definitions
            if self._routes.get(name) != route:
                raise _remote_failure(name, "its definition changed and awaits approval", False)

        context = invocation.context

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            context.progress(progress, total, message or "")

        request = types.CallToolRequest(
            params=types.CallToolRequestParams(
                name=route.remote, arguments=dict(invocation.arguments)
            )
        )
        # A server with the workspace writable cannot be given a read-only policy file
        # that does not exist; one it creates is removed, before or after a call of it.
        watched = connection.config.sandbox == "workspace"
        planted = await self._restore_policy(watched)
        if planted:
            raise planted.violation(f"A server of {name}", self.kernel.guard.workspace)
        try:
            result = await self._send(name, client, connection, request, progress, context.token)
        finally:
            with anyio.CancelScope(shield=True):
                planted = await self._restore_policy(watched)
        if planted:
            raise planted.violation(name, self.kernel.guard.workspace)
        return _to_output(
            result, name, route.structured, self.kernel.artifacts, context.tool_call_id
        )

    async def _send(
        self,
        name: str,
        client: Client,
        connection: ServerConnection,
        request: types.CallToolRequest,
        progress: ProgressFnT,
        token: CancellationToken,
    ) -> types.CallToolResult:
        try:
            return await client.session.send_request(
                request, types.CallToolResult, progress_callback=progress
            )
        except MCPError as exc:
            if _connection_lost(exc):
                connection.discard(client)
                detail = "its server stopped; it is restarted on the next call"
                raise _remote_failure(name, detail, retryable=True) from exc
            detail = "its server answered the call with an error"
            if exc.code:  # 0 is what a server's failing handler tends to send: no news
                detail += f" (code {exc.code})"
            raise _remote_failure(name, detail, retryable=False) from exc
        except ValidationError as exc:
            raise _remote_failure(name, "its server sent a malformed result", False) from exc
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            connection.discard(client)
            raise _remote_failure(name, "the connection to its server broke", True) from exc
        except anyio.get_cancelled_exc_class():
            # Timed out or cancelled (the SDK told the server). A server that does not
            # answer another request either is stuck: it is stopped, and the next call
            # starts it afresh instead of waiting out its timeout again. Not when the
            # runtime stops: no call comes next, and the server is stopped anyway.
            # The verdict is reached in the background: this call returns now.
            if not (self._closing or token.reason is ErrorCode.RUNTIME_STOPPED):
                connection.check_stuck(client)
            raise


async def _drop_if_stuck(client: Client, connection: ServerConnection) -> None:
    """Stop ``client``'s server if it does not answer within ``PING_TIMEOUT_S``."""
    with anyio.move_on_after(PING_TIMEOUT_S):
        try:
            # tools/list, not ping: every protocol version has it (ping is gone from
            # the newest), and any server that still serves answers it.
            await client.list_tools(cache_mode="bypass")
        except MCPError as exc:
            if not _connection_lost(exc):
                return  # an error is an answer: the server is alive
        except Exception:  # noqa: BLE001, S110 - no answer of any kind: the same verdict
            pass
        else:
            return
    # A connection closed meanwhile (the bridge is closing) is no server's fault.
    if connection.discard(client):
        _log.warning("MCP server %s is not answering; it is restarted", connection.config.name)


def _connection_lost(exc: MCPError) -> bool:
    """Whether ``exc`` is the SDK saying the connection is gone, not a server's answer.

    The SDK reports a lost connection with code CONNECTION_CLOSED (-32000), which many
    servers also send for any failure of theirs, so the code alone cannot tell. Its own
    reports carry no data and a message of its own: "Connection closed" from its
    dispatcher (once the transport ended, for a pending request, a later one or a write
    that failed; it tells its closed outcome from a peer's error by identity, which the
    MCPError it raises loses) and "SSE stream ..." from its HTTP transport when a
    response stream is lost. A server that sends such an error itself is saying that
    it is going away (the SDK's servers do when they shut down mid-request): taking it
    at its word only restarts that server.
    """
    if exc.code != types.CONNECTION_CLOSED or exc.data is not None:
        return False
    return exc.message == _SDK_CLOSED or exc.message.startswith(_SDK_STREAM_LOST)


def _identity(admission: Admission) -> dict[str, Any]:
    return {
        "server": admission.server.name,
        "tool": admission.remote_name[:200],
        "name": admission.name,
        "source": admission.server.source,
        "trust": str(admission.server.trust),
        "definitionHash": admission.pin_hash,
    }


class EndlessListing(Exception):
    """A server's tools/list still had a next page after `MAX_LIST_PAGES`."""


async def list_remote_tools(client: Client) -> list[dict[str, Any]]:
    """Every page of the server's tool list.

    Raises:
        EndlessListing: a paginator that never ends cannot hang admission, and a list
            cut short would be taken for the server's whole list.
    """
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        page = await client.list_tools(cursor=cursor, cache_mode="bypass")
        tools.extend(
            t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in page.tools
        )
        cursor = page.next_cursor
        if cursor is None:
            return tools
    raise EndlessListing


def _wire(tool: types.Tool) -> dict[str, Any]:
    return tool.model_dump(by_alias=True, mode="json", exclude_none=True)


def _innermost(exc: BaseException) -> BaseException:
    """The first exception at the bottom of the SDK's nested task-group errors."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _start_failure(config: ServerConfig, exc: BaseException) -> str:
    """Why ``config``'s server did not start, in a line for its operator.

    It may name host paths (the command, the cwd): it goes to the terminal and to
    ``ServerReport.error``; the model is only told that the server could not start.
    """
    exc = _innermost(exc)
    if isinstance(exc, TimeoutError):  # before OSError, its base class
        return f"it did not answer initialize within {config.start_timeout_s:g} s"
    if isinstance(exc, MCPError):
        if _connection_lost(exc):
            ended = "the connection closed" if config.url else "it exited or closed its stdout"
            return f"{ended} before it answered initialize"
        error = f"it answered initialize with an error: {_shown(exc.message)}"
        if exc.code == types.METHOD_NOT_FOUND:
            return f"it is not an MCP server ({error})"
        return f"{error} (code {exc.code})"
    if isinstance(exc, OSError) and not config.url:
        return _spawn_failure(config, exc)
    cause = _deepest_os_error(exc)
    if config.url and cause is not None:
        return f"could not connect to URL {config.describe()} ({_network_problem(cause)})"
    if isinstance(exc, ToolkernelError):
        return str(exc)[:300] or type(exc).__name__
    detail = _shown(str(exc))
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def _spawn_failure(config: ServerConfig, exc: OSError) -> str:
    if config.cwd is not None and str(exc.filename) == str(config.cwd):  # may be a Path
        problem = {
            FileNotFoundError: "does not exist",
            NotADirectoryError: "is not a directory",
        }.get(type(exc), f"cannot be entered ({exc.strerror})")
        return f"cwd '{config.cwd}' {problem}"
    command = exc.filename or (config.command[0] if config.command else "?")
    if isinstance(exc, FileNotFoundError):
        return f"command '{command}' not found"
    if isinstance(exc, PermissionError):
        return f"command '{command}' is not executable"
    return f"command '{command}' could not be run ({exc.strerror or exc})"


def _deepest_os_error(exc: BaseException) -> OSError | None:
    """The innermost OSError behind ``exc`` (an HTTP client's ConnectError wraps one)."""
    found: OSError | None = None
    seen: BaseException | None = exc
    for _ in range(20):  # a cycle of causes cannot loop forever
        if seen is None:
            break
        if isinstance(seen, OSError):
            found = seen
        seen = seen.__cause__ or seen.__context__
    return found


def _network_problem(error: OSError) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, socket.gaierror):
        return "host not found"
    return _shown(error.strerror or str(error)) or type(error).__name__


def _listing_failure(config: ServerConfig, exc: Exception) -> str:
    if isinstance(exc, TimeoutError):
        return f"it did not answer within {config.start_timeout_s:g} s"
    if isinstance(exc, EndlessListing):
        return f"its tools/list did not end after {MAX_LIST_PAGES} pages"
    if isinstance(exc, MCPError):
        if _connection_lost(exc):
            return "the connection closed"
        return f"it answered with an error: {_shown(exc.message)} (code {exc.code})"
    return "it sent a malformed tools/list result"


def _remote_failure(tool: str, detail: str, retryable: bool) -> ToolFailed:
    advice = _RETRY_ADVICE if retryable else _NO_RETRY_ADVICE
    return ToolFailed(
        safe_message(ErrorCode.REMOTE_ERROR, tool=tool, detail=detail, advice=advice),
        code=ErrorCode.REMOTE_ERROR,
        retryable=retryable,
    )


def _to_output(
    result: types.CallToolResult,
    tool: str,
    structured: bool,
    store: ArtifactStore,
    producer: str,
) -> ToolOutput:
    """A CallToolResult as the kernel's output: content items, artifacts for binaries."""
    refs: list[ArtifactRef] = []
    items = [_content_item(block, tool, store, producer, refs) for block in result.content]
    if result.is_error:
        raise ToolFailed(
            safe_message(
                ErrorCode.TOOL_ERROR,
                tool=tool,
                detail="the remote tool reported an error; its output says why.",
            ),
            code=ErrorCode.TOOL_ERROR,
            output={"content": items},
            artifacts=refs,
        )
    if structured:
        if result.structured_content is None:
            raise ToolFailed(
                safe_message(ErrorCode.OUTPUT_CONTRACT_VIOLATION, tool=tool),
                code=ErrorCode.OUTPUT_CONTRACT_VIOLATION,
            )
        return ToolOutput(result.structured_content, artifacts=tuple(refs))
    data: dict[str, Any] = {"content": items}
    if result.structured_content is not None:
        data["structuredContent"] = result.structured_content
    return ToolOutput(data, artifacts=tuple(refs))


_MEDIA_TYPE: Final = re.compile(r"[a-z]{1,20}/[a-z0-9][a-z0-9.+-]{0,80}", re.ASCII)


def _content_item(
    block: Any, tool: str, store: ArtifactStore, producer: str, refs: list[ArtifactRef]
) -> dict[str, Any]:
    def keep(encoded: str, declared: str, kind: str) -> dict[str, Any]:
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            return {"type": kind, "error": "undecodable base64 data was dropped"}
        # The artifact's type is shown to the model as is: only a plain type/subtype
        # is believed (no parameters, nothing that could carry text to the model).
        plain = declared.strip().lower()
        media_type = plain if _MEDIA_TYPE.fullmatch(plain) else "application/octet-stream"
        ref = store.put(
            data, media_type=media_type, description=f"{kind} from {tool}", producer=producer
        )
        refs.append(ref)
        return {"type": kind, "artifact": ref.id, "mimeType": media_type, "size": ref.size}

    if isinstance(block, types.TextContent):
        return {"type": "text", "text": block.text}
    if isinstance(block, types.ImageContent | types.AudioContent):
        return keep(block.data, block.mime_type, block.type)
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        mime = resource.mime_type or "application/octet-stream"
        if isinstance(resource, types.BlobResourceContents):
            return {**keep(resource.blob, mime, "resource"), "uri": str(resource.uri)}
        return {
            "type": "resource",
            "uri": str(resource.uri),
            "mimeType": mime,
            "text": resource.text,
        }
    if isinstance(block, types.ResourceLink):
        return {"type": "resource_link", "uri": str(block.uri), "name": block.name}
    return {"type": str(getattr(block, "type", "unknown")), "note": "content type not bridged"}


def _off_allowlist(admission: Admission) -> bool:
    return [reason.rule for reason in admission.reasons] == ["ALLOWLIST"]


def _why(admission: Admission) -> str:
    return _shown("; ".join(f"{r.rule}: {r.message}" for r in admission.reasons))


def _shown(text: str) -> str:
    """Text from a server, cut and made safe to print on a terminal."""
    return safe_field(text, 200)

"""The kernel: the one place where the pipeline order is written out.

::

    TOOL_CALL_REQUEST (always)
    → registry lookup          unknown / not exposed        → DENIED
    → argument parsing + size  malformed / too large        → INVALID_ARGUMENTS
    → validation               schema, then path guard      → INVALID_ARGUMENTS
    → authorization            scope, profile, state, paths, network, budget, rate
                                                            → DENIED
    → idempotency              repeated key                 → the recorded result
    → approval (if asked)      APPROVAL_REQUESTED → GRANTED / DENIED
    → TOOL_CALL_STARTED
    → dispatch                 adapter by execution mode, timeout, token, retry
    → TOOL_CALL_PROGRESS*
    → normalize → artifactize → redact
    → TOOL_CALL_RESULT

A refused call gets a REQUEST and a RESULT and never a STARTED. Events of one call
are written in as few transactions as the order allows: REQUEST with STARTED (or with
the refusal's RESULT), and the approval request on its own before a human is asked.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import importlib.util
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import nullcontext, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from types import MappingProxyType, ModuleType, TracebackType
from typing import Any, Final, Self

import anyio
import anyio.to_thread
import sniffio

from toolkernel.approval import ApprovalDecision, ApprovalRequest, Approver, ask
from toolkernel.arguments import ArgumentsRejected, parse_arguments
from toolkernel.artifacts import ArtifactStore
from toolkernel.calls import (
    ToolCallRequest,
    ToolCallResult,
    Usage,
    new_id,
    timestamp,
)
from toolkernel.canonical import utf8_text
from toolkernel.claims import KeyClaims
from toolkernel.codes import ErrorCode, Status, safe_field, safe_message
from toolkernel.config import CONFIG_FILENAME, Config, load_config
from toolkernel.context import RunContext, ToolContext
from toolkernel.definition import ConcurrencyGroup, ExecutionMode, ToolDefinition
from toolkernel.dispatch import (
    Adapter,
    Invocation,
    NativeAdapter,
    Outcome,
    current_traceback,
    dispatch,
)
from toolkernel.errors import (
    ConfigError,
    DefinitionError,
    LedgerCorrupted,
    LedgerError,
    ProcessStopped,
    UsageError,
)
from toolkernel.exposure import select_exposed, why_hidden
from toolkernel.functions import FunctionTool
from toolkernel.ledger import (
    Event,
    EventType,
    GroupCommitLedger,
    Ledger,
    NewEvent,
    SqliteLedger,
)
from toolkernel.normalize import DEFAULT_CHAIN, Finishing, Processor, redaction_notices
from toolkernel.pathguard import GuardedPath, PathGuard
from toolkernel.policy import Decision, authorize, rate_keys
from toolkernel.providers.names import provider_name
from toolkernel.redaction import Redactor
from toolkernel.registry import RegisteredTool, Registry
from toolkernel.replay import RecordedResults
from toolkernel.run import Run, ToolCall, check_run_id
from toolkernel.state import check_placement, mark_state, state_globs
from toolkernel.terminal import printable
from toolkernel.tracing import record_tool_span
from toolkernel.validation import ValidationResult, Violation, validate

__all__ = ["ApprovalCheck", "ArgumentCheck", "Kernel", "ProgressListener", "open_ledger"]

# One span per call when OpenTelemetry is installed (the `tracing` extra); else nothing.
_TRACE = record_tool_span if importlib.util.find_spec("opentelemetry") else None

ProgressListener = Callable[[str, float, float | None, str | None], None]
"""Called with (tool call id, progress, total, message) as a tool reports progress, on
the tool's own thread (a worker thread for a sync tool), with the message redacted. An
exception it raises is logged and does not touch the call."""

ArgumentCheck = Callable[[Mapping[str, Any]], Violation | None]
"""A tool's own semantic check, run after its schema and the path guard passed."""

ApprovalCheck = Callable[[Mapping[str, Any]], Sequence[str]]
"""Reasons a human must approve this particular call (empty: none of its own)."""

_SANDBOXED = frozenset(
    {ExecutionMode.SANDBOX_READ_ONLY, ExecutionMode.SANDBOX_WRITE, ExecutionMode.PROCESS}
)
_RECORDABLE = frozenset({Status.SUCCEEDED, Status.PARTIAL, Status.FAILED})
_MAX_PROGRESS_EVENTS: Final = 1000  # per call; later reports reach the listener only
_MAX_PROGRESS_MESSAGE: Final = 1000  # characters of a progress message that are kept
_log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Inflight:
    """A call with an idempotency key that is running now; duplicates wait for it.

    Duplicates may come from another thread's event loop (``call_sync`` in threads):
    those wait on ``settled``, as ``done`` can only wake its own loop.
    """

    arguments_hash: str
    done: anyio.Event = field(default_factory=anyio.Event)
    settled: threading.Event = field(default_factory=threading.Event)
    thread: int = field(default_factory=threading.get_ident)
    result: ToolCallResult | None = None
    owner: str | None = None  # the key's claim in the ledger, while the call runs

    async def wait(self) -> None:
        if threading.get_ident() == self.thread:
            await self.done.wait()
        elif not self.settled.is_set():
            await anyio.to_thread.run_sync(self.settled.wait, abandon_on_cancel=True)

    def settle(self, result: ToolCallResult) -> None:
        """Called in the thread that made the entry, whose loop ``done`` belongs to."""
        self.result = result
        self.settled.set()
        self.done.set()


@dataclass(slots=True)
class _Admitted:
    """A call that passed every check and has its STARTED event written."""

    request: ToolCallRequest
    tool: RegisteredTool
    decision: Decision
    inflight: _Inflight | None
    progress: list[NewEvent] = field(default_factory=list)
    progress_dropped: int = 0  # reports past _MAX_PROGRESS_EVENTS
    started_at: str | None = None
    started: NewEvent | None = None  # its STARTED, taken back if it never starts


@dataclass(slots=True)  # not frozen: made once per call, and frozen init costs twice
class _Finished:
    """A dispatched call's result and its events (PROGRESS, RESULT), to write in order."""

    result: ToolCallResult
    events: list[NewEvent]


@dataclass(slots=True)
class _Duplicate:
    """A call whose idempotency key is already running: it waits, then shares the result.

    With ``in_batch`` the original is an earlier call of the same batch: waiting for it
    would wait for the batch itself; its result is there when this one is concluded.
    """

    request: ToolCallRequest
    inflight: _Inflight
    in_batch: bool = False
    cancelled: ErrorCode | None = None  # cancelled while it waited: it shares nothing


_Admission = _Admitted | _Duplicate | ToolCallResult


class _Journal:
    """The events of one batch, in model order, written in as few transactions as the
    pipeline allows: ``flush`` where something must be on disk before it happens (a
    human is asked, a call that can change things starts), and at the end."""

    def __init__(
        self,
        ledger: Ledger,
        run_id: str,
        inflight: dict[tuple[str, str], _Inflight],
        claims: KeyClaims,
    ) -> None:
        self._ledger = ledger
        self._claims = claims
        self._run_id = run_id
        self._events: list[NewEvent] = []
        self.call_ids: list[str] = []  # the calls of this batch, for cleanup
        # REQUEST payloads without a RESULT yet. A RESULT closes the latest REQUEST of its
        # id: only a refused repeat shares an open id, and its RESULT follows at once.
        self._open: dict[str, list[Mapping[str, Any]]] = {}
        # The kernel's running idempotency keys, and those this batch holds (duplicates
        # wait on them): released with a result even when the batch is interrupted.
        self._inflight = inflight
        self.held: list[tuple[ToolCallRequest, _Inflight]] = []

    def write(self, events: Iterable[NewEvent]) -> None:
        for event in events:
            if event.type is EventType.TOOL_CALL_REQUEST and event.tool_call_id:
                self._open.setdefault(event.tool_call_id, []).append(event.payload)
            elif event.type is EventType.TOOL_CALL_RESULT and event.tool_call_id:
                stored = self._open.get(event.tool_call_id)
                if stored:
                    stored.pop()
            self._events.append(event)

    def conclude_interrupted(self, exc: BaseException) -> None:
        """A RESULT for each call of the batch that has a REQUEST and none yet, so that
        the ledger does not end mid-call: CANCELLED/USER_CANCELLED when the caller was
        cancelled or interrupted (Ctrl-C) while the call was admitted or ran,
        CANCELLED/RUNTIME_STOPPED when the process was told to stop (SIGTERM),
        FAILED/LEDGER_UNAVAILABLE when the ledger could not store (as the caller is
        told), FAILED/INTERNAL_ERROR when the pipeline itself failed otherwise."""
        if isinstance(exc, LedgerError):
            code = ErrorCode.LEDGER_UNAVAILABLE
        elif not isinstance(exc, KeyboardInterrupt | anyio.get_cancelled_exc_class()):
            code = ErrorCode.INTERNAL_ERROR
        elif isinstance(exc, ProcessStopped) or ProcessStopped.underway:
            code = ErrorCode.RUNTIME_STOPPED
        else:
            code = ErrorCode.USER_CANCELLED
        unfinished = [(i, p) for i, payloads in self._open.items() for p in payloads]
        for call_id, stored in unfinished:
            request = ToolCallRequest(
                call_id,
                self._run_id,
                str(stored.get("toolName", "")),
                None,
                str(stored.get("argumentsHash", "")),
                tool_version=stored.get("toolVersion"),
                idempotency_key=stored.get("idempotencyKey"),
            )
            result = ToolCallResult.from_code(call_id, code, tool=request.tool_name)
            payload = _result_payload(request, result, request.tool_version)
            payload["internal"] = {"interrupted": type(exc).__name__}
            self.write([NewEvent(EventType.TOOL_CALL_RESULT, payload, call_id, plain=True)])
        for request, entry in self.held:
            if not entry.settled.is_set():
                result = ToolCallResult.from_code(
                    request.tool_call_id, code, tool=request.tool_name
                )
                _settle(self._inflight, request, entry, result)

    def release_keys(self) -> None:
        """Free the idempotency keys this batch claimed, once their results are stored
        (until then a duplicate finds the entry, not a missing index). The claims in
        the ledger, which other processes see, are let go only if everything was
        stored: otherwise they run out with their lease."""
        for request, entry in self.held:
            _release(self._inflight, request, entry)
            if entry.owner is not None and self._events:  # not stored: left to lapse
                self._claims.abandon(request.tool_name, str(request.idempotency_key), entry.owner)
            elif entry.owner is not None:
                try:
                    self._claims.release(
                        request.tool_name, str(request.idempotency_key), entry.owner
                    )
                except LedgerError as exc:
                    _log.warning("an idempotency key stays claimed until its lease ends: %s", exc)

    def withdraw(self, event: NewEvent) -> bool:
        """Take back an event not stored yet (what it says did not happen); False when
        it was stored already."""
        kept = [pending for pending in self._events if pending is not event]
        taken = len(kept) < len(self._events)
        self._events = kept
        return taken

    def restamp(self, started: NewEvent, at: str) -> NewEvent | None:
        """A STARTED not stored yet, in its place, with ``startedAt`` set to ``at``;
        None when it was stored already."""
        for position, event in enumerate(self._events):
            if event is started:
                fresh = replace(started, payload={**started.payload, "startedAt": at})
                self._events[position] = fresh
                return fresh
        return None

    @property
    def pending(self) -> bool:
        """Whether events are waiting for a flush (one that failed puts them back)."""
        return bool(self._events)

    def flush(self, *, durable: bool = False) -> None:
        """Hand the events to the ledger; with ``durable``, wait until they are stored."""
        if self._events:
            events, self._events = self._events, []
            # append_batch: one transaction, like append, without returning the stored
            # events, which building cost more than the rest of the append's Python.
            try:
                if durable:
                    self._ledger.append_durable([(self._run_id, events)])
                else:
                    self._ledger.append_batch([(self._run_id, events)])
            except LedgerError as exc:
                if not exc.maybe_stored:  # nothing was stored: a later flush tries again
                    self._events[:0] = events
                raise
            except BaseException:
                self._events[:0] = events
                raise
        elif durable:
            self._ledger.sync()


class Kernel:
    """The governed tool-call path. Every call goes through ``call`` or ``call_many``.

    Args:
        config: the runtime configuration; defaults to ``Config.default()``.
        ledger: where events go; defaults to the SQLite ledger the config names.
        approver: decides calls that need approval; without one they are DENIED.
        adapters: extra or replacement adapters by execution mode.
        builtins: register ``memory.read`` and ``policy.explain``.
        workspace_tools: register the workspace tools (``repo.search``, ``file.read``,
            ``file.patch``, ``shell.run``, ``verifier.run``, ``artifact.read``) and the
            sandbox adapter they run under.
        recorded: serve recorded results instead of running tools (replay).
        processors: the post-dispatch chain (normalize → artifactize → redact).
    """

    def __init__(
        self,
        config: Config | None = None,
        *,
        ledger: Ledger | None = None,
        approver: Approver | None = None,
        adapters: Mapping[ExecutionMode, Adapter] | None = None,
        builtins: bool = True,
        workspace_tools: bool = True,
        recorded: RecordedResults | None = None,
        processors: Sequence[Processor] = DEFAULT_CHAIN,
        secrets: Iterable[str] = (),
    ) -> None:
        self.config = config or Config.default()
        self.registry = Registry()
        check_placement(self.config)
        self.guard = PathGuard(
            self.config.workspace,
            forbidden=(*self.config.forbidden_paths, *state_globs(self.config)),
        )
        self.ledger = ledger or open_ledger(self.config)
        mark_state(self.config)
        self.approver = approver
        self.redactor = Redactor(self.guard.workspace, secrets)
        # The secrets it knows are masked in what the store keeps: artifacts outlive them.
        self.artifacts = ArtifactStore(
            self.config.state_dir / "artifacts",
            redactor=self.redactor,
            max_bytes=self.config.artifacts_max_bytes,
        )
        # [sandbox] secret_env values are in this process's environment, where any tool
        # or bridged server can read them: masked from the start, workspace tools or not.
        for name in self.config.sandbox.get("secret_env", ()):
            if os.environ.get(name):
                self.redactor.add_secret(os.environ[name])
        self._native = NativeAdapter()
        self.adapters: dict[ExecutionMode, Adapter] = {ExecutionMode.NATIVE: self._native}
        self.adapters.update(adapters or {})
        self.recorded = recorded
        self.processors = tuple(processors)
        self._inflight: dict[tuple[str, str], _Inflight] = {}
        self._inflight_lock = threading.Lock()  # runs on other threads' loops share it
        self._claims = KeyClaims(self.ledger)  # the same keys, across processes
        self._generation = 0
        # Runs with calls in flight (batches per run), so that close() can stop them and
        # close the ledger after their results are recorded.
        self._batches_lock = threading.Lock()
        self._batches: dict[Run, tuple[int, int]] = {}  # batches in flight, their thread
        self._closing = False
        self._withdrawn: dict[str, str] = {}  # name -> why it was withdrawn (unregister)
        self._tool_listeners: list[Callable[[], None]] = []
        self._provider_names: dict[str, str] = {}  # provider spelling -> tool name
        # (run id, call id) -> time.time_ns() it arrived: ids are unique within a run only
        self._received: dict[tuple[str, str], int] = {}
        self._argument_checks: dict[str, ArgumentCheck] = {}
        # The configuration that governs this kernel, and where the next one would be
        # looked for: no tool writes either (a model must not rewrite its own policy).
        self.policy_files = frozenset(
            path.resolve()
            for path in (self.config.source, self.config.workspace / CONFIG_FILENAME)
            if path is not None
        )
        self._approval_checks: dict[str, ApprovalCheck] = {}
        if builtins:
            from toolkernel.builtins import BUILTIN_TOOLS

            for builtin in BUILTIN_TOOLS:
                self.register(builtin)
        if workspace_tools:
            from toolkernel.tools import install

            install(self)
        # The tool code the configuration loads from the workspace (``tools.modules``
        # and ``tools.definitions``): it runs, or says what may run, on the host at the
        # next start, so no tool writes it and commands see it read-only.
        self.host_code: frozenset[Path] = frozenset()
        self._load_configured_tools()

    @classmethod
    def from_config(
        cls, path: Path | None = None, *, workspace: Path | None = None, **kwargs: Any
    ) -> Kernel:
        """A kernel for ``toolkernel.toml`` at ``path`` (or the defaults)."""
        return cls(load_config(path, workspace=workspace), **kwargs)

    # -- tools and exposure -------------------------------------------------------

    def register(
        self,
        tool: FunctionTool | ToolDefinition | Mapping[str, Any],
        handler: Callable[..., Any] | None = None,
        **kwargs: Any,
    ) -> RegisteredTool:
        """Register a tool (see ``Registry.register``).

        Raises:
            DefinitionError: the definition is invalid, or its name spelled the way
                OpenAI and Anthropic accept (``repo.search`` → ``repo__search``) is
                already taken by another tool.
        """
        registered = self.registry.register(tool, handler, **kwargs)
        name = registered.name
        spelled = provider_name(name)
        other = self._provider_names.setdefault(spelled, name)
        if other != name:
            self.registry.unregister(name, registered.definition.version)
            raise DefinitionError(
                name, "name", f"collides with '{other}' as provider tool name '{spelled}'"
            )
        self._withdrawn.pop(name, None)
        self._tools_changed()
        return registered

    def unregister(self, name: str, version: str | None = None, *, reason: str = "") -> None:
        """Withdraw a tool (one version, or all): it is neither shown nor callable.

        With a ``reason`` (whole sentences, for the model), a call of the withdrawn
        name is DENIED/POLICY_DENIED saying why, instead of UNKNOWN_TOOL, until a tool
        of that name is registered again.
        """
        existed = self.registry.find(name) is not None
        self.registry.unregister(name, version)
        if existed and self.registry.find(name) is None:
            if reason:
                self._withdrawn[name] = reason
            spelled = provider_name(name)
            if self._provider_names.get(spelled) == name:  # free for another tool now
                del self._provider_names[spelled]
        self._tools_changed()

    def withhold(self, name: str, reason: str) -> None:
        """Say why there is no tool ``name`` (a bridged tool whose new definition awaits
        review, say): a call of it is DENIED/POLICY_DENIED with ``reason`` (whole
        sentences, for the model) instead of UNKNOWN_TOOL, until a tool of that name is
        registered. A registered tool is left alone (``unregister`` withdraws one)."""
        if self.registry.find(name) is None:
            self._withdrawn[name] = reason

    def on_tools_changed(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` each time a tool is registered or withdrawn (in the thread
        that changed it); returns the function that stops it."""
        self._tool_listeners.append(listener)
        return lambda: self._tool_listeners.remove(listener)

    def _tools_changed(self) -> None:
        self._generation += 1
        for listener in list(self._tool_listeners):
            listener()

    def add_checks(
        self,
        tool_name: str,
        *,
        arguments: ArgumentCheck | None = None,
        approval: ApprovalCheck | None = None,
    ) -> None:
        """Attach a tool's own checks: ``arguments`` runs in validation (its violation
        makes the call INVALID_ARGUMENTS), ``approval`` in authorization (its reasons
        hold the call for approval). ``shell.run``'s command policy uses both."""
        if arguments is not None:
            self._argument_checks[tool_name] = arguments
        if approval is not None:
            self._approval_checks[tool_name] = approval

    def start_run(self, context: RunContext | None = None, **fields: Any) -> Run:
        """Begin a run; unspecified context fields come from the configuration.

        Raises:
            UsageError: the run id is not 1-128 letters, digits and ``._:@-``, or a
                state, the profile or the write scope is not one this kernel knows.
        """
        run_id = context.run_id if context is not None else fields.get("run_id")
        if run_id is not None:
            check_run_id(run_id)
        if context is None:
            defaults = {
                "run_id": new_id("run"),
                "run_state": self.config.run_state,
                "profile": self.config.profile,
                "verification": self.config.verification,
            }
            context = RunContext(**{**defaults, **fields})
        check_profile = self.config.policy.check_profile
        check_profile(context.profile)
        run = Run(
            context,
            max_parallel_reads=self.config.max_parallel_reads,
            check_profile=check_profile,
        )
        if run_id is not None:  # maybe a run continued from an earlier process
            self._restore_spending(run)
        return run

    def _restore_spending(self, run: Run) -> None:
        """The calls a continued run already started count against its budget and rate
        limits (at the costs the configuration gives now)."""
        policy = self.config.policy
        budget = policy.budget
        if budget.max_cost is None and budget.max_calls is None and not policy.rate_limits:
            return
        now = time.time()
        started = sorted(  # by start: a READ_ONLY call's STARTED is stored with its RESULT
            (
                _epoch_s(event.payload.get("startedAt"), default=now),
                str(event.payload.get("toolName")),
            )
            for event in self.ledger.events(run.id)
            if event.type is EventType.TOOL_CALL_STARTED
        )
        for at, name in started:
            run.meter.charge(name, budget.cost_of(name), rate_keys(policy, name), ago_s=now - at)

    def list_available(self, ctx: RunContext) -> list[ToolDefinition]:
        """The tools a run in ``ctx`` may see now (no ledger event; see ``expose``)."""
        profiles = self.config.policy.profiles
        if ctx.profile not in profiles:
            return []  # an unknown profile grants nothing: fail closed
        definitions = (tool.definition for tool in self.registry.latest())
        return select_exposed(definitions, self.config.exposure, ctx, profiles[ctx.profile])

    def exposure_report(self, ctx: RunContext) -> list[tuple[ToolDefinition, str | None]]:
        """Every registered tool (newest version) with why a run in ``ctx`` is not
        shown it, or ``None`` for the tools ``list_available`` gives."""
        definitions = [tool.definition for tool in self.registry.latest()]
        granted = self.config.policy.profiles.get(ctx.profile)
        if granted is None:
            return [(d, f"profile {ctx.profile} is not defined") for d in definitions]
        return [(d, why_hidden(d, self.config.exposure, ctx, granted)) for d in definitions]

    def expose(self, run: Run) -> list[ToolDefinition]:
        """Show the run's tools to the model: returns them and records TOOLS_EXPOSED."""
        definitions = self.list_available(run.context)
        fresh = {d.hash: d.to_dict() for d in definitions if d.hash not in run.shown_hashes}
        payload = {
            "context": run.context.to_dict(),
            "tools": [{"name": d.name, "version": d.version, "hash": d.hash} for d in definitions],
            "definitions": fresh,
        }
        self.ledger.append(run.id, [NewEvent(EventType.TOOLS_EXPOSED, payload)])
        run.shown_hashes.update(fresh)
        run.exposed = {d.name: d.version for d in definitions}
        return definitions

    # -- calls --------------------------------------------------------------------

    async def call(
        self,
        run: Run,
        tool_name: str,
        arguments: str | bytes | Mapping[str, Any] | None = None,
        *,
        on_progress: ProgressListener | None = None,
        approver: Approver | None = None,
        **fields: Any,
    ) -> ToolCallResult:
        """Propose one call and return its result (never raises for a bad proposal).

        ``approver`` decides this call's approval instead of the kernel's ``approver``
        (for example the user of the session the call came from). A call the ledger
        cannot record is FAILED/LEDGER_UNAVAILABLE (retryable); why is logged.
        """
        call = ToolCall(tool_name, arguments, **fields)
        exclusive = _is_exclusive(self.registry, run, call)
        try:
            results = await self._run_batch(run, [call], exclusive, on_progress, approver)
        except LedgerError as exc:
            return _unrecorded([call], exc)[0]
        return results[0]

    async def call_many(
        self,
        run: Run,
        calls: Sequence[ToolCall],
        *,
        on_progress: ProgressListener | None = None,
        approver: Approver | None = None,
    ) -> list[ToolCallResult]:
        """Run one model turn's calls under the concurrency rules; results in order.

        Consecutive READ_ONLY calls run in parallel (bounded by ``max_parallel_reads``);
        every other call runs alone. The ledger follows the model's order. ``approver``
        as in ``call``. Once the ledger cannot record a segment's calls, they and the
        calls after them are FAILED/LEDGER_UNAVAILABLE, as in ``call``.
        """
        results: list[ToolCallResult] = []
        # An id repeated in the turn, or open in another turn of the run, is refused even
        # when the segments run one after the other and the first call with it is long
        # finished. The turn's ids are the kernel's from now: cancel_call reaches a call
        # of a later segment too.
        seen: set[str] = set()
        repeats: set[int] = set()
        for position, call in enumerate(calls):
            if call.tool_call_id in seen or (call.tool_call_id and run.has_call(call.tool_call_id)):
                repeats.add(position)
            elif call.tool_call_id:
                seen.add(call.tool_call_id)
        self._enter(run)  # the whole turn: a close meanwhile stops its later segments too
        for call_id in seen:
            run.proposed(call_id)
        pending = set(seen)  # ids of segments still to run (once run, they are free)
        offset = 0
        try:
            for exclusive, batch in _segments(self.registry, run, calls):
                repeated = {position - offset for position in repeats}
                try:
                    results.extend(
                        await self._run_batch(
                            run, batch, exclusive, on_progress, approver, repeated, owned=seen
                        )
                    )
                except LedgerError as exc:
                    # The calls after it never ran: recorded if the ledger can, as the
                    # caller is told of them all.
                    self._record_unstarted(run, calls[offset + len(batch) :], exc)
                    results.extend(_unrecorded(calls[offset:], exc))
                    break
                except BaseException as exc:
                    self._record_unstarted(run, calls[offset + len(batch) :], exc)
                    raise
                finally:
                    pending.difference_update(call.tool_call_id for call in batch)
                offset += len(batch)
        finally:
            # A segment that never ran leaves nothing behind; an id a finished segment
            # freed may be another turn's by now, and is not touched.
            for call_id in pending:
                run.finished(call_id)
            self._leave(run)
        return results

    def call_sync(
        self,
        run: Run,
        tool_name: str,
        arguments: str | bytes | Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> ToolCallResult:
        """``call`` for synchronous programs (starts an event loop per call).

        A run's concurrency gate belongs to one event loop at a time: threads that call
        ``call_sync`` at the same time need a run each (``start_run`` per thread).
        A tool that calls the kernel on its own run gets UsageError (the call would
        wait for itself); a nested call needs a run of its own.

        Raises:
            UsageError: called where an event loop runs (``await kernel.call`` there).
        """
        outside_event_loop("call_sync", "await kernel.call(...)")
        return anyio.run(lambda: self.call(run, tool_name, arguments, **fields))

    def close(self) -> None:
        """Close the kernel: no call starts after this. Calls in flight are cancelled
        (CANCELLED/RUNTIME_STOPPED) and their results recorded; the ledger is closed
        when the last of them has finished, at once when none is running.
        Closing twice is harmless."""
        with self._batches_lock:
            if self._closing:
                return
            self._closing = True
            running = list(self._batches)
        for run in running:
            run.cancel(ErrorCode.RUNTIME_STOPPED)
        if not running:
            self._shut_down()

    def _shut_down(self) -> None:
        try:
            self._native.close()
            self._claims.close()
        finally:
            self.ledger.close()

    def _enter(self, run: Run) -> None:
        """Count a batch (or a turn) of ``run`` in flight: close() waits for it."""
        thread = threading.get_ident()
        with self._batches_lock:
            active = self._batches.get(run)
            if self._closing and active is None:  # a turn already in flight goes on
                raise UsageError("the kernel is closed; calls go to a kernel that is open")
            if active is not None and active[1] != thread:
                # Its gate belongs to the event loop of that thread: this call would
                # wait on it forever.
                raise UsageError(
                    f"run {run.id} has calls in flight in another thread; a run belongs to "
                    "one event loop at a time: give each thread a run of its own "
                    "(kernel.start_run())"
                )
            self._batches[run] = (active[0] + 1 if active else 1, thread)

    def _leave(self, run: Run) -> None:
        """The end of what ``_enter`` counted; the last one out of a closing kernel
        closes the ledger (a failure there is logged: the calls' results stand)."""
        with self._batches_lock:
            count, thread = self._batches[run]
            if count > 1:
                self._batches[run] = (count - 1, thread)
            else:
                del self._batches[run]
            last = self._closing and not self._batches
        if last:
            try:
                self._shut_down()
            except Exception:  # noqa: BLE001 - close() has returned; nobody else to tell
                _log.exception("closing the kernel after its last call failed")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def _run_batch(
        self,
        run: Run,
        batch: Sequence[ToolCall],
        exclusive: bool,
        on_progress: ProgressListener | None,
        approver: Approver | None = None,
        repeats: Collection[int] = (),
        *,
        owned: Collection[str] = (),
    ) -> list[ToolCallResult]:
        """The calls of one segment; ``owned`` are ids its turn already holds in the run."""
        running = _RUNNING.get()
        while running is not None:  # up the chain of calls (run None: that one ended)
            if running.run is run:
                raise UsageError(
                    "a tool called the kernel on a run it is running in, which would wait "
                    "for itself; give the nested call a run of its own (kernel.start_run())"
                )
            running = running.outer
        # A ledger known not to take events now (group commit waiting to store its
        # queue) refuses the calls before any runs: their events could not be kept.
        self.ledger.check_writable()
        self._enter(run)
        try:
            # An id already open in the run would make its calls indistinguishable (in the
            # ledger, to cancel_call): a repeat is refused, the first keeps the id.
            named: list[str] = []
            repeated = set(repeats)
            for index, call in enumerate(batch):
                if index in repeated:
                    continue
                if call.tool_call_id and (
                    call.tool_call_id in named
                    or (call.tool_call_id not in owned and run.has_call(call.tool_call_id))
                ):
                    repeated.add(index)
                elif call.tool_call_id:
                    named.append(call.tool_call_id)
                    run.proposed(call.tool_call_id)  # cancellable while it waits its turn
            try:
                await run.gate.acquire(exclusive)
            except BaseException as exc:
                for call_id in named:  # never admitted: nothing of them is kept
                    run.finished(call_id)
                self._record_unstarted(run, batch, exc)
                raise
            journal = _Journal(self.ledger, run.id, self._inflight, self._claims)
            results: list[ToolCallResult] | None = None
            unstored: LedgerError | None = None
            try:
                admissions: list[_Admission] = []
                for index, call in enumerate(batch):
                    if index in repeated:  # the id is the open call's: nothing of it changes
                        admissions.append(self._refuse_repeated_id(run, call, journal))
                        continue
                    admission = await self._admit(run, call, journal, approver, exclusive)
                    if isinstance(admission, ToolCallResult):  # refused: nothing to cancel
                        run.concluded(admission.tool_call_id)
                    admissions.append(admission)
                finished: list[_Finished | None] = [None] * len(admissions)
                pending = [
                    (i, a) for i, a in enumerate(admissions) if not isinstance(a, ToolCallResult)
                ]
                if len(pending) == 1:
                    await self._run_admitted(run, *pending[0], finished, on_progress, journal)
                elif pending:
                    async with anyio.create_task_group() as group:
                        for index, admitted in pending:
                            group.start_soon(
                                self._run_admitted,
                                run,
                                index,
                                admitted,
                                finished,
                                on_progress,
                                journal,
                            )
                results = [
                    self._conclude(run, admission, finished[i], journal)
                    for i, admission in enumerate(admissions)
                ]
                # The result of a call that changed something is stored before it returns.
                journal.flush(durable=exclusive)
            except BaseException as exc:
                journal.conclude_interrupted(exc)
                if results is None or not isinstance(exc, LedgerError) or exc.maybe_stored:
                    raise
                # Only storing the decided results failed (another process held the
                # lock, say): the flush below tries once more, and if it stores them,
                # they are the calls' results, not an error.
                unstored = exc
            finally:
                try:
                    # What was decided before an error is still recorded.
                    journal.flush(durable=exclusive and unstored is not None)
                finally:
                    if journal.held:
                        journal.release_keys()  # their results are in the ledger now
                    run.gate.release(exclusive)
                    for call_id in journal.call_ids:  # calls a cancellation cut short too
                        self._received.pop((run.id, call_id), None)
                    for call_id in (*journal.call_ids, *named):
                        run.finished(call_id)
            if unstored is not None and journal.pending:
                raise unstored
            assert results is not None  # set, or the try above raised
            return results
        finally:
            self._leave(run)

    async def _run_admitted(
        self,
        run: Run,
        index: int,
        admitted: _Admitted | _Duplicate,
        finished: list[_Finished | None],
        on_progress: ProgressListener | None,
        journal: _Journal,
    ) -> None:
        """Execute and finish an admitted call into ``finished[index]``; a duplicate of
        a key running in another batch waits for that call instead."""
        if isinstance(admitted, _Duplicate):
            if not admitted.in_batch:
                admitted.cancelled = await _await_original(run, admitted)
            return
        if not run.take_read_slot():
            stopped = await _wait_read_slot(run, admitted, journal)
            if stopped is not None:
                finished[index] = self._finish(admitted, stopped)
                return
        try:
            outcome = await self._execute(run, admitted, on_progress)
        finally:
            run.reads.release()
        # Finished at once, not with the batch: a duplicate of its key that waits in
        # another batch may be what that batch waits for.
        finished[index] = self._finish(admitted, outcome)

    # -- the pipeline ----------------------------------------------------------------

    async def _admit(
        self,
        run: Run,
        call: ToolCall,
        journal: _Journal,
        approver: Approver | None = None,
        exclusive: bool = False,
    ) -> _Admission:
        """REQUEST → lookup → parse → validate → authorize → idempotency → approval → STARTED."""
        received_ns = time.time_ns()
        request, rejected = self._request(run, call)
        # In the journal at once: whatever fails later (a claim, a store), the call's
        # proposal is recorded, with the RESULT its batch concludes it with.
        journal.write([_request_event(request)])
        events: list[NewEvent] = []
        self._received[(run.id, request.tool_call_id)] = received_ns
        journal.call_ids.append(request.tool_call_id)
        run.proposed(request.tool_call_id)
        call_id, name = request.tool_call_id, request.tool_name

        assessed = self._assess(run, request, rejected)
        if isinstance(assessed, ToolCallResult):
            return self._refuse(journal, request, events, assessed)
        tool, checked = assessed

        # Authorized before a key is looked up: a recorded result is served only to a
        # call the policy allows now (it may deny what it allowed when it was recorded).
        decision = self._authorize(run, tool, request, checked)
        if not decision.allowed:
            return self._refuse(journal, request, events, _denied(call_id, decision))

        inflight: _Inflight | None = None
        if call.idempotency_key:
            known = self._idempotent(journal, request, events)
            if not isinstance(known, _Inflight):
                return known
            inflight = known

        if decision.requires_approval:
            decision = await self._approve(
                run,
                request,
                tool,
                decision,
                events,
                journal,
                self.approver if approver is None else approver,
                exclusive,
            )
            if decision.allowed:  # the run moved on while a human was asked: ask it again
                again = self._authorize(run, tool, request, checked)
                decision = decision if again.allowed else again
        cancelled = run.cancelled_before_start(call_id)
        if cancelled is not None:  # while it was admitted or a human was asked: never runs
            # Checked first: an approver that stopped waiting because of the cancel says
            # "denied", but what happened is that the call was cancelled.
            result = ToolCallResult.from_code(call_id, cancelled, tool=name)
            return self._refuse(journal, request, events, result, inflight)
        if not decision.allowed:
            return self._refuse(journal, request, events, _denied(call_id, decision), inflight)

        if inflight is not None:  # other processes sharing the ledger: one runs the key
            claimed = self._claim(journal, request, events, inflight)
            if claimed is not None:
                return claimed
        run.meter.charge(name, decision.cost, rate_keys(self.config.policy, name))
        started_at = timestamp()
        started = NewEvent(
            EventType.TOOL_CALL_STARTED,
            {
                "toolName": name,
                "toolVersion": tool.definition.version,
                "definitionHash": tool.definition.hash,
                "executionMode": str(tool.definition.execution_mode),
                "flaggedForReview": decision.audit,
                "startedAt": started_at,
            },
            call_id,
            plain=True,
        )
        events.append(started)
        journal.write(events)
        if tool.definition.concurrency_group is not ConcurrencyGroup.READ_ONLY:
            # A call that can change things is on disk before it runs. A READ_ONLY call
            # changes nothing, so its REQUEST and STARTED go in with its RESULT.
            try:
                journal.flush(durable=True)
            except LedgerError as exc:
                if not exc.maybe_stored:  # it never starts: no STARTED is recorded later
                    journal.withdraw(started)
                raise
        return _Admitted(request, tool, decision, inflight, started_at=started_at, started=started)

    async def _execute(
        self, run: Run, admitted: _Admitted, on_progress: ProgressListener | None
    ) -> Outcome:
        """Dispatch through the execution mode's adapter under a child token of the run."""
        call_id = admitted.request.tool_call_id
        if self.recorded is not None:
            return self.recorded.take(admitted.request)
        token = run.token.child()
        run.started(call_id, token)

        def report(progress: float, total: float | None, message: str | None) -> None:
            # What a tool (or a remote server) reports is untrusted like its output: the
            # numbers must be finite, the message is cut and redacted, and a call keeps
            # at most _MAX_PROGRESS_EVENTS of them in the ledger.
            number, total = _finite(progress), _finite(total)
            message = self._progress_message(message)
            if len(admitted.progress) < _MAX_PROGRESS_EVENTS:
                admitted.progress.append(
                    NewEvent(
                        EventType.TOOL_CALL_PROGRESS,
                        {"progress": number, "total": total, "message": message},
                        call_id,
                        plain=True,
                    )
                )
            else:
                admitted.progress_dropped += 1
            if on_progress is not None and number is not None:
                try:
                    on_progress(call_id, number, total, message)
                except Exception:  # noqa: BLE001 - the listener's failure is not the tool's
                    _log.exception("the progress listener failed on call %s", call_id)

        def make_context() -> ToolContext:
            return ToolContext(
                run_id=run.id,
                tool_call_id=call_id,
                workspace=self.guard.workspace,
                token=token,
                notes=MappingProxyType(run.notes),
                report_progress=report,
                kernel=self,
                run=run,
                approved=admitted.decision.requires_approval,  # held, then granted
            )

        adapter = self.adapters[admitted.tool.definition.execution_mode]
        arguments = admitted.request.arguments or {}
        invocation = Invocation(admitted.tool, arguments, make_context=make_context)
        # Seen by the tool and what it starts (threads, tasks); emptied when the call
        # ends, so a task that outlives it may use the run.
        cell = _Running(run, _RUNNING.get())
        mark = _RUNNING.set(cell)
        try:
            return await dispatch(adapter, invocation, token)
        finally:
            cell.run = None
            _RUNNING.reset(mark)
            run.calls.pop(call_id, None)
            run.token.release(token)

    def _progress_message(self, message: object) -> str | None:
        if not isinstance(message, str) or not message:
            return None
        # Redacted, then cut: cut first, a secret across the cut would not be recognised.
        # A status line for a person's screen: one line, control characters escaped
        # (a server's \x1b[2J must not clear a client's terminal).
        margin = 512 + 2 * self.redactor.max_secret_length
        text = utf8_text(message[: _MAX_PROGRESS_MESSAGE + margin])
        redacted = self.redactor.redact_text(text, Counter())
        return printable(redacted)[:_MAX_PROGRESS_MESSAGE]

    def _finish(self, admitted: _Admitted, outcome: Outcome) -> _Finished:
        """normalize → artifactize → redact: the result and its events, not yet written.

        A waiting duplicate of the call's idempotency key gets the result now; the key
        stays claimed until the batch has stored it (``_Journal.release_keys``). When
        that processing fails (the artifact store is full, say), the call is
        FAILED/INTERNAL_ERROR, and only that call: the other calls of its turn keep
        their results.
        """
        try:
            return self._complete(admitted, outcome)
        except Exception:  # noqa: BLE001 - the runtime's failure, on this call alone
            failed = Outcome.from_code(ErrorCode.INTERNAL_ERROR, tool=admitted.tool.name)
            failed.attempts, failed.duration_ms = outcome.attempts, outcome.duration_ms
            failed.internal["finishing"] = current_traceback()
            return self._complete(admitted, failed)

    def _complete(self, admitted: _Admitted, outcome: Outcome) -> _Finished:
        tool, request = admitted.tool, admitted.request
        finishing = Finishing(tool, request.tool_call_id, self.artifacts, self.redactor)
        for process in self.processors:
            outcome = process(outcome, finishing)
        result = ToolCallResult(
            tool_call_id=request.tool_call_id,
            status=outcome.status,
            error_code=outcome.code,
            safe_message=_utf8(outcome.message),  # a tool's own message may hold any text
            structured_output=outcome.output,
            artifacts=outcome.artifacts,
            usage=Usage(outcome.attempts, outcome.duration_ms, admitted.decision.cost),
            started_at=admitted.started_at,
            retryable=outcome.retryable,
            redactions=tuple(finishing.redactions),
        )
        key = request.idempotency_key
        index = (tool.name, key) if key and result.status in _RECORDABLE else None
        payload = _result_payload(request, result, tool.definition.version)
        payload["flaggedForReview"] = admitted.decision.audit
        if admitted.progress_dropped:
            outcome.internal["progressDropped"] = admitted.progress_dropped
        if outcome.internal:
            # A traceback quotes the tool's exception, which may hold any text: a secret
            # the runtime knows among it (a tool's error quoting its password).
            payload["internal"] = _utf8(outcome.internal, self.redactor.mask_known)
        events = [
            *admitted.progress,
            NewEvent(
                EventType.TOOL_CALL_RESULT,
                payload,
                request.tool_call_id,
                index_key=index,
                plain=True,
            ),
        ]
        # Not recorded under the key (cancelled, timed out): the next call runs anew.
        _settle(self._inflight, request, admitted.inflight, result, release=index is None)
        self._finished(request, result, tool.definition.version)
        return _Finished(result, events)

    def _conclude(
        self, run: Run, admission: _Admission, finished: _Finished | None, journal: _Journal
    ) -> ToolCallResult:
        """The call's RESULT, written in model order."""
        if isinstance(admission, ToolCallResult):
            return admission
        if isinstance(admission, _Duplicate):
            # Concluded in model order: an in-batch original has settled by now, and
            # a cancel of this call while it waited for it is seen now.
            if admission.in_batch:
                admission.cancelled = run.cancelled_before_start(admission.request.tool_call_id)
            return self._share(admission, admission.inflight.result, journal)
        assert finished is not None  # every admitted call was executed and finished
        journal.write(finished.events)
        return finished.result

    # -- pieces of the pipeline -------------------------------------------------------

    def _assess(
        self, run: Run, request: ToolCallRequest, rejected: ArgumentsRejected | None
    ) -> tuple[RegisteredTool, ValidationResult] | ToolCallResult:
        """Lookup, exposure, argument parsing and validation: no side effects."""
        call_id, name = request.tool_call_id, request.tool_name
        shown = run.exposed.get(name) if run.exposed is not None else None
        # Without a version (providers send none), the one the model was shown, not one
        # registered since; an explicit version (a program's choice) needs the name only.
        tool = self.registry.find(name, request.tool_version or shown)
        if tool is None and request.tool_version is None and shown is not None:
            tool = self.registry.find(name)  # the shown one is gone: list the tools again
            if tool is not None:
                available = self._names(run, besides=name)
                return ToolCallResult.from_code(
                    call_id, ErrorCode.TOOL_NOT_EXPOSED, tool=name, available=available
                )
        if tool is None:
            return self._unknown(run, name, request.tool_version).with_(tool_call_id=call_id)
        if not self._is_exposed(run, tool):
            return ToolCallResult.from_code(
                call_id, ErrorCode.TOOL_NOT_EXPOSED, tool=name, available=self._names(run)
            )
        if rejected is not None:
            return ToolCallResult.from_code(
                call_id, rejected.code, fields={"tool": name, **rejected.fields}
            )
        checked = validate(tool, request.arguments or {}, self.guard)
        violation = checked.violation
        if violation is None and name in self._argument_checks:
            try:
                violation = self._argument_checks[name](request.arguments or {})
            except Exception:  # noqa: BLE001 - a check that cannot decide refuses
                _log.exception("the argument check of %s failed", name)
                return ToolCallResult.from_code(call_id, ErrorCode.POLICY_ERROR, tool=name)
        if violation is not None:
            return ToolCallResult.from_code(
                call_id,
                violation.code,
                fields={"tool": name, "property": violation.property, **violation.fields},
            )
        return tool, checked

    def _authorize(
        self, run: Run, tool: RegisteredTool, request: ToolCallRequest, checked: ValidationResult
    ) -> Decision:
        """The policy's decision, the tool's own approval reasons, an adapter to run it."""
        decision = authorize(
            self.config.policy,
            tool.definition,
            run.context,
            run.meter,
            paths=_policy_paths(checked.paths),
        )
        if decision.allowed and tool.definition.execution_mode not in self.adapters:
            return _no_adapter(tool.definition)
        if decision.allowed and _writes(tool.definition):
            for path in checked.paths:
                # The policy itself, or one a runtime started in a subdirectory would
                # read (nor a directory of that name, which would stop it): never
                # written by a tool, under its own name or through a link to it.
                names = (*path.relative.split("/"), *path.target.split("/"))
                if (
                    path.absolute in self.policy_files
                    or CONFIG_FILENAME in names
                    or any(path.absolute.is_relative_to(code) for code in self.host_code)
                ):
                    return Decision(
                        False,
                        ErrorCode.PATH_DENIED,
                        safe_message(ErrorCode.PATH_DENIED, tool=tool.name, path=path.relative),
                    )
        check = self._approval_checks.get(tool.name)
        if decision.allowed and check is not None:
            try:
                reasons = tuple(check(request.arguments or {}))
            except Exception:  # noqa: BLE001 - a check that cannot decide denies
                return Decision(
                    False,
                    ErrorCode.POLICY_ERROR,
                    safe_message(ErrorCode.POLICY_ERROR, tool=tool.name),
                )
            if reasons:
                decision = replace(
                    decision,
                    requires_approval=True,
                    approval_reasons=(*decision.approval_reasons, *reasons),
                )
        return decision

    def explain(
        self,
        run: Run,
        tool_name: str,
        arguments: str | bytes | Mapping[str, Any] | None = None,
        *,
        version: str | None = None,
    ) -> dict[str, Any]:
        """What would happen to this call now, in safe terms; nothing is run or recorded.

        ``tool_name`` may also be the name a provider was shown (``file__patch``): a
        model asks about a tool by the only name it knows.
        """
        if self.registry.find(tool_name) is None:
            tool_name = self._provider_names.get(tool_name, tool_name)
        parsed = parse_arguments(arguments, max_bytes=self.config.max_argument_bytes)
        rejected = parsed if isinstance(parsed, ArgumentsRejected) else None
        request = ToolCallRequest(
            tool_call_id="explain",
            run_id=run.id,
            tool_name=tool_name,
            arguments=None if rejected else parsed.value,  # type: ignore[union-attr]
            arguments_hash=parsed.hash,
            tool_version=version,
        )
        assessed = self._assess(run, request, rejected)
        if isinstance(assessed, ToolCallResult):
            return _explanation(
                tool_name, assessed.status, assessed.error_code, assessed.safe_message
            )
        tool, checked = assessed
        decision = self._authorize(run, tool, request, checked)
        if not decision.allowed:
            return _explanation(
                tool_name, Status.DENIED, decision.reason_code, decision.safe_message
            )
        if decision.requires_approval:
            reasons = "; ".join(decision.approval_reasons)
            message = f"{tool.name} is allowed after a human approves it ({reasons})."
            if self.approver is None:
                message += " No approver is connected, so it would be refused now."
            return {
                **_explanation(tool_name, None, None, message),
                "outcome": "NEEDS_APPROVAL",
                "approvalReasons": list(decision.approval_reasons),
            }
        return _explanation(tool_name, None, None, f"{tool.name} is allowed with these arguments.")

    def _refuse(
        self,
        journal: _Journal,
        request: ToolCallRequest,
        events: list[NewEvent],
        result: ToolCallResult,
        inflight: _Inflight | None = None,
        *,
        received_ns: int | None = None,
    ) -> ToolCallResult:
        # A refusal's message can carry configured text (a rule's reason) or echoes of
        # the proposal: it is masked like any output before the model sees it.
        counts: Counter[str] = Counter()
        message = self.redactor.redact_text(result.safe_message, counts)
        if counts:
            notices = tuple(redaction_notices(counts, "safeMessage"))
            result = result.with_(safe_message=message, redactions=notices)
        payload = _result_payload(request, result, request.tool_version)
        events.append(
            NewEvent(EventType.TOOL_CALL_RESULT, payload, request.tool_call_id, plain=True)
        )
        journal.write(events)
        _settle(self._inflight, request, inflight, result)
        self._finished(request, result, request.tool_version, received_ns)
        return result

    def _finished(
        self,
        request: ToolCallRequest,
        result: ToolCallResult,
        version: str | None,
        received_ns: int | None = None,
    ) -> None:
        """The call is over: emit its trace span (a no-op without OpenTelemetry)."""
        if received_ns is None:
            received_ns = self._received.pop((request.run_id, request.tool_call_id), None)
        if _TRACE is not None and received_ns is not None:
            _TRACE(request, result, version, received_ns, time.time_ns())

    def _request(
        self, run: Run, call: ToolCall
    ) -> tuple[ToolCallRequest, ArgumentsRejected | None]:
        """The call as the ledger records it, and why its arguments are unusable, if so."""
        call = _storable(call)
        parsed = parse_arguments(call.arguments, max_bytes=self.config.max_argument_bytes)
        rejected = parsed if isinstance(parsed, ArgumentsRejected) else None
        request = ToolCallRequest(
            tool_call_id=call.tool_call_id or new_id("call"),
            run_id=run.id,
            tool_name=call.tool_name,
            arguments=None if rejected else parsed.value,  # type: ignore[union-attr]
            arguments_hash=parsed.hash,
            tool_version=call.version,
            step_id=call.step_id,
            idempotency_key=call.idempotency_key,
            requested_by=call.requested_by,
            trace_context=call.trace_context,
        )
        return request, rejected

    def _record_unstarted(self, run: Run, calls: Sequence[ToolCall], exc: BaseException) -> None:
        """REQUEST and a RESULT for calls an interruption (Ctrl-C, a cancelled caller, a
        failure) kept from starting: every proposal is recorded, with how it ended
        (CANCELLED/USER_CANCELLED, or FAILED/INTERNAL_ERROR), not left out."""
        if not calls:
            return
        journal = _Journal(self.ledger, run.id, self._inflight, self._claims)
        for call in calls:
            request, _ = self._request(run, call)
            journal.write([_request_event(request)])
        journal.conclude_interrupted(exc)
        try:
            journal.flush()
        except LedgerError:
            _log.exception("the calls an interruption kept from starting could not be recorded")

    def _refuse_repeated_id(self, run: Run, call: ToolCall, journal: _Journal) -> ToolCallResult:
        """REQUEST and INVALID_ARGUMENTS/DUPLICATE_CALL_ID for a call whose id is open in
        the run. It touches nothing kept under that id, which belongs to the open call."""
        received_ns = time.time_ns()
        request, _ = self._request(run, call)
        result = ToolCallResult.from_code(
            request.tool_call_id,
            ErrorCode.DUPLICATE_CALL_ID,
            id=safe_field(request.tool_call_id),
        )
        events = [_request_event(request)]
        return self._refuse(journal, request, events, result, received_ns=received_ns)

    def _share(
        self, dup: _Duplicate, shared: ToolCallResult | None, journal: _Journal
    ) -> ToolCallResult:
        """The original's result, under the duplicate's id; its own CANCELLED when it
        was cancelled while it waited (it shares nothing then)."""
        call_id, name = dup.request.tool_call_id, dup.request.tool_name
        shared_with = None
        if dup.cancelled is not None:
            result = ToolCallResult.from_code(call_id, dup.cancelled, tool=name)
        else:
            if shared is None:
                shared = ToolCallResult.from_code(call_id, ErrorCode.INTERNAL_ERROR, tool=name)
            result, shared_with = shared.with_(tool_call_id=call_id), shared.tool_call_id
        payload = _result_payload(dup.request, result, dup.request.tool_version)
        if shared_with is not None:
            payload["sharedWith"] = shared_with
        journal.write([NewEvent(EventType.TOOL_CALL_RESULT, payload, call_id, plain=True)])
        self._finished(dup.request, result, dup.request.tool_version)
        return result

    def _idempotent(
        self, journal: _Journal, request: ToolCallRequest, events: list[NewEvent]
    ) -> _Inflight | _Duplicate | ToolCallResult:
        """A recorded or running result for this key, or a fresh in-flight entry."""
        name, key = request.tool_name, str(request.idempotency_key)
        call_id = request.tool_call_id
        conflict = ToolCallResult.from_code(call_id, ErrorCode.IDEMPOTENCY_CONFLICT, tool=name)
        # Claimed before the ledger is asked, under a lock: of duplicates that arrive at
        # the same moment (in one batch, or from runs on other threads), one goes on.
        with self._inflight_lock:
            running = self._inflight.get((name, key))
            if running is None:
                entry = self._inflight[(name, key)] = _Inflight(request.arguments_hash)
        if running is not None:
            if running.arguments_hash != request.arguments_hash:
                return self._refuse(journal, request, events, conflict)
            journal.write(events)  # the duplicate's REQUEST, in model order
            in_batch = any(held is running for _, held in journal.held)
            return _Duplicate(request, running, in_batch)
        journal.held.append((request, entry))
        journal.flush()  # an index lookup must see what this batch already decided
        found = self._lookup(journal, request, events, entry)
        return entry if found is None else found

    def _claim(
        self,
        journal: _Journal,
        request: ToolCallRequest,
        events: list[NewEvent],
        entry: _Inflight,
    ) -> ToolCallResult | None:
        """Claim the call's key in the ledger until its result is stored (the lease is
        renewed meanwhile, see ``toolkernel.claims``), so that another process sharing
        the ledger does not run it too; None when claimed.

        A call of another process that holds the key makes this one
        DENIED/IDEMPOTENCY_IN_PROGRESS (retryable: repeated later, it gets that
        call's result). A holder stores its result before letting go, so a key
        claimed just now may already have one: that result is returned.
        """
        name, key = request.tool_name, str(request.idempotency_key)
        owner = self._claims.claim(name, key, request.run_id, request.tool_call_id)
        if owner is None:
            busy = ToolCallResult.from_code(
                request.tool_call_id, ErrorCode.IDEMPOTENCY_IN_PROGRESS, tool=name
            )
            return self._refuse(journal, request, events, busy, entry)
        entry.owner = owner
        return self._lookup(journal, request, events, entry)

    def _lookup(
        self,
        journal: _Journal,
        request: ToolCallRequest,
        events: list[NewEvent],
        entry: _Inflight,
    ) -> ToolCallResult | None:
        """The result recorded under the call's key (see ``_recorded``), None when there
        is none. A record the ledger cannot vouch for (an index entry that points at no
        event, an event that cannot be decoded) refuses the call: running the tool
        again could do twice what the key was to do once."""
        name = request.tool_name
        try:
            recorded = self.ledger.find_indexed(name, str(request.idempotency_key))
        except LedgerCorrupted as exc:
            _log.error("the recorded result of a call of %s cannot be trusted: %s", name, exc)
            broken = ToolCallResult.from_code(
                request.tool_call_id, ErrorCode.INTERNAL_ERROR, tool=name
            )
            return self._refuse(journal, request, events, broken, entry)
        if recorded is None:
            return None
        return self._recorded(journal, request, events, entry, recorded)

    def _recorded(
        self,
        journal: _Journal,
        request: ToolCallRequest,
        events: list[NewEvent],
        entry: _Inflight,
        recorded: Event,
    ) -> ToolCallResult:
        """The result stored under the call's key, given as this call's (REQUEST and
        RESULT, ``replayedFrom`` naming the original), once the run that recorded it
        verifies: a result edited in the ledger would otherwise reach the model, and be
        stored again under a fresh, valid hash."""
        name, call_id = request.tool_name, request.tool_call_id
        verified = self._verified_record(recorded)
        if verified is None:
            # Running the tool again could do twice what the key was to do once.
            broken = ToolCallResult.from_code(call_id, ErrorCode.INTERNAL_ERROR, tool=name)
            return self._refuse(journal, request, events, broken, entry)
        recorded = verified
        if recorded.payload.get("argumentsHash") != request.arguments_hash:
            conflict = ToolCallResult.from_code(call_id, ErrorCode.IDEMPOTENCY_CONFLICT, tool=name)
            return self._refuse(journal, request, events, conflict, entry)
        stored = _recorded_result(recorded)
        if stored is None:
            # The index points at something that is not a result (an edited ledger).
            broken = ToolCallResult.from_code(call_id, ErrorCode.INTERNAL_ERROR, tool=name)
            return self._refuse(journal, request, events, broken, entry)
        result = stored.with_(tool_call_id=call_id)
        payload = _result_payload(request, result, request.tool_version)
        payload["replayedFrom"] = {"runId": recorded.run_id, "seq": recorded.seq}
        events.append(NewEvent(EventType.TOOL_CALL_RESULT, payload, call_id, plain=True))
        journal.write(events)
        _settle(self._inflight, request, entry, result)
        self._finished(request, result, request.tool_version)
        return result

    def _verified_record(self, recorded: Event) -> Event | None:
        """``recorded`` as read with its run verified, or None (and the operator told)
        when the run fails verification or no longer holds that event."""
        read = self.ledger.read_verified(recorded.run_id)
        found = [e for e in read.events if e.seq == recorded.seq and e.hash == recorded.hash]
        if read.report.ok and found:
            return found[0]
        problems = (
            "; ".join(f"seq {p.seq}: {p.kind}: {p.detail}" for p in read.report.problems[:3])
            or "the event is no longer there"
        )
        _log.error(
            "the result recorded under an idempotency key (run %s, seq %s) is not served: "
            "its run fails verification (%s); toolkernel ledger verify --run %s lists why",
            recorded.run_id,
            recorded.seq,
            problems,
            recorded.run_id,
        )
        return None

    async def _approve(
        self,
        run: Run,
        request: ToolCallRequest,
        tool: RegisteredTool,
        decision: Decision,
        events: list[NewEvent],
        journal: _Journal,
        approver: Approver | None,
        exclusive: bool,
    ) -> Decision:
        """Hold the call for approval: APPROVAL_REQUESTED, then ``approver``'s answer.

        While the human thinks, the run's other calls go on: the batch steps aside from
        the run's gate, and takes it back (in arrival order) before the call goes on.
        """
        held = ApprovalRequest(
            run_id=run.id,
            tool_call_id=request.tool_call_id,
            tool_name=tool.name,
            tool_version=tool.definition.version,
            # A copy: what the approver does to what it is shown never reaches the
            # call, which runs with the arguments validated and recorded.
            arguments=copy.deepcopy(request.arguments or {}),
            reasons=decision.approval_reasons,
        )
        events.append(NewEvent(EventType.APPROVAL_REQUESTED, held.to_dict(), request.tool_call_id))
        journal.write(events)
        journal.flush(durable=True)  # the hold is on disk before anyone is asked
        events.clear()
        if approver is None:
            return Decision(
                False,
                ErrorCode.APPROVAL_REQUIRED,
                _approval_required_message(tool.name, decision.approval_reasons),
            )
        # Not while the batch holds an idempotency key: a duplicate could take the gate
        # and wait for this call, which would then wait for the gate.
        aside = run.gate.stepped_aside(exclusive) if not journal.held else nullcontext()
        answer = ApprovalDecision(False, "runtime", "the call was cancelled while asked about")
        try:
            async with aside:
                with run.asking(request.tool_call_id):
                    answer = await ask(approver, held)  # else stays the runtime's denial
        except Exception as exc:  # noqa: BLE001 - a broken approver must not approve
            why = f"approver failed: {type(exc).__name__}"
            answer = ApprovalDecision(False, "error", why, asked=False)
        except BaseException:
            # The caller was cancelled (or interrupted) while the human was asked, or
            # after the answer, while the call waited to go on: the ledger says what
            # was decided (the human's answer, or the runtime's denial) before the
            # call's RESULT.
            kind = EventType.APPROVAL_GRANTED if answer.approved else EventType.APPROVAL_DENIED
            payload = {"approver": answer.approver, "note": answer.note}
            journal.write([NewEvent(kind, payload, request.tool_call_id)])
            raise
        kind = EventType.APPROVAL_GRANTED if answer.approved else EventType.APPROVAL_DENIED
        events.append(
            NewEvent(
                kind,
                {"approver": answer.approver, "note": answer.note},
                request.tool_call_id,
            )
        )
        if not answer.approved and not answer.asked:  # nobody decided: it waits for one
            message = _approval_required_message(
                tool.name, decision.approval_reasons, answer.advice
            )
            return Decision(False, ErrorCode.APPROVAL_REQUIRED, message)
        if not answer.approved:
            return Decision(
                False,
                ErrorCode.APPROVAL_REJECTED,
                ToolCallResult.from_code(
                    "", ErrorCode.APPROVAL_REJECTED, tool=tool.name
                ).safe_message,
            )
        return decision

    def _unknown(self, run: Run, name: str, version: str | None) -> ToolCallResult:
        call_id = ""
        versions = self.registry.versions(name)
        if versions and version is not None:
            return ToolCallResult.from_code(
                call_id,
                ErrorCode.UNKNOWN_VERSION,
                tool=safe_field(name),
                version=safe_field(version),
                available=", ".join(versions),
            )
        withdrawn = self._withdrawn.get(name)
        if withdrawn is not None and version is None:
            return ToolCallResult.from_code(
                call_id, ErrorCode.POLICY_DENIED, tool=safe_field(name), hint=withdrawn
            )
        return ToolCallResult.from_code(
            call_id, ErrorCode.UNKNOWN_TOOL, tool=safe_field(name), available=self._names(run)
        )

    def _projection(self, run: Run) -> frozenset[str]:
        key = (run.context, self._generation)
        cached = run.projection_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        names = frozenset(d.name for d in self.list_available(run.context))
        run.projection_cache = (key, names)
        return names

    def _is_exposed(self, run: Run, tool: RegisteredTool) -> bool:
        if tool.name not in self._projection(run):
            return False
        return run.exposed is None or tool.name in run.exposed

    def _names(self, run: Run, *, besides: str = "") -> str:
        names = self._projection(run)
        if run.exposed is not None:
            names = names & run.exposed.keys()
        return ", ".join(sorted(names - {besides})) or "none"

    def _load_configured_tools(self) -> None:
        """Register ``tools.modules`` and ``tools.definitions``; what fails is a
        ConfigError naming the key, the entry and the file."""
        code: list[Path] = []
        source = self.config.source
        label = str(source or "configuration")
        places = [self.guard.workspace, *([source.parent] if source is not None else [])]
        for index, module_name in enumerate(self.config.tool_modules):
            where = f"{label}: key 'tools.modules.{index}' ('{module_name}')"
            try:
                module = importlib.import_module(module_name)
            except Exception as exc:  # the module's own code: any error
                why = _import_problem(exc, module_name, places)
                raise ConfigError(f"{where}: cannot import it: {why}") from exc
            code.extend(_module_code(module))
            try:
                for value in vars(module).values():
                    if isinstance(value, FunctionTool):
                        self.register(value)
            except DefinitionError as exc:
                raise ConfigError(f"{where}: {exc}") from exc
        for index, path in enumerate(self.config.tool_definitions):
            try:
                for definition in _data_definitions(path, self.adapters):
                    self.register(definition)
            except DefinitionError as exc:
                where = f"{label}: key 'tools.definitions.{index}' ({path})"
                raise ConfigError(f"{where}: {exc}") from exc
            code.append(path.resolve())
        workspace = self.guard.workspace
        self.host_code = frozenset(path for path in code if path.is_relative_to(workspace))
        for path in self.host_code:
            if path.name == "__pycache__":
                # Bytecode there that matches a module's time and size is what Python
                # runs instead of its source: a cache a command could create would be
                # writable. Python makes it on import unless told not to.
                with suppress(OSError):
                    path.mkdir(exist_ok=True)


def _import_problem(exc: Exception, module_name: str, places: Sequence[Path]) -> str:
    """Why a ``tools.modules`` entry did not import. For a module that is not on the
    import path (not one it imports), also how to put it there, and where a module of
    that name lies that the command does not import from."""
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if not missing or not (module_name == missing or module_name.startswith(f"{missing}.")):
        return f"{type(exc).__name__}: {exc}"
    top = module_name.split(".", 1)[0]
    found = [p for place in places for p in (place / f"{top}.py", place / top) if p.exists()]
    there = f"{found[0]} is there, but " if found else ""
    return (
        f"module '{missing}' is not on Python's import path: {there}the toolkernel command "
        "does not import from the workspace or the config file's directory, where a "
        "command could replace it. Install it as a package (pip install -e its project) "
        "or add its directory to PYTHONPATH"
    )


def _module_code(module: ModuleType) -> list[Path]:
    """Where a module's code lies: a package's directories, or a module's file and the
    ``__pycache__`` beside it."""
    packages = getattr(module, "__path__", None)
    if packages is not None:
        return [Path(entry).resolve() for entry in packages]
    file = getattr(module, "__file__", None)
    if not isinstance(file, str):
        return []
    source = Path(file).resolve()
    return [source, source.parent / "__pycache__"]


def _data_definitions(
    path: Path, adapters: Mapping[ExecutionMode, Adapter]
) -> list[ToolDefinition]:
    """The definitions of a ``tools.definitions`` file: each must be one that an
    adapter of this kernel runs from its definition alone.

    Raises:
        DefinitionError: the file or a definition in it cannot be used.
    """
    from toolkernel.definition import load_definitions

    definitions = load_definitions(path)
    for definition in definitions:
        mode = definition.execution_mode
        if mode is ExecutionMode.NATIVE or mode in _SANDBOXED:
            # Listed, exposed and refused on every call, it would look like a policy fault.
            why = (
                f"a {mode} tool is Python code, which a definitions file cannot give: "
                "write it with @tool in a module named in tools.modules"
            )
        elif mode is ExecutionMode.REMOTE_MCP:
            why = "bridged tools come from their server: name it under [[mcp.servers]]"
        elif mode not in adapters:
            why = (
                f"nothing runs {mode} tools in this runtime: a program embedding "
                f"toolkernel passes an adapter for them (Kernel(adapters=...))"
            )
        else:
            continue
        raise DefinitionError(definition.name, "executionMode", why)
    return definitions


def _explanation(
    tool: str, status: Status | None, code: ErrorCode | None, message: str
) -> dict[str, Any]:
    return {
        "tool": safe_field(tool),
        "outcome": str(status) if status else "ALLOWED",
        "errorCode": str(code) if code else None,
        "explanation": message,
    }


def _segments(
    registry: Registry, run: Run, calls: Sequence[ToolCall]
) -> list[tuple[bool, list[ToolCall]]]:
    """Split a turn into parallel READ_ONLY runs and single exclusive calls, in order."""
    segments: list[tuple[bool, list[ToolCall]]] = []
    for call in calls:
        exclusive = _is_exclusive(registry, run, call)
        if not exclusive and segments and not segments[-1][0]:
            segments[-1][1].append(call)
        else:
            segments.append((exclusive, [call]))
    return segments


@dataclass(slots=True)
class _Running:
    """The run whose tool is running in this context, while it runs (``run`` is None
    once the call ended), and the call that tool was called from, if any: a tool that
    calls the kernel on any of them would wait for itself (their batches hold the
    runs' gates), so that is refused."""

    run: Run | None
    outer: _Running | None


_RUNNING: Final[ContextVar[_Running | None]] = ContextVar("toolkernel_running", default=None)
_MAX_TOOL_NAME: Final = 128  # the longest name a definition may have (definition.py)
_TEXT_FIELDS: Final = (
    "tool_name",
    "tool_call_id",
    "version",
    "idempotency_key",
    "step_id",
    "trace_context",
    "requested_by",
)


def _finite(value: object) -> float | None:
    """A reported progress number as a finite float, or ``None`` (NaN, a string, …)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        return None
    return number if math.isfinite(number) else None


def _utf8(value: Any, mask: Callable[[str], str] | None = None) -> Any:
    """``value`` with every string that has no UTF-8 form (a lone surrogate) spelled with
    backslash escapes, through dicts and lists: what the ledger can store; ``mask``
    applied to each string too."""
    if isinstance(value, str):
        text = utf8_text(value)
        return text if mask is None else mask(text)
    if isinstance(value, dict):
        return {_utf8(k, mask): _utf8(v, mask) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_utf8(item, mask) for item in value]
    return value


def _storable(call: ToolCall) -> ToolCall:
    """``call`` with every text field that has no UTF-8 form (a lone surrogate, e.g. from
    a non-UTF-8 command line) or holds NUL (which PostgreSQL text cannot) spelled with
    backslash escapes, so that its REQUEST can be recorded in either backend; such a name
    then matches no tool and the call is refused as unknown.

    Raises:
        TypeError: a text field (an idempotency key, say) is not a string.
        UsageError: the idempotency key is empty.
    """
    changes = {}
    for name in _TEXT_FIELDS:
        text = getattr(call, name)
        if text is None and name != "tool_name":  # the name is required, the rest not
            continue
        if not isinstance(text, str):
            # The caller's mistake, not the model's: nothing is recorded or run.
            raise TypeError(f"ToolCall.{name} must be a string, not {type(text).__name__}")
        if not text and name == "idempotency_key":
            # "" would be recorded as the call's key and never looked up (it is falsy):
            # the ledger would claim a key the runtime did not honour.
            raise UsageError("an idempotency key must not be empty; leave it out for no key")
        if (
            text.isascii()
            and "\0" not in text
            and (name != "tool_name" or len(text) <= _MAX_TOOL_NAME)
        ):
            continue  # stored as it is: nearly every field of nearly every call
        stored = utf8_text(text.replace("\0", "\\x00"))  # no database text holds NUL
        if name == "tool_name" and len(stored) > _MAX_TOOL_NAME:
            # No tool has such a name: recorded cut, it is refused as unknown all the
            # same, and a client cannot grow the ledger by megabytes a call with it.
            stored = stored[:_MAX_TOOL_NAME] + "…"
        if stored != text:
            changes[name] = stored
    return replace(call, **changes) if changes else call


def _request_event(request: ToolCallRequest) -> NewEvent:
    """The call's TOOL_CALL_REQUEST, as the ledger records every proposal."""
    return NewEvent(
        EventType.TOOL_CALL_REQUEST, request.to_dict(), request.tool_call_id, plain=True
    )


def _recorded_result(event: Event) -> ToolCallResult | None:
    """The result a RESULT event holds; None when the event is not one or unreadable."""
    if event.type is not EventType.TOOL_CALL_RESULT:
        return None
    try:
        return ToolCallResult.from_dict(event.payload["result"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


async def _wait_read_slot(run: Run, admitted: _Admitted, journal: _Journal) -> Outcome | None:
    """Wait for a parallel-read slot: the call starts when it gets one, and its STARTED,
    if not stored yet, says so. Cancelled meanwhile, it never starts: its STARTED is
    taken back if it can be, and its outcome is returned (None once it has the slot)."""
    call_id = admitted.request.tool_call_id
    if not await run.wait_read_slot(call_id):
        reason = run.cancelled_before_start(call_id) or ErrorCode.USER_CANCELLED
        if admitted.started is not None and journal.withdraw(admitted.started):
            admitted.started_at = None
        return Outcome.from_code(reason, tool=admitted.request.tool_name)
    if admitted.started is not None:
        at = timestamp()
        restamped = journal.restamp(admitted.started, at)
        if restamped is not None:
            admitted.started, admitted.started_at = restamped, at
    return None


async def _await_original(run: Run, dup: _Duplicate) -> ErrorCode | None:
    """Wait for the call that runs ``dup``'s key; why ``dup`` was cancelled meanwhile
    (``cancel_call`` of it, or of its run), if it was: it then stops waiting."""
    call_id = dup.request.tool_call_id
    token = run.token.child()
    run.started(call_id, token)
    try:
        with anyio.CancelScope() as scope, token.watch(scope):
            await dup.inflight.wait()
    finally:
        run.calls.pop(call_id, None)
        run.token.release(token)
    return token.reason if scope.cancelled_caught else None


def _denied(call_id: str, decision: Decision) -> ToolCallResult:
    code = decision.reason_code or ErrorCode.POLICY_ERROR
    return ToolCallResult.from_code(call_id, code, message=decision.safe_message)


def _unrecorded(calls: Sequence[ToolCall], exc: LedgerError) -> list[ToolCallResult]:
    """FAILED/LEDGER_UNAVAILABLE for ``calls``: the ledger could not record them (the
    error names the ledger's host path: the operator's log gets it, not the model)."""
    results = []
    for call in calls:
        call_id, name = call.tool_call_id or new_id("call"), str(call.tool_name)
        _log.error(
            "call %s of %s could not be recorded: %s",
            call_id,
            printable(name[:200]),
            printable(str(exc)),
        )
        tool = safe_field(name)
        results.append(ToolCallResult.from_code(call_id, ErrorCode.LEDGER_UNAVAILABLE, tool=tool))
    return results


def _is_exclusive(registry: Registry, run: Run, call: ToolCall) -> bool:
    """Whether the call must run alone (anything but READ_ONLY; unknown tools are not).

    The version is found as ``Kernel._assess`` finds the one that runs: without one
    named, the version the run was shown, not one registered since.
    """
    if not isinstance(call.tool_name, str):
        return False  # the caller's mistake: _storable says so, clearly
    shown = run.exposed.get(call.tool_name) if run.exposed is not None else None
    tool = registry.find(call.tool_name, call.version or shown)
    return tool is not None and tool.definition.concurrency_group is not ConcurrencyGroup.READ_ONLY


def _result_payload(
    request: ToolCallRequest, result: ToolCallResult, version: str | None
) -> dict[str, Any]:
    return {
        "toolName": request.tool_name,
        "toolVersion": version,
        "argumentsHash": request.arguments_hash,
        "idempotencyKey": request.idempotency_key,
        "result": result.to_dict(),
    }


def _epoch_s(stamp: object, *, default: float) -> float:
    """An ISO-8601 ledger time as seconds since the epoch (``default`` if unreadable)."""
    try:
        return datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError:
        return default


def _settle(
    inflight_map: dict[tuple[str, str], _Inflight],
    request: ToolCallRequest,
    inflight: _Inflight | None,
    result: ToolCallResult,
    *,
    release: bool = True,
) -> None:
    """Give waiting duplicates ``result``; with ``release``, free the key too."""
    if inflight is None:
        return
    inflight.settle(result)
    if release:
        _release(inflight_map, request, inflight)


def _release(
    inflight_map: dict[tuple[str, str], _Inflight], request: ToolCallRequest, inflight: _Inflight
) -> None:
    key = (request.tool_name, str(request.idempotency_key))
    if inflight_map.get(key) is inflight:  # a later call may hold the key by now
        del inflight_map[key]


def _policy_paths(paths: Sequence[GuardedPath]) -> list[str]:
    """The paths the policy's path rules judge: each as written and, where a symlink
    in the workspace leads elsewhere, where it leads (``notes.tf`` -> ``infra/main.tf``):
    a deny rule must not be passed by a link, nor a write scope left through one."""
    judged = []
    for path in paths:
        judged.append(path.relative)
        if path.target != path.relative:
            judged.append(path.target)
    return judged


def _writes(definition: ToolDefinition) -> bool:
    return (
        definition.permissions.write_workspace
        or definition.execution_mode is ExecutionMode.SANDBOX_WRITE
    )


def _no_adapter(definition: ToolDefinition) -> Decision:
    if definition.execution_mode in _SANDBOXED:
        code = ErrorCode.SANDBOX_UNAVAILABLE
    else:
        code = ErrorCode.POLICY_ERROR
    return Decision(False, code, safe_message(code, tool=definition.name))


def _approval_required_message(tool: str, reasons: Sequence[str], advice: str = "") -> str:
    """APPROVAL_REQUIRED's message: ``advice`` (an approver's, which knows how its user
    can approve), or why the call is held and the CLI's and library's way."""
    if not advice:
        why = f"It is held because {'; '.join(reasons)}. " if reasons else ""
        advice = (
            f"{why}Ask the user to approve it "
            "(CLI: rerun with --approve; library: pass an approver)."
        )
    return safe_message(ErrorCode.APPROVAL_REQUIRED, tool=tool, how=advice)


def outside_event_loop(method: str, instead: str) -> None:
    """Refuse a synchronous entry point (``method``) where an event loop runs in this
    thread, in a task or in a callback of it: it would have to start another.

    Raises:
        UsageError: saying to use ``instead``.
    """
    try:
        library: str | None = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:  # no task runs: a loop's callback, or none
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        library = "asyncio"
    raise UsageError(
        f"{method} was called inside a running event loop ({library}), which it would "
        f"have to stop for the call: use '{instead}' there"
    )


def open_ledger(config: Config, *, read_only: bool = False) -> Ledger:
    """The ledger ``config`` names (``[ledger]``), as a kernel opens it; ``read_only``
    (a PostgreSQL ledger, as ``ledger verify`` opens it) creates nothing.

    Raises:
        ConfigError: the postgres backend without a DSN, or without psycopg installed.
        LedgerError: the ledger cannot be opened or reached.
        LedgerMissing: (``read_only``) there is no ledger where ``config`` points.
    """
    settings = config.ledger
    if settings.backend == "postgres":
        try:
            from toolkernel.ledger.postgres import PostgresLedger  # psycopg stays optional
        except ImportError as exc:
            raise ConfigError(
                "ledger.backend: the postgres backend needs psycopg; install 'toolkernel[postgres]'"
            ) from exc

        if settings.dsn is None:
            raise ConfigError("ledger.dsn: the postgres backend needs a DSN")
        ledger: Ledger = PostgresLedger(settings.dsn, schema=settings.schema, read_only=read_only)
    else:
        ledger = SqliteLedger(config.ledger_path, synchronous=settings.synchronous)
    return GroupCommitLedger(ledger) if settings.commit == "group" else ledger

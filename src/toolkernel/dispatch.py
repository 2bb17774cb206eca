"""Dispatch: run an authorized call through its execution mode's adapter.

The adapter call is the one isolation boundary where any exception from tool code is
caught and turned into a FAILED result (its traceback kept for the ledger). Around it:
a timeout scope, the call's cancellation token, and retries — only for idempotent
tools or for error codes the definition lists, with exponential backoff.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import inspect
import logging
import queue
import threading
import time
import traceback
import types
from collections.abc import Callable, Generator, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, Protocol

import anyio
import anyio.to_thread
import sniffio

from toolkernel.calls import ArtifactRef
from toolkernel.cancel import CancellationToken, CancelledByRuntime
from toolkernel.codes import CATALOG, ErrorCode, Status, safe_message
from toolkernel.context import ToolContext
from toolkernel.errors import ToolFailed, ToolPartial
from toolkernel.registry import RegisteredTool

__all__ = ["Adapter", "Invocation", "NativeAdapter", "Outcome", "ToolOutput", "dispatch"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """What a tool may return to give the model a summary and artifact refs too."""

    data: Any = None
    summary: str = ""
    artifacts: tuple[ArtifactRef, ...] = ()


class Invocation:
    """One authorized call, as an adapter receives it.

    Pass the ``context``, or ``make_context`` to build it on first use: most native
    tools never ask for theirs, and building it is a measurable part of a call.
    """

    __slots__ = ("_context", "_make_context", "arguments", "tool")

    def __init__(
        self,
        tool: RegisteredTool,
        arguments: Mapping[str, Any],
        context: ToolContext | None = None,
        *,
        make_context: Callable[[], ToolContext] | None = None,
    ) -> None:
        if (context is None) == (make_context is None):
            raise TypeError("pass exactly one of context and make_context")
        self.tool = tool
        self.arguments = arguments
        self._context = context
        self._make_context = make_context

    @property
    def context(self) -> ToolContext:
        if self._context is None:
            assert self._make_context is not None
            self._context = self._make_context()
        return self._context


@dataclass(slots=True)
class Outcome:
    """What dispatch produced, before normalization and projection."""

    status: Status
    code: ErrorCode | None = None
    message: str = ""
    output: Any = None
    artifacts: tuple[ArtifactRef, ...] = ()
    retryable: bool = False
    attempts: int = 0
    duration_ms: float = 0.0
    internal: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_code(cls, code: ErrorCode, **fields: object) -> Outcome:
        """The outcome an error code describes, with its safe message and retryability."""
        info = CATALOG[code]
        return cls(
            info.status, code=code, message=safe_message(code, **fields), retryable=info.retryable
        )


class Adapter(Protocol):
    """Runs a call in one execution mode. Raise ``ToolFailed``/``ToolPartial`` to shape
    the result; anything else raised becomes FAILED/TOOL_ERROR."""

    async def invoke(self, invocation: Invocation) -> Any: ...


_CONTAINERS: Final = (dict, list)


class NativeAdapter:
    """In-process Python tools: async functions run directly, sync ones in a worker thread.

    A sync tool cannot be killed: on timeout or cancel its thread is abandoned (the
    result is discarded) and the tool should poll ``ctx.token`` to stop early.
    """

    def __init__(self, *, max_threads: int = 16) -> None:
        self._limiter = anyio.CapacityLimiter(max_threads)
        self._workers = _Workers(max_threads)

    def close(self) -> None:
        """End the idle worker threads (busy ones end when their tool returns)."""
        self._workers.close()

    async def invoke(self, invocation: Invocation) -> Any:
        tool = invocation.tool
        handler = tool.handler
        if handler is None:
            raise ToolFailed("this tool has no implementation", code=ErrorCode.INTERNAL_ERROR)
        kwargs = dict(invocation.arguments)
        for name, value in kwargs.items():
            if type(value) in _CONTAINERS:
                # The tool's own copy: the ledger's REQUEST (stored after a READ_ONLY call
                # ran) and a retry must see the arguments as proposed.
                kwargs[name] = copy.deepcopy(value)
        for name in tool.integer_parameters:
            value = kwargs.get(name)
            if type(value) is float and value.is_integer():  # 1.0: an integer to the schema
                kwargs[name] = int(value)
        if tool.context_parameter:
            kwargs[tool.context_parameter] = invocation.context
        if tool.is_async:
            return await handler(**kwargs)
        if sniffio.current_async_library() == "asyncio":
            # A bare future completed with call_soon_threadsafe is a third of anyio's
            # generic hop and cheaper than run_in_executor's chained futures. An awaiting
            # task that is cancelled abandons the future, as abandon_on_cancel does.
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            # In the caller's context variables (a trace context, the running call), as
            # anyio's hop gives them: minus "asyncio is running here", which is not so
            # in the worker (the tool may start an event loop of its own).
            context = contextvars.copy_context()
            context.run(sniffio.current_async_library_cvar.set, None)
            try:
                self._workers.submit(loop, future, partial(context.run, handler, **kwargs))
            except _AllHeld as held:  # it would wait out its timeout, then seem to have run
                raise _never_started(tool.name, held) from None
            except RuntimeError as exc:  # "can't start new thread": the tool never ran
                _log.error("%s could not run: %s", tool.name, exc)
                raise ToolFailed(
                    safe_message(ErrorCode.INTERNAL_ERROR, tool=tool.name),
                    code=ErrorCode.INTERNAL_ERROR,
                    retryable=True,  # a shortage of threads may pass
                ) from None
            try:
                output = await future
            except _AllHeld as held:  # queued, and the last live thread was abandoned
                raise _never_started(tool.name, held) from None
        else:
            output = await anyio.to_thread.run_sync(
                partial(handler, **kwargs), abandon_on_cancel=True, limiter=self._limiter
            )
        if inspect.iscoroutine(output):  # an async function behind a plain one (a lambda)
            return await output
        return output


class _AllHeld(RuntimeError):
    """Every worker thread runs an abandoned tool, and no more may start."""


def _never_started(name: str, held: _AllHeld) -> ToolFailed:
    _log.error("%s could not run: %s", name, held)
    return ToolFailed(
        f"{name} could not start: every worker thread for sync tools is held by an "
        "earlier call that timed out or was cancelled and did not return; try again later",
        code=ErrorCode.INTERNAL_ERROR,
        retryable=True,  # a hung tool that returns frees its thread
    )


class _Job:
    """One sync tool call for a worker thread, and where its thread stands with it."""

    __slots__ = ("abandoned", "fn", "future", "loop", "running")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], fn: Callable[[], Any]
    ) -> None:
        self.loop, self.future, self.fn = loop, future, fn
        self.running = False
        self.abandoned = False  # the caller stopped waiting while it ran


_IDLE_S: Final = 60.0  # a worker thread with nothing to do this long ends
_MAX_ABANDONED: Final = 64  # threads kept past max_threads for tools nobody waits for


class _Workers:
    """Daemon threads that run sync tools and hand results back to the caller's loop.

    A job never waits behind a busy thread while fewer than ``max_threads`` exist: a
    tool that was abandoned (timeout, cancel) keeps its thread, and the next job gets an
    idle thread or a new one. Past ``max_threads`` jobs queue, in order. A thread whose
    tool was abandoned does not count against ``max_threads`` (up to ``_MAX_ABANDONED``
    of them), so tools that hang cannot starve the rest; a job whose caller stopped
    waiting before a thread took it never runs; a thread idle for ``_IDLE_S`` ends.
    When every thread runs an abandoned tool and no more may start, a job is refused
    (``_AllHeld``) rather than queued for a thread that may never come back.
    """

    def __init__(self, max_threads: int) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._max = max_threads
        self._threads = 0
        self._abandoned = 0  # threads running a job whose caller stopped waiting
        self._idle = 0  # threads waiting for a job that no submit has claimed
        self._backlog = 0  # queued jobs that no idle thread was claimed for
        self._closed = False

    def submit(
        self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], fn: Callable[[], Any]
    ) -> None:
        job = _Job(loop, future, fn)
        future.add_done_callback(partial(self._settled, job))
        with self._lock:
            if self._idle:
                self._idle -= 1
            elif self._may_grow():
                self._start(job)
                return
            elif self._threads == self._abandoned:
                # No thread will come back for a queued job: each runs a tool nobody
                # waits for, and no more may start.
                raise self._all_held()
            else:
                self._backlog += 1
        self._jobs.put(job)

    def close(self) -> None:
        """End the idle threads now; busy ones end when their tool returns (or, if a job
        still waits for them, once it is done)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, 0
            self._threads -= idle
        for _ in range(idle):
            self._jobs.put(None)

    def _all_held(self) -> _AllHeld:
        return _AllHeld(
            f"all {self._threads} worker threads run tools that were abandoned "
            "(timed out or cancelled) and have not returned"
        )

    def _may_grow(self) -> bool:
        return (
            self._threads - self._abandoned < self._max
            and self._threads < self._max + _MAX_ABANDONED
        )

    def _start(self, job: _Job | None) -> None:
        """Start a thread for ``job`` (or the queue's next one).

        Raises:
            RuntimeError: the thread could not start (it holds no place then).
        """
        self._threads += 1
        worker = threading.Thread(
            target=self._work, args=(job,), name=f"toolkernel-worker-{self._threads}", daemon=True
        )
        try:
            worker.start()
        except BaseException:
            self._threads -= 1
            raise

    def _settled(self, job: _Job, future: asyncio.Future[Any]) -> None:
        """On the caller's loop: a cancelled future whose job runs abandons its thread,
        which then no longer holds a place that a queued job could use."""
        if not future.cancelled():
            return
        with self._lock:
            if not job.running or job.abandoned:
                return
            job.abandoned = True
            self._abandoned += 1
            if self._backlog and self._may_grow():
                try:
                    self._start(None)  # it takes the oldest queued job
                except RuntimeError:
                    _log.warning("no worker thread could start; queued tool calls wait")
                    return
                self._backlog -= 1
            elif self._backlog and self._threads == self._abandoned and not self._closed:
                # The last thread that could come back for the queued jobs is gone too:
                # they fail now, as a job submitted now would (_AllHeld).
                held = self._all_held()
                while self._backlog:
                    queued = self._jobs.get_nowait()
                    self._backlog -= 1
                    if queued is not None:
                        _deliver(queued.loop, _set_exception, queued.future, held)

    def _work(self, job: _Job | None) -> None:
        while True:
            if job is not None:
                self._run(job)
                with self._lock:
                    if self._threads - self._abandoned > self._max:
                        # A thread grown past max_threads while a tool was abandoned:
                        # with that tool back, it is one too many.
                        self._threads -= 1
                        return
                    if self._backlog:
                        self._backlog -= 1
                    elif self._closed:  # closed while this job ran: nothing more comes
                        self._threads -= 1
                        return
                    else:
                        self._idle += 1
            del job  # drop the finished job's result before waiting for the next
            try:
                job = self._jobs.get(timeout=_IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._idle:  # no submit claimed this thread meanwhile
                        self._idle -= 1
                        self._threads -= 1
                        return
                job = self._jobs.get()  # claimed: its job is on the way
            if job is None:  # close()
                return

    def _run(self, job: _Job) -> None:
        with self._lock:
            if job.future.done():  # the caller stopped waiting before it started
                return
            job.running = True
        try:
            result = job.fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task as is
            _deliver(job.loop, _set_exception, job.future, exc)
        else:
            _deliver(job.loop, _set_result, job.future, result)
        finally:
            with self._lock:
                job.running = False
                if job.abandoned:
                    self._abandoned -= 1


def _deliver(
    loop: asyncio.AbstractEventLoop,
    setter: Callable[[asyncio.Future[Any], Any], None],
    future: asyncio.Future[Any],
    value: Any,
) -> None:
    # A loop that closed meanwhile has nobody left waiting for the value.
    with suppress(RuntimeError):
        loop.call_soon_threadsafe(setter, future, value)


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():  # done: the awaiting task was cancelled and abandoned it
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if future.done():
        return
    if isinstance(exc, _NOT_HANDED_ON):
        # A future refuses StopIteration (the awaiting task would never wake). A Ctrl-C
        # never lands in a worker thread, so a KeyboardInterrupt or GeneratorExit from
        # one is the tool's own; handed on as is, it would stop the caller's loop (an
        # MCP gateway, with every other call in it).
        wrapped = _RaisedByTool()
        wrapped.__cause__ = exc
        exc = wrapped
    future.set_exception(exc)


_NOT_HANDED_ON: Final = (StopIteration, KeyboardInterrupt, GeneratorExit)


async def dispatch(adapter: Adapter, invocation: Invocation, token: CancellationToken) -> Outcome:
    """Run the call with its timeout, cancellation token and retry policy."""
    definition, name = invocation.tool.definition, invocation.tool.name
    retry = definition.retry
    started = time.perf_counter()
    attempt = 0
    history: list[str | None] = []
    while True:
        attempt += 1
        outcome = await _attempt(adapter, invocation, token, definition.timeout_ms / 1000)
        history.append(str(outcome.code) if outcome.code else None)
        if outcome.status is Status.SUCCEEDED or attempt >= retry.attempts:
            break
        may_retry = outcome.code in retry.on or (definition.idempotent and outcome.retryable)
        if not may_retry:
            break
        if token.cancelled or await _backoff(retry.delay_s(attempt), token):
            # Stopped before the retry it was due (cancelled, the budget spent, the
            # runtime closing): the call ends cancelled, for the token's reason, not
            # with the failure it would have retried, which would invite a retry.
            outcome = _stopped(token, name)
            outcome.internal["attemptCodes"] = history
            break
    outcome.attempts = attempt
    if attempt > 1:
        outcome.internal["attemptCodes"] = history
    outcome.duration_ms = (time.perf_counter() - started) * 1000
    return outcome


async def _attempt(
    adapter: Adapter, invocation: Invocation, token: CancellationToken, timeout_s: float
) -> Outcome:
    name = invocation.tool.name
    if token.cancelled:  # cancelled before this attempt could start: the tool never runs
        return _stopped(token, name)
    try:
        # sniffio's marks and the task, without the rest of its lookup: a third of its cost.
        task = _asyncio_task()
        if task is not None:
            output = await _guarded_asyncio(task, adapter, invocation, token, timeout_s)
        else:
            output = await _guarded(adapter, invocation, token, timeout_s)
        if output is _STOPPED:
            if token.reason is not None:
                return _from_code(token.reason, tool=name)
            return _from_code(ErrorCode.TIMEOUT, tool=name, seconds=f"{timeout_s:g}")
    except (ToolFailed, ToolPartial) as signal:
        return _signalled(name, signal)
    except CancelledByRuntime as signal:
        return _stopped_by(name, signal)
    except _RaisedByTool as carrier:
        return _tool_error(name, carrier.__cause__ or carrier)
    except Exception as exc:  # noqa: BLE001 - the isolation boundary around tool code
        return _tool_error(name, exc)
    except BaseException as exc:
        # SystemExit (argparse, click) or a custom BaseException from tool code is the
        # tool's failure, not the runtime's exit. A cancellation or Ctrl-C stays one.
        if isinstance(exc, (*_STOPPING, anyio.get_cancelled_exc_class())):
            raise
        return _tool_error(name, exc)
    if isinstance(output, ToolOutput):
        return _returned(name, output)
    return Outcome(Status.SUCCEEDED, output=output)


def _stopped(token: CancellationToken, name: str) -> Outcome:
    """CANCELLED for the token's reason: the outcome of a call it stopped before an
    attempt (or a retry) began."""
    return _from_code(token.reason or ErrorCode.USER_CANCELLED, tool=name)


_STOPPING: Final = (KeyboardInterrupt, GeneratorExit)
_CANCEL_REASONS: Final = frozenset(
    code for code, info in CATALOG.items() if info.status is Status.CANCELLED
)


def _signalled(name: str, signal: ToolFailed | ToolPartial) -> Outcome:
    """The result the tool shaped by raising ``signal``.

    The constructors refuse what could be neither shown nor recorded, but a subclass
    that skips them, or a signal changed after it was built, can carry anything: a
    message that is not text would fail the ledger write of the whole turn, a code
    outside the taxonomy the lookup. So the signal is built anew, which checks it again;
    a malformed one is the tool's failure, FAILED/TOOL_ERROR, with what is wrong in the
    traceback.
    """
    try:
        if isinstance(signal, ToolFailed):
            failed = ToolFailed(
                signal.safe_message,
                code=signal.code,
                retryable=signal.retryable,
                output=signal.output,
                artifacts=signal.artifacts,
            )
            info = CATALOG[failed.code]
            retryable = info.retryable if failed.retryable is None else failed.retryable
            return Outcome(
                status=info.status,
                code=failed.code,
                message=failed.safe_message,
                output=failed.output,
                artifacts=failed.artifacts,
                retryable=retryable,
            )
        partial = ToolPartial(signal.safe_message, output=signal.output, artifacts=signal.artifacts)
        return Outcome(
            Status.PARTIAL,
            message=partial.safe_message,
            output=partial.output,
            artifacts=partial.artifacts,
        )
    except Exception:  # noqa: BLE001 - the tool's object: whatever reading it raises
        return _tool_error(name, signal)


def _stopped_by(name: str, signal: CancelledByRuntime) -> Outcome:
    """CANCELLED for the token's reason; a reason that is no cancellation code (the
    tool raised the signal itself, wrongly) makes it the tool's failure."""
    reason = getattr(signal, "reason", None)
    if isinstance(reason, str) and reason in _CANCEL_REASONS:
        return _from_code(ErrorCode(reason), tool=name)
    return _tool_error(name, signal)


def _returned(name: str, output: ToolOutput) -> Outcome:
    """The result a tool shaped by returning ``output``. A summary that is not text, or
    artifacts that are not ``ArtifactRef``s, could be neither shown nor recorded: the
    tool broke its contract, FAILED/OUTPUT_CONTRACT_VIOLATION."""
    summary, refs = output.summary, output.artifacts
    if not isinstance(summary, str):
        why = f"ToolOutput.summary is of type {type(summary).__name__}, not str"
    elif not isinstance(refs, tuple | list):
        why = f"ToolOutput.artifacts is of type {type(refs).__name__}, not tuple"
    elif not all(isinstance(ref, ArtifactRef) for ref in refs):
        why = "ToolOutput.artifacts holds something other than an ArtifactRef"
    else:
        return Outcome(Status.SUCCEEDED, message=summary, output=output.data, artifacts=tuple(refs))
    outcome = _from_code(ErrorCode.OUTPUT_CONTRACT_VIOLATION, tool=name)
    outcome.internal["contractViolation"] = why
    return outcome


def _tool_error(name: str, exc: BaseException) -> Outcome:
    outcome = _from_code(
        ErrorCode.TOOL_ERROR, tool=name, detail=f"the tool raised {type(exc).__name__}."
    )
    outcome.internal["traceback"] = current_traceback()
    return outcome


MAX_TRACEBACK_CHARS: Final = 64 * 1024
"""Of a traceback kept in the ledger: its start and its end, where the error is."""


def current_traceback() -> str:
    """The exception being handled, formatted, cut in the middle to
    ``MAX_TRACEBACK_CHARS`` (an exception's message can be megabytes)."""
    text = traceback.format_exc()
    if len(text) <= MAX_TRACEBACK_CHARS:
        return text
    half = MAX_TRACEBACK_CHARS // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


_STOPPED: Any = object()  # the deadline passed or the token cancelled the call


class _RaisedByTool(Exception):
    """What the tool raised (``__cause__``) that would pass for something else: a
    CancelledError that cancelled nothing; a StopIteration, KeyboardInterrupt or
    GeneratorExit from its worker thread."""


async def _guarded(
    adapter: Adapter, invocation: Invocation, token: CancellationToken, timeout_s: float
) -> Any:
    """The adapter's output, or ``_STOPPED``, under an anyio scope (any backend)."""
    # One scope carries both the deadline and the token: cheaper than nesting a
    # fail_after inside a token scope, and the cause is told apart afterwards.
    with anyio.CancelScope(deadline=anyio.current_time() + timeout_s) as scope:
        token.attach(scope)
        try:
            output = await adapter.invoke(invocation)
        finally:
            token.detach(scope)
    return _STOPPED if scope.cancelled_caught else output


class _TaskWatch:
    """Cancels one asyncio task for its deadline or its token, and remembers it did."""

    __slots__ = ("_task", "done", "fired")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task
        self.fired = False
        self.done = False  # the attempt is over: a late timer or token must not touch it

    def cancel(self) -> None:
        if not (self.fired or self.done):
            self.fired = True
            self._task.cancel()


def _asyncio_task() -> asyncio.Task[Any] | None:
    """The asyncio task this runs in, where sniffio would say "asyncio"; None under
    another library, or outside any task (only the generic scope can help then).

    The library's own mark is read first, as sniffio does: trio run from inside an
    asyncio task (``trio.run`` in a notebook cell) has that task around it, which is
    not the one to cancel, and whose loop is not the one running.
    """
    named = sniffio.thread_local.name or sniffio.current_async_library_cvar.get()
    if named is not None and named != "asyncio":
        return None
    try:
        return asyncio.current_task()
    except RuntimeError:  # no asyncio event loop runs in this thread
        return None


async def _guarded_asyncio(
    task: asyncio.Task[Any],
    adapter: Adapter,
    invocation: Invocation,
    token: CancellationToken,
    timeout_s: float,
) -> Any:
    """``_guarded`` on asyncio, in ``task``, at a fraction of an anyio scope's cost.

    The deadline and the token cancel the task itself; the cancellation is taken back
    with ``uncancel`` exactly as ``asyncio.timeout`` does, so a cancellation from
    outside (an enclosing scope, the caller) still propagates.
    """
    loop = task.get_loop()
    deadline = loop.time() + timeout_s
    cancelling = task.cancelling()
    # Up to its first wait the tool runs in this step of the task, where neither the
    # deadline nor the token could stop it (a cancellation lands at an await): both are
    # armed at that first wait, the deadline as from now. A tool that answers without
    # waiting (from memory, a cache) is spared their cost.
    steps = adapter.invoke(invocation).__await__()
    try:
        first = steps.send(None)
    except StopIteration as done:
        return done.value
    except asyncio.CancelledError as exc:
        if task.cancelling() <= cancelling:
            raise _RaisedByTool from exc
        raise
    watch = _TaskWatch(task)
    timer = loop.call_at(deadline, watch.cancel)
    try:
        token.attach(watch)
        output = await _resume(steps, first)
    except asyncio.CancelledError as exc:
        if watch.fired and task.uncancel() <= cancelling:
            return _STOPPED
        if not watch.fired and task.cancelling() <= cancelling:
            # Nobody cancelled this task: the tool raised it (a future some library
            # cancelled under it). That is the tool's failure, not a stop.
            raise _RaisedByTool from exc
        raise
    except Exception:
        if watch.fired:
            # The tool caught the cancellation and failed otherwise: the request is
            # taken back as when it returns, or the task would keep it (the caller's
            # own TaskGroup or timeout would then take it for theirs).
            await _take_back(task, cancelling)
        raise
    finally:
        watch.done = True
        timer.cancel()
        token.detach(watch)
    if watch.fired:
        await _take_back(task, cancelling)
    return output


@types.coroutine
def _resume(steps: Generator[Any, None, Any], first: Any) -> Generator[Any, None, Any]:
    """Go on awaiting ``steps``, which has already yielded ``first`` (what ``yield
    from`` does after its first step): values and exceptions the task sends in are
    passed on, the result is returned."""
    value = first
    while True:
        thrown: BaseException | None = None
        try:
            yield value
        except GeneratorExit:
            steps.close()
            raise
        except BaseException as exc:  # noqa: BLE001 - thrown in by the task: the tool's to see
            thrown = exc
        # Passed on outside the handler: the tool's code up to its next await must not
        # run while this frame handles the exception (sys.exc_info, chained errors).
        try:
            value = steps.send(None) if thrown is None else steps.throw(thrown)
        except StopIteration as done:
            return done.value
        finally:
            thrown = None


async def _take_back(task: asyncio.Task[Any], cancelling: int) -> None:
    """Withdraw a cancellation requested from inside the task's own step (the token was
    already cancelled, or the tool cancelled it) when the tool returned without
    awaiting or swallowed it. Like an anyio scope that caught nothing, the output
    stands."""
    try:
        await asyncio.sleep(0)
    except asyncio.CancelledError:
        if task.uncancel() > cancelling:
            raise  # someone else cancelled this task too
    else:
        if task.cancelling() > cancelling:
            task.uncancel()


async def _backoff(delay_s: float, token: CancellationToken) -> bool:
    """Sleep before a retry; True when the token cancelled the wait."""
    with anyio.CancelScope() as scope:
        token.attach(scope)
        try:
            await anyio.sleep(delay_s)
        finally:
            token.detach(scope)
    return scope.cancelled_caught


_from_code: Final = Outcome.from_code

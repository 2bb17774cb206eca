"""The adapter for SANDBOX_READ_ONLY, SANDBOX_WRITE and PROCESS tools, and their `Sandbox`.

A tool in one of these modes is a Python handler, called like a native one; what the
mode changes is what the handler may *run*. While the call lasts, ``sandbox_for(ctx)``
returns a `Sandbox` bound to the call: its ``run(argv)`` starts the command under
bubblewrap with the mode's view of the workspace (read-only for SANDBOX_READ_ONLY,
writable otherwise), network only when the policy grants it to this tool, an
environment allow-list, and the configured limits. The output streams to files in the
artifact store's staging area and becomes two artifacts (stdout, stderr), the kernel's
known secrets masked in them; the handler gets a `CommandResult` with exit status,
bounded head and tail, and the refs. An OSError of the runtime's own on the way (out
of file descriptors, its state directory unusable) fails the call with INTERNAL_ERROR,
retryable when the shortage may pass; the operator's log says what failed.

Deadlines. The kernel wraps each attempt in ``fail_after(timeoutMs)``; a process
killed by that scope would lose its courtesy SIGTERM and its result. So a command's
own timer is set a little shorter (`reserve_s`: room for the grace period and for
storing the output), and on expiry ``run`` raises ``ToolFailed(TIMEOUT)`` carrying
the partial output's refs, which the kernel turns into TIMED_OUT. If the kernel's
scope is cancelled first (the call's token, or the backstop deadline), the runner
kills the tree at once and ``run`` stores what was captured, then reports it as
CANCELLED (with the token's reason) or TIMED_OUT. Any other cancellation propagates.

Unsandboxed runs exist only by explicit opt-in (``allow_unsandboxed``, used when
bubblewrap cannot start); every result of such a call carries ``"sandboxed": false``.
"""

from __future__ import annotations

import codecs
import contextvars
import logging
import os
import posixpath
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.to_thread

from toolkernel.artifacts import ArtifactStore
from toolkernel.calls import ArtifactRef
from toolkernel.codes import ErrorCode, safe_message
from toolkernel.config import CONFIG_FILENAME, Config
from toolkernel.context import ToolContext
from toolkernel.definition import ExecutionMode, Permissions, ToolDefinition
from toolkernel.dispatch import Adapter, Invocation, NativeAdapter
from toolkernel.errors import SandboxUnavailable, ToolFailed, runtime_failure
from toolkernel.policy import Action, scope_paths, write_scope
from toolkernel.redaction import Redactor
from toolkernel.sandbox import (
    TERM_GRACE_S,
    OutputCallback,
    SandboxLimits,
    SandboxSpec,
    find_bwrap,
    probe,
    run_sandboxed,
)
from toolkernel.state import state_paths
from toolkernel.tools.commands import DEFAULT_COMMAND_POLICY, CommandPolicy
from toolkernel.tools.planted import QUARANTINE_DIRNAME, Planted, PolicySnapshot

if TYPE_CHECKING:
    from toolkernel.pathguard import PathGuard

__all__ = [
    "DEFAULT_TEST_COMMAND",
    "SANDBOX_MODES",
    "CapturedStream",
    "CommandResult",
    "Sandbox",
    "SandboxAdapter",
    "SandboxSettings",
    "config_files",
    "protected_paths",
    "sandbox_for",
    "write_protected",
]

SANDBOX_MODES: Final = (
    ExecutionMode.SANDBOX_READ_ONLY,
    ExecutionMode.SANDBOX_WRITE,
    ExecutionMode.PROCESS,
)

DEFAULT_TEST_COMMAND: Final = ("python", "-m", "pytest", "-q", "--junitxml={junitxml}")
"""``verifier.run``'s command; ``{junitxml}`` becomes the report's path."""

PREVIEW_BYTES: Final = 2048
"""Bytes of head and of tail of each stream that the model sees."""

RUNNING_INTERVAL_S = 5.0  # not Final: tests shorten it
"""How often a call whose command still runs reports progress (TOOL_CALL_PROGRESS, and
``notifications/progress`` through the gateway): seconds so far, no total."""

_RESERVE_FRACTION: Final = 0.1
_RESERVE_MIN_S: Final = 0.5
_RESERVE_MAX_S: Final = 5.0
_ALWAYS_PATH: Final = ("/usr/local/bin", "/usr/bin", "/bin")

_log = logging.getLogger(__name__)
_CURRENT: contextvars.ContextVar[Sandbox | None] = contextvars.ContextVar(
    "toolkernel_sandbox", default=None
)


@dataclass(frozen=True, slots=True)
class SandboxSettings:
    """How sandboxed tools run; the ``[sandbox]`` section of the configuration.

    Attributes:
        allow_unsandboxed: when bubblewrap cannot start, run commands without it
            instead of refusing (each result then says ``"sandboxed": false``).
        bwrap: an explicit bubblewrap binary (path or command name).
        limits: CPU, memory, process, file-size and output ceilings per command.
        env_allow: host variables passed through by name (PATH, LANG, HOME and
            TMPDIR are always set by the runtime; nothing else enters).
        env_set: fixed variables for every command.
        secret_env: variables holding secrets; their values are also masked in
            everything the model sees.
        path: the command search path; default: the workspace's ``.venv/bin``, the
            runtime's interpreter directory, then the system directories.
        command_policy: allow/ask/deny rules for ``shell.run``.
        test_command: ``verifier.run``'s argv (``{junitxml}`` is substituted).
        rg: an explicit ripgrep binary for ``repo.search``.
    """

    allow_unsandboxed: bool = False
    bwrap: str | None = None
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    env_allow: tuple[str, ...] = ()
    env_set: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    secret_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    path: tuple[str, ...] | None = None
    command_policy: CommandPolicy = DEFAULT_COMMAND_POLICY
    test_command: tuple[str, ...] = DEFAULT_TEST_COMMAND
    rg: str | None = None


@dataclass(frozen=True, slots=True)
class CapturedStream:
    """One output stream: its size, a bounded head and tail, and the full artifact."""

    size: int
    head: str
    tail: str
    artifact: ArtifactRef | None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"bytes": self.size, "head": self.head}
        if self.tail:
            data["tail"] = self.tail
        if self.artifact is not None:
            data["artifact"] = self.artifact.id
        return data


@dataclass(frozen=True, slots=True)
class CommandResult:
    """How a command ended, with its output stored as artifacts."""

    argv: tuple[str, ...]
    exit_code: int | None
    timed_out: bool
    cancelled: bool
    stdout: CapturedStream
    stderr: CapturedStream
    output_truncated: bool
    duration_s: float
    sandboxed: bool

    @property
    def artifacts(self) -> tuple[ArtifactRef, ...]:
        return tuple(s.artifact for s in (self.stdout, self.stderr) if s.artifact is not None)

    def to_dict(self) -> dict[str, Any]:
        """The bounded projection: exit status, head/tail of each stream, artifact ids."""
        return {
            "exitCode": self.exit_code,
            "timedOut": self.timed_out,
            "cancelled": self.cancelled,
            "durationMs": round(self.duration_s * 1000),
            "stdout": self.stdout.to_dict(),
            "stderr": self.stderr.to_dict(),
            "outputTruncated": self.output_truncated,
            "sandboxed": self.sandboxed,
            "artifacts": [ref.to_dict() for ref in self.artifacts],
        }


class SandboxAdapter:
    """Runs sandbox-mode tools; register it for each of `SANDBOX_MODES`.

    Args:
        settings: how commands run.
        bwrap: the checked bubblewrap binary, or ``None`` to run unsandboxed (only
            what `create` does under ``allow_unsandboxed``).
    """

    def __init__(self, settings: SandboxSettings | None = None, *, bwrap: Path | None) -> None:
        self.settings = settings or SandboxSettings()
        self.bwrap = bwrap
        self._native = NativeAdapter()
        self._base_env = _base_env(self.settings)

    @classmethod
    def create(
        cls, config: Config | None = None, settings: SandboxSettings | None = None
    ) -> SandboxAdapter:
        """Find and probe bubblewrap; the adapter for ``config``'s sandboxed tools.

        Raises:
            SandboxUnavailable: bubblewrap cannot start here and unsandboxed runs were
                not allowed.
        """
        del config  # the [sandbox] keys arrive as ``settings`` until Config carries them
        settings = settings or SandboxSettings()
        try:
            bwrap = find_bwrap(settings.bwrap)
            probe(bwrap)
        except SandboxUnavailable as exc:
            if not settings.allow_unsandboxed:
                raise
            _log.warning("running sandbox-mode tools UNSANDBOXED (opted in): %s", exc.reason)
            return cls(settings, bwrap=None)
        return cls(settings, bwrap=bwrap)

    @property
    def sandboxed(self) -> bool:
        return self.bwrap is not None

    def adapters(self) -> dict[ExecutionMode, Adapter]:
        """This adapter for each sandbox mode, for ``Kernel(adapters=...)``."""
        return dict.fromkeys(SANDBOX_MODES, self)

    async def invoke(self, invocation: Invocation) -> Any:
        ctx = invocation.context
        if ctx.kernel is not None:
            # install() registers them up front; an adapter an embedder handed to the
            # kernel directly is known to it only from its first call.
            for value in self.settings.secret_env.values():
                ctx.kernel.redactor.add_secret(value)
        timeout_s = invocation.tool.definition.timeout_ms / 1000
        sandbox = Sandbox(self, invocation, anyio.current_time() + timeout_s)
        token = _CURRENT.set(sandbox)
        try:
            return await self._native.invoke(invocation)
        finally:
            _CURRENT.reset(token)


def sandbox_for(ctx: ToolContext) -> Sandbox:
    """The sandbox of the call ``ctx`` belongs to (inside a sandbox-mode handler).

    Raises:
        ToolFailed: the call is not running under a `SandboxAdapter`.
    """
    sandbox = _CURRENT.get()
    if sandbox is None or sandbox.call_id != ctx.tool_call_id:
        raise ToolFailed(
            safe_message(ErrorCode.INTERNAL_ERROR, tool="this tool"),
            code=ErrorCode.INTERNAL_ERROR,
        )
    return sandbox


class Sandbox:
    """What a sandbox-mode handler may run, bound to one call.

    Attributes:
        mode: the tool's execution mode.
        workspace: the resolved workspace directory.
        writable: whether commands may write the workspace.
        network: whether commands get the host network.
        sandboxed: False when commands run without bubblewrap (opt-in).
        artifacts: the kernel's artifact store.
        settings: the adapter's settings.
    """

    def __init__(self, adapter: SandboxAdapter, invocation: Invocation, deadline: float) -> None:
        ctx = invocation.context
        definition = invocation.tool.definition
        if ctx.kernel is None:
            raise ToolFailed(
                safe_message(ErrorCode.INTERNAL_ERROR, tool=definition.name),
                code=ErrorCode.INTERNAL_ERROR,
            )
        self._adapter = adapter
        self._ctx = ctx
        self._deadline = deadline
        self._call_timeout_s = definition.timeout_ms / 1000
        self.tool_name = definition.name
        self.call_id = ctx.tool_call_id
        self.mode = definition.execution_mode
        self.workspace = ctx.workspace
        self.writable = self.mode is not ExecutionMode.SANDBOX_READ_ONLY
        self.network = _network_allowed(ctx, definition)
        self.sandboxed = adapter.sandboxed
        store = ctx.kernel.artifacts
        # The output kept here outlives this process and what it knows: the store masks
        # the kernel's known secrets in it, even if the kernel did not give it them.
        self.artifacts = (
            store
            if store.redactor is ctx.kernel.redactor
            else ArtifactStore(store.root, redactor=ctx.kernel.redactor, max_bytes=store.max_bytes)
        )
        self.settings = adapter.settings
        self._env = {
            **adapter._base_env,
            "PATH": _search_path(adapter.settings, self.workspace),
        }

    def _protected_paths(self) -> tuple[Path, ...]:
        kernel = self._ctx.kernel
        assert kernel is not None
        # SANDBOX_READ_ONLY runs argv the runtime builds (ripgrep with the forbidden
        # globs excluded), never the model's own commands: hiding the state is enough,
        # and a second walk of the whole tree would double a search's cost.
        return protected_paths(
            kernel.config, kernel.guard, with_forbidden_files=self.writable, rg=self.settings.rg
        )

    @property
    def remaining_s(self) -> float:
        """Seconds a command may still run before this call must wrap up."""
        return self._deadline - anyio.current_time() - _reserve_s(self._call_timeout_s)

    async def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str = ".",
        timeout_s: float | None = None,
        label: str = "command",
        env: Mapping[str, str] | None = None,
        rw_dirs: Sequence[Path] = (),
        on_stdout: OutputCallback | None = None,
    ) -> CommandResult:
        """Run ``argv`` to completion in the sandbox and store its output.

        Args:
            argv: program and arguments (never a shell string).
            cwd: workspace-relative working directory (already checked by the guard).
            timeout_s: wall-clock limit; capped by what is left of the call's timeout.
            label: names the artifacts ("pytest stdout").
            env: extra variables for this command only.
            rw_dirs: private host directories (outside the workspace) the command
                may write to, e.g. for a report the runtime reads back.
            on_stdout: called with each chunk of stdout as it is stored (on the
                event loop: keep it quick).

        Returns:
            The result, whatever the exit status.

        Raises:
            ToolFailed: the command timed out (TIMEOUT) or the call was cancelled (the
                token's reason); its output carries the partial output's refs.
        """
        budget = self.remaining_s
        timeout = budget if timeout_s is None else min(timeout_s, budget)
        if timeout <= 0:
            raise ToolFailed(self._timeout_message(timeout_s), code=ErrorCode.TIMEOUT)
        kernel = self._ctx.kernel
        assert kernel is not None
        try:
            views = await self._views()
            # A policy file that does not exist cannot be mounted read-only, and a
            # mounted one's directory can be moved aside: whatever the command did to
            # any toolkernel.toml is undone when it ends (see toolkernel.tools.planted).
            snapshot = (
                PolicySnapshot.take(
                    kernel.policy_files,
                    self.workspace,
                    views["policy"],
                    quarantine=kernel.config.state_dir / QUARANTINE_DIRNAME,
                )
                if self.writable
                else None
            )
            staging = self.artifacts.staging_dir()
        except Exception as exc:
            failure = self._failure(exc, "could not prepare the command")
            if failure is None:
                raise
            raise failure from None
        spec = SandboxSpec(
            workspace=self.workspace,
            writable=self.writable,
            network=self.network,
            env={**self._env, **(env or {})},
            cwd=cwd,
            limits=self.settings.limits,
            extra_ro_binds=_interpreter_prefixes(),
            read_only=views["read_only"],
            write_dirs=self._write_dirs(),
            hidden=views["hidden"],
            extra_rw_binds=rw_dirs,
        )
        out_dir = staging / "out"
        grace = min(TERM_GRACE_S, _RESERVE_FRACTION * self._call_timeout_s)
        try:
            result = await self._run(argv, spec, staging, out_dir, timeout, grace, label, on_stdout)
        except ToolFailed as failed:  # timed out or cancelled: the violation matters more
            with anyio.CancelScope(shield=True):  # the call may be cancelled again meanwhile
                planted = await self._restore(snapshot)
            if planted:
                raise planted.violation(
                    "The command", self.workspace, output=failed.output, artifacts=failed.artifacts
                ) from failed
            raise
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._restore(snapshot)
            raise
        planted = await self._restore(snapshot)
        if planted:
            raise planted.violation(
                "The command", self.workspace, output=result.to_dict(), artifacts=result.artifacts
            )
        return result

    def _write_dirs(self) -> tuple[Path, ...] | None:
        """What the command may write: the run's write scope, where it has one."""
        kernel, run = self._ctx.kernel, self._ctx.run
        if not self.writable or kernel is None or run is None:
            return None
        return scope_paths(write_scope(kernel.config.policy, run.context), self.workspace)

    async def _views(self) -> dict[str, tuple[Path, ...]]:
        """What the command must not see, nor change, and the policy files now: the
        tree walks, side by side."""
        kernel = self._ctx.kernel
        assert kernel is not None
        views: dict[str, tuple[Path, ...]] = {"read_only": (), "policy": ()}

        async def view(key: str, listing: Callable[[], tuple[Path, ...]]) -> None:
            views[key] = await anyio.to_thread.run_sync(listing)

        async with anyio.create_task_group() as group:
            group.start_soon(view, "hidden", self._protected_paths)
            if self.writable:
                config, rg = kernel.config, self.settings.rg
                code = kernel.host_code
                group.start_soon(
                    view, "read_only", lambda: write_protected(config, self.workspace, rg, code)
                )
                group.start_soon(view, "policy", partial(config_files, self.workspace))
        return views

    def _failure(self, exc: Exception, doing: str) -> ToolFailed | None:
        """The INTERNAL_ERROR of the OSError ``exc`` is or holds (a task group's), raised
        by the runtime's own work for the call; ``None`` when it holds none."""
        failed = _os_error(exc)
        return None if failed is None else self._internal_error(failed, doing)

    def _internal_error(self, failed: OSError, doing: str) -> ToolFailed:
        """An OSError of the runtime's own (out of file descriptors, its state directory
        unusable) is neither the tool's fault nor the workspace's: the model gets
        INTERNAL_ERROR without the host path, the operator's log says what failed."""
        _log.error("%s %s: %s", self.tool_name, doing, failed)
        return runtime_failure(self.tool_name, failed)

    async def _restore(self, snapshot: PolicySnapshot | None) -> Planted:
        if snapshot is None:
            return Planted()
        return await snapshot.restore_async(partial(config_files, self.workspace))

    async def _run(
        self,
        argv: Sequence[str],
        spec: SandboxSpec,
        staging: Path,
        out_dir: Path,
        timeout: float,
        grace: float,
        label: str,
        on_stdout: OutputCallback | None = None,
    ) -> CommandResult:
        started = time.monotonic()
        try:
            outcome = await run_sandboxed(
                list(argv),
                spec,
                bwrap=self._adapter.bwrap or Path("bwrap"),
                timeout_s=timeout,
                output_dir=out_dir,
                unsandboxed=not self.sandboxed,
                term_grace_s=grace,
                on_output=on_stdout,
                on_running=self._still_running,
                running_interval_s=RUNNING_INTERVAL_S,
            )
        except SandboxUnavailable as exc:  # this workspace cannot be sandboxed as it is
            _log.error("%s was not run: %s", self.tool_name, exc.reason)
            with anyio.CancelScope(shield=True):  # nothing ran: nothing staged is kept
                await anyio.to_thread.run_sync(shutil.rmtree, staging, True)  # ignore_errors
            message = safe_message(ErrorCode.SANDBOX_UNAVAILABLE, tool=self.tool_name)
            raise ToolFailed(
                f"{message} {exc.advice}" if exc.advice else message,
                code=ErrorCode.SANDBOX_UNAVAILABLE,
            ) from None
        except anyio.get_cancelled_exc_class():
            # The kernel's scope fired first; the runner already killed the tree.
            with anyio.CancelScope(shield=True):
                stdout, stderr = await self._keep_output(staging, label)
            partial = CommandResult(
                argv=tuple(argv),
                exit_code=None,
                timed_out=not self._ctx.token.cancelled,
                cancelled=self._ctx.token.cancelled,
                stdout=stdout,
                stderr=stderr,
                output_truncated=False,
                duration_s=time.monotonic() - started,
                sandboxed=self.sandboxed,
            )
            token = self._ctx.token
            if token.cancelled and token.reason is not None:
                message = safe_message(token.reason, tool=self.tool_name)
                raise ToolFailed(
                    message,
                    code=token.reason,
                    output=partial.to_dict(),
                    artifacts=partial.artifacts,
                ) from None
            if anyio.current_time() >= self._deadline:
                raise ToolFailed(
                    self._timeout_message(None),
                    code=ErrorCode.TIMEOUT,
                    output=partial.to_dict(),
                    artifacts=partial.artifacts,
                ) from None
            raise
        except Exception as exc:
            # The runtime itself failed (its disk full while the output was kept, say):
            # what was staged goes, or it would hold the space for every later call.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(shutil.rmtree, staging, True)  # ignore_errors
            failure = self._failure(exc, "could not run the command or keep its output")
            if failure is None:
                raise
            raise failure from None
        with anyio.CancelScope(shield=True):  # bounded by the output cap
            stdout, stderr = await self._keep_output(staging, label)
        result = CommandResult(
            argv=tuple(argv),
            exit_code=outcome.exit_code,
            timed_out=outcome.timed_out,
            cancelled=outcome.cancelled,
            stdout=stdout,
            stderr=stderr,
            output_truncated=outcome.truncated,
            duration_s=outcome.duration_s,
            sandboxed=self.sandboxed,
        )
        if result.timed_out:
            raise ToolFailed(
                self._timeout_message(timeout),
                code=ErrorCode.TIMEOUT,
                output=result.to_dict(),
                artifacts=result.artifacts,
            )
        return result

    def _still_running(self, elapsed_s: float, output_bytes: int) -> None:
        self._ctx.progress(
            round(elapsed_s, 1),
            None,
            f"{self.tool_name}: the command has run for {elapsed_s:.0f} s "
            f"and written {output_bytes:,} bytes of output",
        )

    def _timeout_message(self, seconds: float | None) -> str:
        shown = self._call_timeout_s if seconds is None else seconds
        return safe_message(ErrorCode.TIMEOUT, tool=self.tool_name, seconds=f"{shown:.3g}")

    async def _keep_output(
        self, staging: Path, label: str
    ) -> tuple[CapturedStream, CapturedStream]:
        """The command's stdout and stderr, kept as artifacts (previews and refs)."""
        out_dir = staging / "out"

        def ingest() -> tuple[CapturedStream, CapturedStream]:
            try:
                return (
                    _capture(self.artifacts, out_dir / "stdout", f"{label} stdout", self.call_id),
                    _capture(self.artifacts, out_dir / "stderr", f"{label} stderr", self.call_id),
                )
            finally:
                # Empty unless ingesting failed (a full disk): then it goes with its files.
                shutil.rmtree(staging, ignore_errors=True)

        try:
            return await anyio.to_thread.run_sync(ingest)
        except OSError as exc:
            raise self._internal_error(exc, "could not keep the command's output") from None


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError ``exc`` is, or holds (a task group's ExceptionGroup), if any."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _os_error(inner)
            if found is not None:
                return found
    return None


def _capture(store: ArtifactStore, path: Path, description: str, producer: str) -> CapturedStream:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return CapturedStream(0, "", "", None)
    if size == 0:
        path.unlink()
        return CapturedStream(0, "", "", None)
    # A preview cut inside a line keeps what redaction alone could miss: a value whose
    # keyword the cut dropped (" = S3cr3t…"). The part kept is taken with clip, which
    # looks for secrets in the text around it.
    redactor = store.redactor or Redactor(Path("/"))
    unused: Counter[str] = Counter()
    # Both cuts fall between characters, and the tail starts after the head's last
    # byte: a character cut in two would show as U+FFFD, and its rest in both.
    with path.open("rb") as handle:
        window = handle.read(PREVIEW_BYTES + _EDGE_BYTES)
        head = _text(window)
        head_end = len(window)
        if size > PREVIEW_BYTES:
            head_end = len(_whole_characters(_cut_head(window, PREVIEW_BYTES)))
            head = redactor.clip(head, 0, len(_text(window[:head_end])), unused)
        tail = ""
        if size > 2 * PREVIEW_BYTES:
            handle.seek(max(size - PREVIEW_BYTES - _EDGE_BYTES, head_end))
            data = _from_character_start(handle.read())
            before = _text(data)
            kept = len(_text(_from_character_start(_cut_tail(data, PREVIEW_BYTES))))
            tail = redactor.clip(before, len(before) - kept, len(before), unused)
        elif size > PREVIEW_BYTES:
            handle.seek(head_end)
            tail = _text(handle.read())
    ref = store.put_file(
        path, media_type="text/plain", description=description, producer=producer, move=True
    )
    # The size of what is kept (its known secrets masked): artifact.read's offsets.
    return CapturedStream(ref.size, head, tail, ref)


# Previews are cut at line ends where one is near, and a token cut in half is dropped:
# redaction sees each preview alone, and half a secret matches no rule.
_EDGE_BYTES: Final = 4096
_TRAILING_TOKEN: Final = re.compile(rb"[A-Za-z0-9_\-+/=.:@%]+$")
_LEADING_TOKEN: Final = re.compile(rb"[A-Za-z0-9_\-+/=.:@%]+")


def _cut_head(data: bytes, limit: int) -> bytes:
    newline = data.find(b"\n", limit)
    if newline != -1:
        return data[: newline + 1]
    cut = data[:limit]
    trailing = _TRAILING_TOKEN.search(cut)
    return cut[: trailing.start()] if trailing else cut


def _cut_tail(data: bytes, limit: int) -> bytes:
    start = max(len(data) - limit, 0)
    newline = data.rfind(b"\n", 0, start)
    if newline != -1:
        return data[newline + 1 :]
    cut = data[start:]
    leading = _LEADING_TOKEN.match(cut)
    return cut[leading.end() :] if leading and start > 0 else cut


def _whole_characters(data: bytes) -> bytes:
    """``data`` without a UTF-8 character cut in two at its end."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    decoder.decode(data)
    pending = decoder.getstate()[0]  # the start of a character still waiting for its rest
    return data[: len(data) - len(pending)]


def _from_character_start(data: bytes) -> bytes:
    """``data`` without the rest of a UTF-8 character cut in two at its start."""
    skip = 0
    while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
        skip += 1
    return data[skip:]


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _reserve_s(call_timeout_s: float) -> float:
    """Time kept back from a command for its SIGTERM grace and for storing its output."""
    grace = min(TERM_GRACE_S, _RESERVE_FRACTION * call_timeout_s)
    margin = min(_RESERVE_MAX_S, max(_RESERVE_MIN_S, _RESERVE_FRACTION * call_timeout_s))
    return grace + min(margin, 0.3 * call_timeout_s)


def protected_paths(
    config: Config, guard: PathGuard, *, with_forbidden_files: bool, rg: str | None = None
) -> tuple[Path, ...]:
    """What a sandboxed process must not see: the runtime's state and, with
    ``with_forbidden_files``, every forbidden file in the workspace.

    The path guard keeps forbidden paths out of tool *arguments*; a process could
    still open them by name, so they are masked in its view of the workspace.
    Listing is ripgrep's (fast, parallel); the kernel's own globs decide.
    """
    workspace = guard.workspace
    hidden = list(state_paths(config))  # the sandbox skips those that do not exist
    if not with_forbidden_files:
        return tuple(hidden)
    listing = _rg_files(workspace, rg, "!.git", "!.toolkernel")
    state_dirs = [path for path in hidden if path.is_dir()]
    forbidden: list[str] = []
    mixed: set[str] = set()  # directories holding a file the process may see
    for relative in listing:
        if guard.is_forbidden(relative):
            forbidden.append(relative)
        else:
            directory = posixpath.dirname(relative)
            while directory and directory not in mixed:
                mixed.add(directory)
                directory = posixpath.dirname(directory)
    # A directory of forbidden files only is hidden whole: one mount, not one per file
    # (a test suite's thousands of *.pem fixtures would exceed what bubblewrap takes).
    chosen: dict[str, None] = {}
    for relative in forbidden:
        parts = relative.split("/")
        whole = next(
            (
                "/".join(parts[:depth])
                for depth in range(1, len(parts))
                if "/".join(parts[:depth]) not in mixed
            ),
            relative,
        )
        chosen[whole] = None
    for relative in chosen:
        path = workspace / relative
        if any(path.is_relative_to(d) for d in state_dirs):  # hidden whole already
            continue
        if relative in forbidden or _only_forbidden(path, workspace, guard):
            hidden.append(path)
        else:  # holds what ripgrep does not list (a symlink, a FIFO): file by file
            hidden.extend(workspace / f for f in forbidden if f.startswith(f"{relative}/"))
    return tuple(hidden)


def _only_forbidden(directory: Path, workspace: Path, guard: PathGuard) -> bool:
    """Whether everything in ``directory`` is a forbidden regular file (or an empty
    directory): hidden whole, it then hides nothing a process may see."""
    for root, dirs, files in os.walk(directory):
        for name in files:
            path = Path(root, name)
            relative = path.relative_to(workspace).as_posix()
            if path.is_symlink() or not path.is_file() or not guard.is_forbidden(relative):
                return False
        if any(Path(root, name).is_symlink() for name in dirs):
            return False
    return True


def _network_allowed(ctx: ToolContext, definition: ToolDefinition) -> bool:
    """Only a tool that declares network, under a policy and profile that grant it."""
    if ctx.kernel is None or not definition.permissions.network:
        return False
    policy = ctx.kernel.config.policy
    if policy.network is Action.DENY:
        return False
    profile = ctx.run.context.profile if ctx.run is not None else ctx.kernel.config.profile
    return policy.profiles.get(profile, Permissions()).network


def _base_env(settings: SandboxSettings) -> dict[str, str]:
    env = {
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "HOME": "/tmp",  # noqa: S108 - the sandbox's private tmpfs, not the host's /tmp
        "TMPDIR": "/tmp",  # noqa: S108 - same private tmpfs
    }
    for name in settings.env_allow:
        if name in os.environ:
            env[name] = os.environ[name]
    env.update(settings.env_set)
    env.update(settings.secret_env)
    return env


def _search_path(settings: SandboxSettings, workspace: Path) -> str:
    if settings.path is not None:
        return ":".join(settings.path)
    # The project's own virtualenv first (its pytest, its dependencies), then the
    # interpreter the runtime itself runs on, then the system.
    entries = [str(workspace / ".venv" / "bin")] if (workspace / ".venv" / "bin").is_dir() else []
    entries += [str(Path(sys.executable).parent), *_ALWAYS_PATH]
    return ":".join(dict.fromkeys(entries))


def write_protected(
    config: Config, workspace: Path, rg: str | None = None, host_code: Iterable[Path] = ()
) -> tuple[Path, ...]:
    """What a process with the workspace writable may read but never change: every
    repository's ``.git`` (hooks and config run later, on the host), every
    ``toolkernel.toml``, the runtime's own configuration file when it lies in the
    workspace, and ``host_code`` (the tool code it loads: ``Kernel.host_code``)."""
    listing = _rg_files(
        workspace, rg, "**/.git/HEAD", "**/.git", f"**/{CONFIG_FILENAME}", "!.toolkernel"
    )
    protected = []
    for relative in listing:
        found = workspace / relative
        if found.parent.is_symlink():
            continue
        # A repository's .git (from its HEAD), a submodule's or worktree's .git file
        # (it names the git directory that git in there uses, hooks and all), or a
        # configuration file at any depth: a runtime started in that directory would
        # read it as its policy.
        protected.append(found.parent if found.name == "HEAD" else found)
    top = workspace / ".git"
    if top.exists() and not top.is_symlink() and top not in protected:
        protected.append(top)  # a worktree's or submodule's .git file
    source = config.source.resolve() if config.source is not None else None
    if source is not None and source.is_relative_to(workspace) and source not in protected:
        protected.append(source)
    for own in (*_runtime_installation(rg), *host_code):
        if own.is_relative_to(workspace) and own not in protected:
            protected.append(own)
    return tuple(protected)


def _runtime_installation(rg: str | None) -> list[Path]:
    """What the runtime itself runs on the host, later: its virtual environment (the
    Python, the packages, the bubblewrap wheel's binary) and ripgrep. In a workspace
    (a project's own ``.venv``), a command could otherwise replace them and have the
    next ``toolkernel`` run its code outside any sandbox."""
    own: list[Path] = []
    if sys.prefix != sys.base_prefix:  # a virtual environment, not the system's Python
        own.append(Path(sys.prefix).resolve())
    if rg is not None:
        own.append(Path(rg).resolve())
    return own


def config_files(workspace: Path) -> tuple[Path, ...]:
    """Every entry named ``toolkernel.toml`` in the workspace now, whatever it is: a
    file, or a symlink (which ripgrep would skip, and a runtime started there would
    follow), a FIFO, a directory. Symlinked directories are not entered; the runtime's
    state is left out."""
    found: list[Path] = []
    top = str(workspace)
    for root, dirs, files in os.walk(workspace, followlinks=False):
        if root == top and ".toolkernel" in dirs:
            dirs.remove(".toolkernel")
        if CONFIG_FILENAME in files or CONFIG_FILENAME in dirs:
            found.append(Path(root) / CONFIG_FILENAME)
    return tuple(found)


def _rg_files(workspace: Path, rg: str | None, *globs: str) -> list[str]:
    """The workspace-relative names of the files ripgrep lists under ``globs``: hidden
    and ignored ones too, since what a process could open is what counts."""
    from toolkernel.tools.search import find_rg  # search builds on this module

    listing = subprocess.run(
        [
            find_rg(rg),
            *("--files", "--hidden", "--no-ignore", "--no-config", "--null"),
            *(arg for glob in globs for arg in ("--glob", glob)),
        ],
        cwd=workspace,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return [os.fsdecode(raw) for raw in listing.stdout.split(b"\0") if raw]


def _interpreter_prefixes() -> tuple[Path, ...]:
    """The runtime's Python installation, so ``sh -c 'python …'`` works inside too."""
    prefixes = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    return tuple(p for p in sorted(prefixes) if not p.is_relative_to("/usr"))

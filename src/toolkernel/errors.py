"""Exceptions, split by who raises them and who handles them.

::

    ToolkernelError                 caller-facing: the embedding program or the CLI handles it
    ├── ConfigError                 toolkernel.toml is missing a key, has a bad value, …
    ├── DefinitionError             a tool definition is invalid (names the field)
    ├── LedgerError                 the audit ledger cannot be written or read
    ├── SandboxUnavailable          bubblewrap cannot start here (modes that need it refused)
    └── UsageError                  the API was used wrongly (developer misuse)

    ToolSignal                      raised by a tool author inside a tool; becomes a result
    ├── ToolFailed                  FAILED with a chosen code and safe message
    └── ToolPartial                 PARTIAL: output is usable but incomplete

Anything else raised inside a tool is caught at the one isolation boundary (the adapter
call in ``dispatch``) and becomes ``FAILED/TOOL_ERROR``; its traceback goes to the
ledger, never to the model. So does a signal whose constructor refuses its arguments
(a message that is not text, a code outside the taxonomy), and one that a subclass
built around those checks: ``dispatch`` checks them again.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from typing import Any, ClassVar, Final

from toolkernel.calls import ArtifactRef
from toolkernel.codes import ErrorCode, safe_message

__all__ = [
    "RESOURCE_SHORTAGES",
    "ConfigError",
    "DefinitionError",
    "LedgerCorrupted",
    "LedgerError",
    "LedgerMissing",
    "ProcessStopped",
    "SandboxUnavailable",
    "ToolFailed",
    "ToolPartial",
    "ToolSignal",
    "ToolkernelError",
    "UsageError",
    "runtime_failure",
]

RESOURCE_SHORTAGES: Final = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN))
"""``errno`` values of a shortage of the runtime's own that may pass (descriptors,
memory, processes): a call that failed of one may be repeated. A full disk or a broken
state directory waits for the user."""


class ToolkernelError(Exception):
    """Base of every error the runtime raises to its caller."""


class ConfigError(ToolkernelError):
    """The configuration cannot be used; the message names the file and the key."""


class DefinitionError(ToolkernelError):
    """A tool definition is invalid; ``field`` names the offending field."""

    def __init__(self, tool: str, field: str, problem: str) -> None:
        self.tool = tool
        self.field = field
        self.problem = problem
        where = f"{tool}: " if tool else ""
        super().__init__(f"{where}field '{field}': {problem}")


class LedgerError(ToolkernelError):
    """The ledger could not record or read events; nothing is silently lost.

    ``maybe_stored`` is set when an append's connection dropped during its commit and
    the ledger could not find out whether it was stored: appending the same events
    again could store them twice (``verify`` and ``events`` tell, once it is reachable).
    """

    maybe_stored: bool = False


class LedgerCorrupted(LedgerError):
    """The ledger holds a record that cannot be trusted: an event that cannot be
    decoded, or an idempotency index entry that points at no event (``ledger verify``
    says more). The kernel refuses a call that depends on it rather than run it."""


class LedgerMissing(LedgerError):
    """A ledger opened only to be read is not there: nothing was recorded where the
    configuration points yet (or the path or schema is wrong)."""


class SandboxUnavailable(ToolkernelError):
    """The sandbox cannot start on this machine; ``reason`` says why (to the operator),
    ``advice`` what the model may be told too (no host path; empty: nothing)."""

    def __init__(self, reason: str, *, advice: str = "") -> None:
        self.reason = reason
        self.advice = advice
        super().__init__(f"sandbox unavailable: {reason}")


class UsageError(ToolkernelError):
    """The runtime was called in a way its API does not allow."""


class ProcessStopped(KeyboardInterrupt):
    """The process was told to stop (SIGTERM, SIGHUP), raised where Ctrl-C would be:
    a call it interrupts is recorded as CANCELLED/RUNTIME_STOPPED, retryable, not as
    the user's cancel.

    Raised in the event loop's own code, it reaches the calls as a cancellation of
    their tasks: ``underway``, set by whoever raises it, tells those apart too.
    """

    underway: ClassVar[bool] = False
    """Set once the process is stopping: from then on an interrupted call was stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class ToolSignal(Exception):
    """Raised by tool code to shape its own result."""


class ToolFailed(ToolSignal):
    """The tool could not do its job; the model sees ``safe_message``.

    Args:
        safe_message: what the model may read; keep secrets and host paths out of it.
        code: one of the FAILED codes of the taxonomy.
        retryable: whether the same call may succeed later; defaults to the code's.
        output: structured output to return alongside the failure.
        artifacts: refs to output kept in the artifact store (e.g. partial output).

    Raises:
        TypeError: ``safe_message`` is not a str, ``retryable`` not a bool or None, or
            an artifact not an ``ArtifactRef``.
        ValueError: ``code`` is not in the taxonomy.
    """

    def __init__(
        self,
        safe_message: str,
        *,
        code: ErrorCode = ErrorCode.TOOL_ERROR,
        retryable: bool | None = None,
        output: Any = None,
        artifacts: Sequence[ArtifactRef] = (),
    ) -> None:
        super().__init__(safe_message)
        self.safe_message = _text("ToolFailed", safe_message)
        self.code = _known("ToolFailed", code)
        if retryable is not None and type(retryable) is not bool:
            raise TypeError(
                f"ToolFailed's retryable must be True, False or None, "
                f"not {type(retryable).__name__}"
            )
        self.retryable = retryable
        self.output = output
        self.artifacts = _refs("ToolFailed", artifacts)


class ToolPartial(ToolSignal):
    """The tool produced usable but incomplete output.

    Raises:
        TypeError: ``safe_message`` is not a str, or an artifact not an ``ArtifactRef``.
    """

    def __init__(
        self, safe_message: str, *, output: Any = None, artifacts: Sequence[ArtifactRef] = ()
    ) -> None:
        super().__init__(safe_message)
        self.safe_message = _text("ToolPartial", safe_message)
        self.output = output
        self.artifacts = _refs("ToolPartial", artifacts)


# Checked where the tool raises the signal, so that its author's traceback points at the
# mistake (``ToolFailed(exc)``): what is not text cannot be shown to the model or recorded.


def runtime_failure(tool: str, failed: OSError) -> ToolFailed:
    """The failure of a call whose runtime work (not the tool's, not the workspace's)
    raised ``failed``: out of file descriptors, its state directory unusable. The model
    gets INTERNAL_ERROR without the host path the error names, retryable when the
    shortage may pass (``RESOURCE_SHORTAGES``); the caller logs what failed."""
    return ToolFailed(
        safe_message(ErrorCode.INTERNAL_ERROR, tool=tool),
        code=ErrorCode.INTERNAL_ERROR,
        retryable=failed.errno in RESOURCE_SHORTAGES,
    )


def _text(signal: str, safe_message: object) -> str:
    if not isinstance(safe_message, str):
        raise TypeError(f"{signal}'s safe_message must be a str, not {type(safe_message).__name__}")
    return safe_message


def _known(signal: str, code: str) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        shown = repr(code)
        shown = shown if len(shown) <= 80 else shown[:79] + "…"
        raise ValueError(f"{signal}'s code must be an ErrorCode, not {shown}") from None


def _refs(signal: str, artifacts: Sequence[ArtifactRef]) -> tuple[ArtifactRef, ...]:
    refs = tuple(artifacts)
    for ref in refs:
        if not isinstance(ref, ArtifactRef):
            raise TypeError(f"{signal}'s artifacts must be ArtifactRefs, not {type(ref).__name__}")
    return refs

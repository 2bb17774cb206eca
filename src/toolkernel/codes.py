"""Statuses and the closed error-code taxonomy.

Every code belongs to exactly one status, says whether the same call may succeed if
repeated later (``retryable``), and has a safe-message template: the text the model
may read. Templates name what went wrong and what to do next; they never carry policy
internals, host paths, stack traces or echoed input beyond short, sanitised names.

The taxonomy is closed: adapters and tools pick a code from here, they do not invent
new ones. ``docs/error-codes.md`` is generated from this table (``toolkernel codes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from string import Formatter
from typing import Final

__all__ = ["CATALOG", "CodeInfo", "ErrorCode", "Status", "safe_field", "safe_message"]


class Status(StrEnum):
    """The outcome of a tool call, as the model and the ledger see it."""

    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    DENIED = "DENIED"
    INVALID_ARGUMENTS = "INVALID_ARGUMENTS"
    TIMED_OUT = "TIMED_OUT"
    CANCELLED = "CANCELLED"
    PARTIAL = "PARTIAL"


class ErrorCode(StrEnum):
    """Why a call did not simply succeed. Grouped by the status each one carries."""

    # INVALID_ARGUMENTS: the proposal is malformed; no dispatch happened.
    ARGUMENTS_TOO_LARGE = "ARGUMENTS_TOO_LARGE"
    ARGUMENTS_NOT_JSON = "ARGUMENTS_NOT_JSON"
    ARGUMENTS_NOT_OBJECT = "ARGUMENTS_NOT_OBJECT"
    ARGUMENTS_INVALID_UTF8 = "ARGUMENTS_INVALID_UTF8"
    DUPLICATE_KEY = "DUPLICATE_KEY"
    DUPLICATE_CALL_ID = "DUPLICATE_CALL_ID"
    NON_FINITE_NUMBER = "NON_FINITE_NUMBER"
    NUMBER_TOO_LARGE = "NUMBER_TOO_LARGE"
    NESTING_TOO_DEEP = "NESTING_TOO_DEEP"
    UNKNOWN_PROPERTY = "UNKNOWN_PROPERTY"
    MISSING_PROPERTY = "MISSING_PROPERTY"
    TYPE_MISMATCH = "TYPE_MISMATCH"
    OUT_OF_BOUNDS = "OUT_OF_BOUNDS"
    NOT_IN_ENUM = "NOT_IN_ENUM"
    SCHEMA_VIOLATION = "SCHEMA_VIOLATION"
    INVALID_PATH = "INVALID_PATH"
    ABSOLUTE_PATH = "ABSOLUTE_PATH"
    PATH_TRAVERSAL = "PATH_TRAVERSAL"
    SYMLINK_ESCAPE = "SYMLINK_ESCAPE"
    FORBIDDEN_PATH = "FORBIDDEN_PATH"
    COMMAND_NOT_ALLOWED = "COMMAND_NOT_ALLOWED"
    IDEMPOTENCY_CONFLICT = "IDEMPOTENCY_CONFLICT"

    # DENIED: well-formed, but this run may not do it now; no dispatch happened.
    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    UNKNOWN_VERSION = "UNKNOWN_VERSION"
    TOOL_NOT_EXPOSED = "TOOL_NOT_EXPOSED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RUN_STATE_DENIED = "RUN_STATE_DENIED"
    POLICY_DENIED = "POLICY_DENIED"
    WRITE_SCOPE_DENIED = "WRITE_SCOPE_DENIED"
    PATH_DENIED = "PATH_DENIED"
    NETWORK_NOT_ALLOWED = "NETWORK_NOT_ALLOWED"
    APPROVAL_REQUIRED = "APPROVAL_REQUIRED"
    APPROVAL_REJECTED = "APPROVAL_REJECTED"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    RATE_LIMITED = "RATE_LIMITED"
    IDEMPOTENCY_IN_PROGRESS = "IDEMPOTENCY_IN_PROGRESS"
    POLICY_ERROR = "POLICY_ERROR"
    SANDBOX_UNAVAILABLE = "SANDBOX_UNAVAILABLE"

    # FAILED: the tool ran (or tried to) and did not succeed.
    TOOL_ERROR = "TOOL_ERROR"
    PROCESS_EXIT_NONZERO = "PROCESS_EXIT_NONZERO"
    PRECONDITION_FAILED = "PRECONDITION_FAILED"
    NOT_FOUND = "NOT_FOUND"
    OUTPUT_CONTRACT_VIOLATION = "OUTPUT_CONTRACT_VIOLATION"
    REMOTE_ERROR = "REMOTE_ERROR"
    LEDGER_UNAVAILABLE = "LEDGER_UNAVAILABLE"
    INTERNAL_ERROR = "INTERNAL_ERROR"

    # TIMED_OUT
    TIMEOUT = "TIMEOUT"

    # CANCELLED: the runtime stopped the call; the reason is the code.
    USER_CANCELLED = "USER_CANCELLED"
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"
    POLICY_VIOLATION = "POLICY_VIOLATION"
    SUPERSEDED = "SUPERSEDED"
    LEASE_LOST = "LEASE_LOST"
    RUNTIME_STOPPED = "RUNTIME_STOPPED"

    # PARTIAL: succeeded, but the model sees only part of the output.
    OUTPUT_TRUNCATED = "OUTPUT_TRUNCATED"


@dataclass(frozen=True, slots=True)
class CodeInfo:
    """What a code means: its status, whether a repeat may succeed, its safe message."""

    status: Status
    retryable: bool
    template: str

    @property
    def fields(self) -> frozenset[str]:
        """The placeholders the template expects."""
        return frozenset(name for _, name, _, _ in Formatter().parse(self.template) if name)


_IA = Status.INVALID_ARGUMENTS
_D = Status.DENIED
_F = Status.FAILED
_C = Status.CANCELLED

CATALOG: Final[dict[ErrorCode, CodeInfo]] = {
    ErrorCode.ARGUMENTS_TOO_LARGE: CodeInfo(
        _IA,
        False,
        "The arguments for {tool} are too large (limit {limit} bytes). "
        "Send smaller arguments, for example a narrower query or fewer items.",
    ),
    ErrorCode.ARGUMENTS_NOT_JSON: CodeInfo(
        _IA,
        False,
        "The arguments for {tool} are not valid JSON ({detail}). Send one complete JSON object.",
    ),
    ErrorCode.ARGUMENTS_NOT_OBJECT: CodeInfo(
        _IA,
        False,
        "The arguments for {tool} must be a JSON object, not {kind}. "
        "Send an object with named properties.",
    ),
    ErrorCode.ARGUMENTS_INVALID_UTF8: CodeInfo(
        _IA, False, "The arguments for {tool} are not valid UTF-8. Send UTF-8 text."
    ),
    ErrorCode.DUPLICATE_KEY: CodeInfo(
        _IA, False, "The arguments for {tool} repeat the key '{key}'. Send each key once."
    ),
    ErrorCode.DUPLICATE_CALL_ID: CodeInfo(
        _IA,
        False,
        "Another call in this turn, or still open in this run, has the id '{id}'. "
        "Give each call its own id.",
    ),
    ErrorCode.NON_FINITE_NUMBER: CodeInfo(
        _IA,
        False,
        "The arguments for {tool} contain NaN or Infinity, which JSON does "
        "not allow. Send finite numbers.",
    ),
    ErrorCode.NUMBER_TOO_LARGE: CodeInfo(
        _IA,
        False,
        "The arguments for {tool} contain a number too large to use. "
        "Send numbers of at most {limit} digits, within a 64-bit float's range.",
    ),
    ErrorCode.NESTING_TOO_DEEP: CodeInfo(
        _IA,
        False,
        "The arguments for {tool} are nested too deeply (limit {limit} levels). "
        "Send a flatter object.",
    ),
    ErrorCode.UNKNOWN_PROPERTY: CodeInfo(
        _IA,
        False,
        "Property '{property}' is not accepted by {tool}. Remove it. "
        "Accepted properties: {allowed}.",
    ),
    ErrorCode.MISSING_PROPERTY: CodeInfo(
        _IA, False, "Property '{property}' is required by {tool}. Add it and call again."
    ),
    ErrorCode.TYPE_MISMATCH: CodeInfo(
        _IA, False, "Property '{property}' of {tool} must be {expected}. Send a value of that type."
    ),
    ErrorCode.OUT_OF_BOUNDS: CodeInfo(
        _IA,
        False,
        "Property '{property}' of {tool} is out of bounds: {bound}. Send a value within the bound.",
    ),
    ErrorCode.NOT_IN_ENUM: CodeInfo(
        _IA, False, "Property '{property}' of {tool} must be one of: {allowed}."
    ),
    ErrorCode.SCHEMA_VIOLATION: CodeInfo(
        _IA,
        False,
        "Property '{property}' of {tool} does not match its schema "
        "({rule}). Check the tool's input schema and call again.",
    ),
    ErrorCode.INVALID_PATH: CodeInfo(
        _IA,
        False,
        "Property '{property}' of {tool} is not a usable path ({detail}). "
        "Send a workspace-relative path such as 'src/main.py'.",
    ),
    ErrorCode.ABSOLUTE_PATH: CodeInfo(
        _IA,
        False,
        "Property '{property}' of {tool} must be relative to the workspace, "
        "not absolute. Send a path such as 'src/main.py'.",
    ),
    ErrorCode.PATH_TRAVERSAL: CodeInfo(
        _IA,
        False,
        "Property '{property}' of {tool} leaves the workspace. "
        "Only paths inside the workspace are allowed; send a workspace-relative path "
        "without '..' segments that climb out of it.",
    ),
    ErrorCode.SYMLINK_ESCAPE: CodeInfo(
        _IA,
        False,
        "Property '{property}' of {tool} names a link that points outside the "
        "workspace. Use the file inside the workspace instead.",
    ),
    ErrorCode.FORBIDDEN_PATH: CodeInfo(
        _IA,
        False,
        "Property '{property}' of {tool} names a protected path that tools may "
        "not touch. Choose another file.",
    ),
    ErrorCode.COMMAND_NOT_ALLOWED: CodeInfo(
        _IA, False, "The command in '{property}' is not allowed for {tool}: {detail}."
    ),
    ErrorCode.IDEMPOTENCY_CONFLICT: CodeInfo(
        _IA,
        False,
        "The idempotency key was already used for a different call of {tool}. "
        "Use a new key for new arguments.",
    ),
    ErrorCode.UNKNOWN_TOOL: CodeInfo(
        _D, False, "There is no tool named '{tool}'. Available tools: {available}."
    ),
    ErrorCode.UNKNOWN_VERSION: CodeInfo(
        _D, False, "Tool {tool} has no version '{version}'. Available versions: {available}."
    ),
    ErrorCode.TOOL_NOT_EXPOSED: CodeInfo(
        _D,
        False,
        "Tool {tool} is not available at this stage of the run. Available tools: {available}.",
    ),
    ErrorCode.PERMISSION_DENIED: CodeInfo(
        _D,
        False,
        "This run's permissions do not allow {tool} ({need}). "
        "Use a read-only alternative or ask the user to widen the permissions.",
    ),
    ErrorCode.RUN_STATE_DENIED: CodeInfo(
        _D, False, "{tool} is not allowed while the run is {state}. {hint}"
    ),
    ErrorCode.POLICY_DENIED: CodeInfo(
        _D, False, "{tool} is not allowed by this run's policy. {hint}"
    ),
    ErrorCode.WRITE_SCOPE_DENIED: CodeInfo(
        _D,
        False,
        "This task may not change '{path}': it is outside the task's write scope. "
        "Limit changes to the files the task is about.",
    ),
    ErrorCode.PATH_DENIED: CodeInfo(
        _D, False, "The path '{path}' is not accessible to {tool} in this run. Choose another file."
    ),
    ErrorCode.NETWORK_NOT_ALLOWED: CodeInfo(
        _D,
        False,
        "Network access is not allowed for this run. "
        "Use repository-local evidence or request approval.",
    ),
    ErrorCode.APPROVAL_REQUIRED: CodeInfo(
        _D, False, "{tool} needs approval and nobody could approve it now. {how}"
    ),
    ErrorCode.APPROVAL_REJECTED: CodeInfo(
        _D,
        False,
        "The user did not approve this call of {tool}. Do not repeat it; "
        "choose another approach or ask the user.",
    ),
    ErrorCode.BUDGET_EXCEEDED: CodeInfo(
        _D,
        False,
        "This run's {budget} budget is used up, so {tool} was not run. "
        "Finish with what you have or ask the user for more budget.",
    ),
    ErrorCode.RATE_LIMITED: CodeInfo(
        _D,
        True,
        "{tool} was called too often (limit {limit} calls per {window} s). "
        "Wait before calling it again.",
    ),
    ErrorCode.IDEMPOTENCY_IN_PROGRESS: CodeInfo(
        _D,
        True,
        "A call to {tool} with the same idempotency key is still running elsewhere. "
        "Repeat this call later: once that call is done, its result is returned.",
    ),
    ErrorCode.POLICY_ERROR: CodeInfo(
        _D,
        False,
        "The policy for {tool} could not be evaluated, so the call was refused. "
        "Tell the user that the runtime's policy needs attention.",
    ),
    ErrorCode.SANDBOX_UNAVAILABLE: CodeInfo(
        _D,
        False,
        "{tool} needs a sandbox, and none could be set up for it here, so it was "
        "not run. Use in-process tools or tell the user.",
    ),
    ErrorCode.TOOL_ERROR: CodeInfo(_F, False, "{tool} failed: {detail}"),
    ErrorCode.PROCESS_EXIT_NONZERO: CodeInfo(_F, False, "{detail}"),
    ErrorCode.PRECONDITION_FAILED: CodeInfo(
        _F, False, "{detail} Read the file again and base the change on what it holds now."
    ),
    ErrorCode.NOT_FOUND: CodeInfo(_F, False, "{detail}"),
    ErrorCode.OUTPUT_CONTRACT_VIOLATION: CodeInfo(
        _F,
        False,
        "{tool} returned output that does not match its declared contract. "
        "The result was withheld; tell the user the tool needs fixing.",
    ),
    ErrorCode.REMOTE_ERROR: CodeInfo(
        # {advice}: whether calling again may help, as the failure's retryable says.
        _F,
        True,
        "The remote tool {tool} failed ({detail}). {advice}",
    ),
    ErrorCode.LEDGER_UNAVAILABLE: CodeInfo(
        # Only where no caller can take a LedgerError: the MCP gateway's clients.
        _F,
        True,
        "The runtime could not record this call of {tool} in its audit ledger, so no "
        "result is given. Repeat the call later; if it keeps failing, tell the user.",
    ),
    ErrorCode.INTERNAL_ERROR: CodeInfo(
        _F,
        False,
        "The runtime hit an internal error while handling {tool}. "
        "Tell the user; the details are in the audit ledger.",
    ),
    ErrorCode.TIMEOUT: CodeInfo(
        Status.TIMED_OUT,
        True,
        "{tool} did not finish within {seconds} s and was stopped. "
        "Narrow the request or choose another tool.",
    ),
    ErrorCode.USER_CANCELLED: CodeInfo(_C, False, "The user cancelled this call of {tool}."),
    ErrorCode.BUDGET_EXHAUSTED: CodeInfo(
        _C, False, "This call of {tool} was stopped because the run's budget ran out."
    ),
    ErrorCode.POLICY_VIOLATION: CodeInfo(
        _C, False, "This call of {tool} was stopped because it violated the run's policy."
    ),
    ErrorCode.SUPERSEDED: CodeInfo(
        _C, False, "This call of {tool} was stopped because the run moved on."
    ),
    ErrorCode.LEASE_LOST: CodeInfo(
        _C, True, "This call of {tool} was stopped because its worker lost its lease."
    ),
    ErrorCode.RUNTIME_STOPPED: CodeInfo(
        _C,
        True,
        "This call of {tool} was stopped because the runtime was shut down. "
        "Repeat it once the runtime runs again.",
    ),
    ErrorCode.OUTPUT_TRUNCATED: CodeInfo(
        Status.PARTIAL,
        False,
        "{summary} The output was cut to fit; the full output is in "
        "artifact {artifact} (read it with artifact.read).",
    ),
}


def safe_message(code: ErrorCode, **fields: object) -> str:
    """Render the safe-message template of ``code``; missing fields render as '?', and
    an empty last field (a rule with no reason) leaves no space behind."""
    info = CATALOG[code]
    values = {name: fields.get(name, "?") for name in info.fields}
    return info.template.format(**values).rstrip()


def safe_field(text: str, limit: int = 64) -> str:
    """Model-supplied text made fit for a safe message: printable and short."""
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"

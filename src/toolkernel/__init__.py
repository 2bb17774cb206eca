"""toolkernel: the governed tool-calling runtime of an AI coding agent.

The model proposes; the runtime owns execution. Build a ``Kernel``, register tools,
start a ``Run``, show the model ``kernel.expose(run)`` and pass every proposed call
to ``kernel.call`` / ``kernel.call_many``.
"""

from toolkernel.approval import (
    ApprovalDecision,
    ApprovalRequest,
    Approver,
    TerminalApprover,
    approve_all,
)
from toolkernel.calls import ArtifactRef, RedactionNotice, ToolCallRequest, ToolCallResult, Usage
from toolkernel.cancel import CancellationToken, CancelledByRuntime
from toolkernel.codes import ErrorCode, Status
from toolkernel.config import Config, load_config
from toolkernel.context import (
    ApprovalState,
    RunContext,
    RunState,
    ToolContext,
    VerificationStatus,
)
from toolkernel.definition import (
    ConcurrencyGroup,
    ExecutionMode,
    OutputContract,
    Permissions,
    RetryPolicy,
    Safety,
    ToolDefinition,
    TrustLevel,
    load_definitions,
)
from toolkernel.dispatch import ToolOutput
from toolkernel.errors import (
    ConfigError,
    DefinitionError,
    LedgerError,
    SandboxUnavailable,
    ToolFailed,
    ToolkernelError,
    ToolPartial,
    UsageError,
)
from toolkernel.functions import FunctionTool, WorkspacePath, tool
from toolkernel.kernel import Kernel
from toolkernel.run import Run, ToolCall

__all__ = [
    "ApprovalDecision",
    "ApprovalRequest",
    "ApprovalState",
    "Approver",
    "ArtifactRef",
    "CancellationToken",
    "CancelledByRuntime",
    "ConcurrencyGroup",
    "Config",
    "ConfigError",
    "DefinitionError",
    "ErrorCode",
    "ExecutionMode",
    "FunctionTool",
    "Kernel",
    "LedgerError",
    "OutputContract",
    "Permissions",
    "RedactionNotice",
    "RetryPolicy",
    "Run",
    "RunContext",
    "RunState",
    "Safety",
    "SandboxUnavailable",
    "Status",
    "TerminalApprover",
    "ToolCall",
    "ToolCallRequest",
    "ToolCallResult",
    "ToolContext",
    "ToolDefinition",
    "ToolFailed",
    "ToolOutput",
    "ToolPartial",
    "ToolkernelError",
    "TrustLevel",
    "Usage",
    "UsageError",
    "VerificationStatus",
    "WorkspacePath",
    "approve_all",
    "load_config",
    "load_definitions",
    "tool",
]

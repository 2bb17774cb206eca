"""OpenTelemetry: one span per tool call, continuing the caller's W3C trace.

The span follows the GenAI semantic conventions for tool execution (development
status): name ``execute_tool {tool}``, kind INTERNAL, ``gen_ai.operation.name``,
``gen_ai.tool.name``, ``gen_ai.tool.call.id``, and ``error.type`` when the call did
not succeed, plus the runtime's own ``toolkernel.*`` attributes:

==================================  =================================================
``toolkernel.tool.version``         the version that ran (absent for unknown tools)
``toolkernel.tool_call.status``     one of the seven statuses
``toolkernel.tool_call.error_code`` the error code, when there is one
``toolkernel.tool_call.duration_ms`` end minus start, in milliseconds
``toolkernel.run_id``               the run
==================================  =================================================

The parent is the request's ``traceContext`` (a W3C ``traceparent``), read with the
W3C propagator itself rather than the globally configured one: the field is defined
as a traceparent whatever propagators the application set up. A request without one
continues the caller's current span, if any.

Only ``opentelemetry-api`` is used, and it is optional (the ``tracing`` extra): when
it is not installed every function here does nothing. When it is installed but the
application configured no tracer provider (the API's default proxy, or the no-op
provider), ``record_tool_span`` returns at once: nothing is emitted, and a call pays
a fraction of a microsecond. Install ``opentelemetry-sdk`` and set a provider with an
exporter to receive the spans.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Final

from toolkernel.calls import ToolCallRequest, ToolCallResult
from toolkernel.codes import Status

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the optional `tracing` extra is not installed: tracing is off
    trace = None  # type: ignore[assignment]

__all__ = ["INSTRUMENTATION_NAME", "current_traceparent", "record_tool_span"]

INSTRUMENTATION_NAME: Final = "toolkernel"
_SUCCESS: Final = frozenset({Status.SUCCEEDED, Status.PARTIAL})
_TRACEPARENT: Final = "traceparent"
_W3C: Final = TraceContextTextMapPropagator() if trace is not None else None

# ``trace.get_tracer_provider()`` looks up an environment variable on every call, which
# cost more than the rest of a skipped span. The API keeps the configured provider in
# a module global that stays None until ``set_tracer_provider`` runs (or the
# environment names a provider, which the API loads on first use: then the full
# lookup runs every time). Reading the module's namespace live sees every change.
_OTEL_GLOBALS: Final[dict[str, Any]] = vars(trace) if trace is not None else {}
_FAST_CHECK: Final = "_TRACER_PROVIDER" in _OTEL_GLOBALS and (
    "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ
)


def record_tool_span(
    request: ToolCallRequest,
    result: ToolCallResult,
    tool_version: str | None,
    start_ns: int,
    end_ns: int,
    *,
    tracer_provider: TracerProvider | None = None,
) -> None:
    """Emit the span of one finished tool call, with explicit start and end times.

    Args:
        request: the call as recorded; its ``trace_context`` is the parent.
        result: how it ended.
        tool_version: the version of the tool that ran, if one was found.
        start_ns: when the kernel received the call, in ns since the epoch
            (``time.time_ns()``).
        end_ns: when its result was ready, on the same clock.
        tracer_provider: where the span goes; the global provider by default.
    """
    if trace is None or _W3C is None:
        return
    if tracer_provider is None and _FAST_CHECK and _OTEL_GLOBALS["_TRACER_PROVIDER"] is None:
        return  # no provider configured (the API's default proxy): nothing to emit
    provider = tracer_provider or trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return  # no provider configured: every span would be a no-op, so skip the work
    tracer = provider.get_tracer(INSTRUMENTATION_NAME)
    parent = None
    if request.trace_context:
        parent = _W3C.extract({_TRACEPARENT: request.trace_context})
    span = tracer.start_span(
        f"execute_tool {request.tool_name}",
        context=parent,
        kind=trace.SpanKind.INTERNAL,
        start_time=start_ns,
    )
    if span.is_recording():
        span.set_attributes(_attributes(request, result, tool_version, start_ns, end_ns))
        if result.status not in _SUCCESS:
            described = str(result.error_code or result.status)
            span.set_status(trace.Status(trace.StatusCode.ERROR, described))
    span.end(end_time=end_ns)


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the caller's current span, or None without one."""
    if trace is None or _W3C is None:
        return None
    if not trace.get_current_span().get_span_context().is_valid:
        return None  # the common case without tracing: skip building a carrier
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=otel_context.get_current())
    return carrier.get(_TRACEPARENT)


def _attributes(
    request: ToolCallRequest,
    result: ToolCallResult,
    tool_version: str | None,
    start_ns: int,
    end_ns: int,
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": request.tool_name,
        "gen_ai.tool.call.id": request.tool_call_id,
        "toolkernel.run_id": request.run_id,
        "toolkernel.tool_call.status": str(result.status),
        "toolkernel.tool_call.duration_ms": max(end_ns - start_ns, 0) / 1e6,
    }
    if tool_version is not None:
        attributes["toolkernel.tool.version"] = tool_version
    if result.error_code is not None:
        attributes["toolkernel.tool_call.error_code"] = str(result.error_code)
    if result.status not in _SUCCESS:
        attributes["error.type"] = str(result.error_code or result.status)
    return attributes

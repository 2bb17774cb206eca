"""One OpenTelemetry span per tool call, continuing the request's W3C traceparent."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from sdk_responses import chat
from toolkernel.calls import ToolCallRequest, ToolCallResult
from toolkernel.codes import ErrorCode, Status
from toolkernel.ledger import EventType
from toolkernel.loop import AgentLoop
from toolkernel.testing import make_kernel
from toolkernel.tracing import current_traceparent, record_tool_span

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
START_NS = 1_767_225_600_000_000_000
END_NS = START_NS + 12_500_000


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def request(trace_context: str | None = TRACEPARENT) -> ToolCallRequest:
    return ToolCallRequest(
        tool_call_id="call_1",
        run_id="run_1",
        tool_name="file.read",
        arguments={"path": "src/app.py"},
        arguments_hash="sha256:0",
        trace_context=trace_context,
    )


def succeeded() -> ToolCallResult:
    return ToolCallResult("call_1", Status.SUCCEEDED, "Read 3 lines.")


def only_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    spans = exporter.get_finished_spans()
    assert len(spans) == 1
    return spans[0]


def test_the_span_continues_the_requests_traceparent(exporter, provider):
    record_tool_span(request(), succeeded(), "1.0.0", START_NS, END_NS, tracer_provider=provider)

    span = only_span(exporter)
    assert span.context is not None
    assert span.context.trace_id == int(TRACE_ID, 16)
    assert span.parent is not None
    assert span.parent.span_id == int(PARENT_ID, 16)
    assert span.parent.is_remote


def test_the_span_has_the_calls_times_name_and_attributes(exporter, provider):
    record_tool_span(request(), succeeded(), "1.0.0", START_NS, END_NS, tracer_provider=provider)

    span = only_span(exporter)
    assert span.name == "execute_tool file.read"
    assert span.kind is SpanKind.INTERNAL
    assert (span.start_time, span.end_time) == (START_NS, END_NS)
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "file.read",
        "gen_ai.tool.call.id": "call_1",
        "toolkernel.run_id": "run_1",
        "toolkernel.tool.version": "1.0.0",
        "toolkernel.tool_call.status": "SUCCEEDED",
        "toolkernel.tool_call.duration_ms": 12.5,
    }
    assert span.status.status_code is StatusCode.UNSET


def test_a_refused_call_is_an_error_span_with_its_code(exporter, provider):
    result = ToolCallResult.from_code("call_1", ErrorCode.PATH_TRAVERSAL, property="path", tool="x")

    record_tool_span(request(), result, None, START_NS, END_NS, tracer_provider=provider)

    span = only_span(exporter)
    attributes = span.attributes or {}
    assert attributes["toolkernel.tool_call.status"] == "INVALID_ARGUMENTS"
    assert attributes["toolkernel.tool_call.error_code"] == "PATH_TRAVERSAL"
    assert attributes["error.type"] == "PATH_TRAVERSAL"
    assert "toolkernel.tool.version" not in attributes
    assert span.status.status_code is StatusCode.ERROR


def test_without_a_traceparent_the_span_joins_the_callers_current_span(exporter, provider):
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("agent turn") as turn:
        record_tool_span(
            request(None), succeeded(), "1", START_NS, END_NS, tracer_provider=provider
        )

    spans = {s.name: s for s in exporter.get_finished_spans()}
    child = spans["execute_tool file.read"]
    assert child.parent is not None
    assert child.parent.span_id == turn.get_span_context().span_id


@pytest.mark.parametrize("bad", ["", "garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01"])
def test_a_malformed_traceparent_starts_a_new_trace(exporter, provider, bad):
    record_tool_span(request(bad), succeeded(), "1", START_NS, END_NS, tracer_provider=provider)

    span = only_span(exporter)
    assert span.parent is None


def test_current_traceparent_is_the_active_spans_and_none_without_one(provider):
    assert current_traceparent() is None
    with provider.get_tracer("test").start_as_current_span("turn") as turn:
        context = turn.get_span_context()
        ids = f"{context.trace_id:032x}-{context.span_id:016x}"
        assert current_traceparent() == f"00-{ids}-{context.trace_flags:02x}"


def test_the_agent_loop_stamps_calls_with_the_current_trace(tmp_path, provider):
    completion = chat(("call_1", "memory__read", "{}"))
    with make_kernel(tmp_path / "ws") as kernel:
        run = kernel.start_run()
        loop = AgentLoop(kernel, run, "openai-chat")
        with provider.get_tracer("test").start_as_current_span("turn"):
            expected = current_traceparent()
            loop.handle_sync(completion)
        requests = [
            e for e in kernel.ledger.events(run.id) if e.type is EventType.TOOL_CALL_REQUEST
        ]

    assert expected is not None
    assert [r.payload["traceContext"] for r in requests] == [expected]


# A subprocess's own tracer provider, exporting to memory (``exporter``): the global
# provider can be set once per process.
IN_MEMORY_TRACING = """
import json
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from toolkernel.testing import make_kernel

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
"""


def run_traced(code: str) -> str:
    """``run_python`` after ``IN_MEMORY_TRACING``."""
    return run_python(IN_MEMORY_TRACING + textwrap.dedent(code))


def run_python(code: str) -> str:
    completed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).parent,
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.strip()


PREAMBLE = f"""
    from toolkernel.calls import ToolCallRequest, ToolCallResult
    from toolkernel.codes import Status
    from toolkernel.tracing import current_traceparent, record_tool_span

    request = ToolCallRequest("c", "r", "file.read", {{}}, "h", trace_context={TRACEPARENT!r})
    result = ToolCallResult("c", Status.SUCCEEDED, "ok")
"""


def test_nothing_is_recorded_until_the_application_configures_a_provider():
    output = run_python(
        PREAMBLE
        + """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    record_tool_span(request, result, "1", 1, 2)  # the API's default: a no-op provider
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    record_tool_span(request, result, "1", 3, 4)
    print([s.start_time for s in exporter.get_finished_spans()])
    """
    )

    assert output == "[3]"


def test_without_opentelemetry_installed_tracing_does_nothing():
    output = run_python(
        """
    import sys
    sys.modules["opentelemetry"] = None  # as if the optional extra were not installed
    """
        + PREAMBLE
        + """
    record_tool_span(request, result, "1", 1, 2)
    print(current_traceparent())
    """
    )

    assert output == "None"


def test_the_global_tracer_provider_is_untouched_by_these_tests():
    # The tests above pass their provider explicitly or use a subprocess, so the
    # process-wide provider stays the API's default for every other test.
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def test_a_kernel_call_emits_one_span_per_call_in_the_callers_trace(tmp_path):
    output = run_traced(
        f"""
    from toolkernel.loop import AgentLoop

    message = {{
        "content": [
            {{"type": "tool_use", "id": "toolu_1", "name": "memory__read", "input": {{}}}},
            {{"type": "tool_use", "id": "toolu_2", "name": "file__read",
              "input": {{"path": "/x"}}}},
        ]
    }}
    with make_kernel(Path({str(tmp_path / "ws")!r})) as kernel:
        loop = AgentLoop(kernel, kernel.start_run(), "anthropic")
        with trace.get_tracer("agent").start_as_current_span("turn") as turn:
            loop.handle_sync(message)
    outer = turn.get_span_context()
    spans = [s for s in exporter.get_finished_spans() if s.name != "turn"]
    print(json.dumps([
        [s.name, s.context.trace_id == outer.trace_id, s.parent.span_id == outer.span_id,
         s.attributes["gen_ai.tool.call.id"], s.attributes["toolkernel.tool_call.status"]]
        for s in spans
    ]))
    """
    )

    # Spans are exported as they end: the refused call ends first, at admission.
    assert sorted(json.loads(output), key=lambda span: span[3]) == [
        ["execute_tool memory.read", True, True, "toolu_1", "SUCCEEDED"],
        ["execute_tool file.read", True, True, "toolu_2", "INVALID_ARGUMENTS"],
    ]


def test_two_runs_using_the_same_call_id_at_once_each_get_their_span(tmp_path):
    # Call ids are unique within a run only: providers number them from 0 each turn.
    output = run_traced(
        f"""
    import anyio

    from toolkernel.functions import tool

    @tool("job.wait")
    async def wait() -> str:
        \"\"\"Wait a little.\"\"\"
        await anyio.sleep(0.05)
        return "done"

    async def main(kernel):
        runs = [kernel.start_run(), kernel.start_run()]
        async with anyio.create_task_group() as group:
            for run in runs:
                group.start_soon(call, kernel, run)

    async def call(kernel, run):
        await kernel.call(run, "job.wait", {{}}, tool_call_id="call_0")

    config = '[[exposure]]\\ntools = ["*"]\\n'
    with make_kernel(Path({str(tmp_path / "ws")!r}), config) as kernel:
        kernel.register(wait)
        anyio.run(main, kernel)
    spans = exporter.get_finished_spans()
    print(json.dumps(sorted(s.attributes["gen_ai.tool.call.id"] for s in spans)))
    """
    )
    assert json.loads(output) == ["call_0", "call_0"]

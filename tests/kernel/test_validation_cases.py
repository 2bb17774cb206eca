"""Section 24 of the seed: schema and semantic validation, before any dispatch."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkernel.codes import ErrorCode, Status
from toolkernel.ledger import EventType
from toolkernel.testing import event_types

pytestmark = pytest.mark.anyio


async def test_missing_required_field_is_rejected_without_dispatch(kernel_factory, calls):
    kernel = kernel_factory()
    run = kernel.start_run()
    result = await kernel.call(run, "repo.lookup", {})
    assert result.status is Status.INVALID_ARGUMENTS
    assert result.error_code is ErrorCode.MISSING_PROPERTY
    assert "'query'" in result.safe_message
    assert calls.count == {}


async def test_unknown_property_is_rejected_and_named(kernel_factory, calls):
    kernel = kernel_factory()
    run = kernel.start_run()
    result = await kernel.call(run, "repo.lookup", {"query": "x", "sendSecrets": True})
    assert result.error_code is ErrorCode.UNKNOWN_PROPERTY
    assert "sendSecrets" in result.safe_message
    assert "query" in result.safe_message  # the accepted properties are listed
    assert result.retryable is False
    assert calls.count == {}


async def test_too_long_string_is_rejected_without_echoing_it(kernel_factory, calls):
    kernel = kernel_factory()
    run = kernel.start_run()
    secretish = "sk-" + "A" * 60
    result = await kernel.call(run, "repo.lookup", {"query": secretish})
    assert result.error_code is ErrorCode.OUT_OF_BOUNDS
    assert "at most 50 characters" in result.safe_message
    assert secretish not in result.safe_message
    assert calls.count == {}


async def test_value_outside_enum_is_rejected(kernel_factory, calls):
    kernel = kernel_factory()
    kernel.register(
        {
            "name": "repo.mode",
            "version": "1.0",
            "description": "Pick a mode.",
            "executionMode": "NATIVE",
            "inputSchema": {
                "type": "object",
                "additionalProperties": False,
                "required": ["mode"],
                "properties": {"mode": {"enum": ["fast", "thorough"]}},
            },
        },
        handler=lambda mode: mode,
    )
    run = kernel.start_run()
    result = await kernel.call(run, "repo.mode", {"mode": "reckless"})
    assert result.error_code is ErrorCode.NOT_IN_ENUM
    assert "fast, thorough" in result.safe_message
    ok = await kernel.call(run, "repo.mode", {"mode": "fast"})
    assert ok.status is Status.SUCCEEDED
    assert ok.structured_output == "fast"


async def test_wrong_type_is_rejected(kernel_factory):
    kernel = kernel_factory()
    run = kernel.start_run()
    result = await kernel.call(run, "repo.lookup", {"query": "x", "limit": "ten"})
    assert result.error_code is ErrorCode.TYPE_MISMATCH
    assert "limit" in result.safe_message


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("../../../../etc/passwd", ErrorCode.PATH_TRAVERSAL),
        ("/etc/passwd", ErrorCode.ABSOLUTE_PATH),
        (".env", ErrorCode.FORBIDDEN_PATH),
        (".git/config", ErrorCode.FORBIDDEN_PATH),
        ("keys/server.pem", ErrorCode.FORBIDDEN_PATH),
        ("src/\x00app.py", ErrorCode.INVALID_PATH),
        ("%2e%2e/%2e%2e/etc/passwd", ErrorCode.PATH_TRAVERSAL),
    ],
)
async def test_unsafe_paths_are_refused_with_distinct_codes(kernel_factory, calls, path, code):
    kernel = kernel_factory()
    run = kernel.start_run()
    result = await kernel.call(run, "file.peek", {"path": path})
    assert result.status is Status.INVALID_ARGUMENTS
    assert result.error_code is code
    assert "'path'" in result.safe_message
    assert calls.count == {}


async def test_symlink_leaving_the_workspace_is_refused(kernel_factory, workspace: Path):
    (workspace / "outside").symlink_to("/etc")
    kernel = kernel_factory()
    run = kernel.start_run()
    result = await kernel.call(run, "file.peek", {"path": "outside/passwd"})
    assert result.error_code is ErrorCode.SYMLINK_ESCAPE
    assert str(workspace) not in result.safe_message


async def test_path_guard_applies_to_every_tool_declaring_the_format(kernel_factory, calls):
    """A definition given as data, not a decorated function, is guarded the same way."""
    kernel = kernel_factory()
    kernel.register(
        {
            "name": "docs.open",
            "version": "2.0",
            "description": "Open documents.",
            "executionMode": "NATIVE",
            "inputSchema": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "files": {
                        "type": "array",
                        "maxItems": 5,
                        "items": {"$ref": "#/$defs/path"},
                    }
                },
                "$defs": {"path": {"type": "string", "format": "workspace-path"}},
            },
        },
        handler=lambda files: files,
    )
    run = kernel.start_run()
    result = await kernel.call(run, "docs.open", {"files": ["docs/notes.md", "../x"]})
    assert result.error_code is ErrorCode.PATH_TRAVERSAL
    assert "files[1]" in result.safe_message
    ok = await kernel.call(run, "docs.open", {"files": ["docs/notes.md"]})
    assert ok.status is Status.SUCCEEDED


async def test_oversized_arguments_are_refused_before_parsing(kernel_factory):
    kernel = kernel_factory(
        """
        max_argument_bytes = 1024
        [[exposure]]
        tools = ["*"]
        """
    )
    run = kernel.start_run()
    # Not even valid JSON: the size cap answers first.
    result = await kernel.call(run, "repo.lookup", "{" + "x" * 5000)
    assert result.error_code is ErrorCode.ARGUMENTS_TOO_LARGE
    assert "1024" in result.safe_message


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ('{"query": "x"', ErrorCode.ARGUMENTS_NOT_JSON),
        ("[1, 2]", ErrorCode.ARGUMENTS_NOT_OBJECT),
        ('{"query": "a", "query": "b"}', ErrorCode.DUPLICATE_KEY),
        ('{"query": "a", "limit": NaN}', ErrorCode.NON_FINITE_NUMBER),
        ('{"query": "a", "limit": ' + "9" * 400 + "}", ErrorCode.NUMBER_TOO_LARGE),
        ('{"query": ' + "[" * 100 + "]" * 100 + "}", ErrorCode.NESTING_TOO_DEEP),
        (b'{"query": "\xff"}', ErrorCode.ARGUMENTS_INVALID_UTF8),
    ],
)
async def test_malformed_raw_arguments_get_specific_codes(kernel_factory, raw, code):
    kernel = kernel_factory()
    run = kernel.start_run()
    result = await kernel.call(run, "repo.lookup", raw)
    assert result.status is Status.INVALID_ARGUMENTS
    assert result.error_code is code


@pytest.mark.parametrize(
    ("raw", "kind"), [([1, 2], "an array"), (5, "a number"), ((1,), "an array")]
)
async def test_decoded_arguments_that_are_no_object_are_named_as_what_they_are(
    kernel_factory, raw, kind
):
    kernel = kernel_factory()
    result = await kernel.call(kernel.start_run(), "repo.lookup", raw)
    assert result.error_code is ErrorCode.ARGUMENTS_NOT_OBJECT
    assert kind in result.safe_message
    assert "not valid JSON" not in result.safe_message


async def test_invalid_call_has_request_and_result_but_no_started(kernel_factory):
    kernel = kernel_factory()
    run = kernel.start_run()
    result = await kernel.call(run, "file.peek", {"path": "../../etc/passwd"})
    types = event_types(kernel.ledger.events(run.id), result.tool_call_id)
    assert types == [EventType.TOOL_CALL_REQUEST, EventType.TOOL_CALL_RESULT]
    recorded = kernel.ledger.events(run.id)[-1].payload["result"]
    assert recorded["errorCode"] == ErrorCode.PATH_TRAVERSAL

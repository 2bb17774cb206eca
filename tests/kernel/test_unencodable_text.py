"""Text with no UTF-8 form (lone surrogates) is refused and still recorded."""

from __future__ import annotations

import anyio
import pytest

from toolkernel.codes import ErrorCode, Status
from toolkernel.ledger import EventType
from toolkernel.run import ToolCall
from toolkernel.testing import event_types


@pytest.mark.parametrize(
    "arguments",
    ['{"query": "\\ud800"}', {"query": "\ud800"}, {"\udcff": "x"}],
    ids=["json-escape", "mapping-value", "mapping-key"],
)
def test_arguments_with_a_lone_surrogate_are_invalid_and_recorded(kernel_factory, arguments):
    kernel = kernel_factory()
    run = kernel.start_run()
    kernel.expose(run)
    result = kernel.call_sync(run, "repo.lookup", arguments)
    assert result.status is Status.INVALID_ARGUMENTS
    assert result.error_code is ErrorCode.ARGUMENTS_INVALID_UTF8
    events = kernel.ledger.events(run.id)
    assert event_types(events, result.tool_call_id) == [
        EventType.TOOL_CALL_REQUEST,
        EventType.TOOL_CALL_RESULT,
    ]
    assert kernel.ledger.verify().ok


def test_a_tool_name_from_a_non_utf8_command_line_is_an_unknown_tool(kernel_factory):
    kernel = kernel_factory()
    run = kernel.start_run()
    kernel.expose(run)
    calls = [ToolCall("repo.look\udcffup", {}, step_id="s\ud800")]
    [result] = anyio.run(kernel.call_many, run, calls)
    assert result.status is Status.DENIED
    assert result.error_code is ErrorCode.UNKNOWN_TOOL
    assert "repo.look\\udcffup" in result.safe_message
    [request] = [e for e in kernel.ledger.events(run.id) if e.type is EventType.TOOL_CALL_REQUEST]
    assert request.payload["toolName"] == "repo.look\\udcffup"
    assert request.payload["stepId"] == "s\\ud800"
    assert kernel.ledger.verify().ok


@pytest.mark.parametrize("run_id", ["", "a\nb", "x" * 129, "-leading", "run/1", "r\udcff"])
def test_a_run_id_that_is_not_a_plain_token_is_refused(kernel_factory, run_id):
    from toolkernel.errors import UsageError

    kernel = kernel_factory()
    with pytest.raises(UsageError, match="run id"):
        kernel.start_run(run_id=run_id)


@pytest.mark.parametrize("run_id", ["run_1", "ci:build-42@main", "R.2026.11.30", "x" * 128])
def test_plain_run_ids_are_accepted(kernel_factory, run_id):
    assert kernel_factory().start_run(run_id=run_id).id == run_id


def test_a_non_string_idempotency_key_is_refused_before_anything_runs(kernel_factory, calls):
    kernel = kernel_factory()
    run = kernel.start_run()
    with pytest.raises(TypeError, match="idempotency_key"):
        kernel.call_sync(run, "repo.lookup", {"query": "x"}, idempotency_key={"a": 1})
    assert calls.count == {}
    assert kernel.ledger.verify().unfinished == []


def test_an_empty_idempotency_key_is_refused_rather_than_ignored(kernel_factory, calls):
    """An empty key was recorded on the REQUEST yet never looked up: the tool ran again
    on every repeat, while the ledger said the call carried a key."""
    from toolkernel.errors import UsageError

    kernel = kernel_factory()
    run = kernel.start_run()
    with pytest.raises(UsageError, match="idempotency key"):
        kernel.call_sync(run, "repo.lookup", {"query": "x"}, idempotency_key="")
    assert calls.count == {}
    assert kernel.ledger.events(run.id) == []


@pytest.mark.parametrize("arguments", [{1: "a"}, {"query": {1: "a"}}], ids=["top-level", "nested"])
def test_a_mapping_with_a_key_that_is_not_a_string_is_a_schema_violation(kernel_factory, arguments):
    kernel = kernel_factory()
    run = kernel.start_run()
    result = kernel.call_sync(run, "repo.lookup", arguments)
    assert (result.status, result.error_code) == (
        Status.INVALID_ARGUMENTS,
        ErrorCode.SCHEMA_VIOLATION,
    )


def test_mappings_nested_too_deep_or_in_a_cycle_are_refused(kernel_factory):
    kernel = kernel_factory()
    run = kernel.start_run()
    deep: dict = {}
    inner = deep
    for _ in range(900):  # past Python's recursion limit on the way down
        inner["a"] = {}
        inner = inner["a"]
    looped: dict = {}
    looped["self"] = looped
    for arguments in (deep, looped):
        result = kernel.call_sync(run, "repo.lookup", arguments)
        assert result.error_code is ErrorCode.NESTING_TOO_DEEP


@pytest.mark.parametrize("name", [None, 123, b"repo.lookup"])
def test_a_tool_name_that_is_not_text_is_named_as_the_callers_mistake(kernel_factory, name):
    """None reached the registry first and raised "'NoneType' object is not iterable"."""
    kernel = kernel_factory()
    run = kernel.start_run()
    with pytest.raises(TypeError, match=r"ToolCall\.tool_name must be a string"):
        kernel.call_sync(run, name, {})
    assert kernel.ledger.verify().unfinished == []

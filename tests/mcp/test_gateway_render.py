"""What the gateway shows an MCP client of definitions and results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from toolkernel.calls import ArtifactRef, ToolCallResult
from toolkernel.codes import ErrorCode, Status
from toolkernel.definition import ToolDefinition
from toolkernel.mcp.gateway_approval import answer_binding, approval_form, how_to_approve
from toolkernel.mcp.gateway_render import PROJECTION_META, render_result, render_tool
from toolkernel.policy import NETWORK_REASON
from toolkernel.testing import make_kernel

OBJECT_OUTPUT = {
    "type": "object",
    "properties": {"count": {"type": "integer", "maximum": 10}},
    "required": ["count"],
    "additionalProperties": False,
}


def definition(**overrides: Any) -> ToolDefinition:
    data: dict[str, Any] = {
        "name": "demo.tool",
        "version": "2.0",
        "title": "Demo",
        "description": "A demo tool.",
        "inputSchema": {"type": "object", "additionalProperties": False, "properties": {}},
        "executionMode": "PROCESS",
    }
    data.update(overrides)
    return ToolDefinition.from_dict(data)


def test_annotations_follow_the_safety_profile() -> None:
    tool = render_tool(
        definition(
            safety={"mutating": True, "destructive": True, "external": True},
            permissions={"network": True},
        )
    )
    assert tool.name == "demo.tool"
    assert tool.annotations == types.ToolAnnotations(
        title="Demo",
        read_only_hint=False,
        destructive_hint=True,
        idempotent_hint=False,
        open_world_hint=True,
    )
    assert tool.meta is not None
    assert tool.meta["toolkernel.dev/version"] == "2.0"


def test_a_read_only_tool_says_so() -> None:
    tool = render_tool(definition(executionMode="NATIVE", idempotent=True))
    assert tool.annotations is not None
    assert tool.annotations.read_only_hint is True
    assert tool.annotations.idempotent_hint is True


@pytest.mark.parametrize(
    ("schema", "shown"),
    [(OBJECT_OUTPUT, OBJECT_OUTPUT), ({"type": "array"}, None), (None, None)],
)
def test_only_an_object_output_schema_is_advertised(schema: Any, shown: Any) -> None:
    contract = {"schema": schema} if schema is not None else {}
    tool = render_tool(definition(outputContract=contract))
    assert tool.output_schema == shown


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.POLICY_DENIED,
        ErrorCode.UNKNOWN_PROPERTY,
        ErrorCode.TIMEOUT,
        ErrorCode.TOOL_ERROR,
        ErrorCode.USER_CANCELLED,
    ],
)
def test_every_refusal_or_failure_is_an_error_result_with_the_safe_message(
    code: ErrorCode,
) -> None:
    result = ToolCallResult.from_code("call_1", code, tool="demo.tool")
    rendered = render_result(result, None, run_id="run_1")
    assert rendered.is_error is True
    assert isinstance(rendered.content[0], types.TextContent)
    assert rendered.content[0].text == result.safe_message
    assert rendered.meta is not None
    assert rendered.meta[PROJECTION_META] == result.projection()


def test_a_success_carries_text_and_structured_output() -> None:
    result = ToolCallResult(
        "call_1",
        Status.SUCCEEDED,
        "Counted.",
        structured_output={"count": 3},
        artifacts=(ArtifactRef("sha256:abc", "text/plain", 10),),
    )
    rendered = render_result(result, None, run_id="run_1")
    assert rendered.is_error is False
    assert rendered.structured_content == {"count": 3}
    assert isinstance(rendered.content[0], types.TextContent)
    assert rendered.content[0].text.splitlines()[:2] == ["Counted.", '{"count":3}']
    assert "sha256:abc" in rendered.content[0].text


def test_a_list_output_is_text_only() -> None:
    result = ToolCallResult("call_1", Status.SUCCEEDED, "Listed.", structured_output=[1, 2])
    rendered = render_result(result, None, run_id="run_1")
    assert rendered.structured_content is None
    assert isinstance(rendered.content[0], types.TextContent)
    assert rendered.content[0].text == "Listed.\n[1,2]"


def test_a_truncated_output_that_breaks_the_schema_is_not_sent_as_structured_content(
    tmp_path: Path,
) -> None:
    kernel = make_kernel(tmp_path / "ws", builtins=False, workspace_tools=False)
    registered = kernel.register(
        definition(outputContract={"schema": OBJECT_OUTPUT}, executionMode="EXTERNAL_API")
    )
    partial = ToolCallResult(
        "call_1",
        Status.PARTIAL,
        "Cut; the full output is in artifact sha256:abc.",
        error_code=ErrorCode.OUTPUT_TRUNCATED,
        structured_output={"count": 99},
    )
    rendered = render_result(partial, registered, run_id="run_1")
    assert rendered.is_error is True
    assert rendered.structured_content is None
    fitting = render_result(partial.with_(structured_output={"count": 1}), registered, run_id="r")
    assert fitting.is_error is False
    assert fitting.structured_content == {"count": 1}
    kernel.close()


def test_the_approval_form_shows_the_tool_and_its_full_arguments() -> None:
    form = approval_form("demo.tool", "2.0", {"path": "a.txt", "n": 3}, ["it is destructive"])
    # The version reads as the tool's, not as one more argument ("run demo.tool 2.0").
    assert "run demo.tool (version 2.0), which" in form.message
    assert "it is destructive" in form.message
    assert '"path": "a.txt"' in form.message
    assert form.requested_schema["properties"]["approve"]["type"] == "boolean"


def test_an_answer_is_bound_to_the_exact_arguments() -> None:
    assert answer_binding("demo.tool", {"a": 1}) == answer_binding("demo.tool", {"a": 1})
    assert answer_binding("demo.tool", {"a": 1}) != answer_binding("demo.tool", {"a": 2})
    assert answer_binding("demo.tool", {"a": 1}) != answer_binding("other.tool", {"a": 1})


def test_the_fallback_message_names_both_ways_to_approve() -> None:
    advice = how_to_approve("demo.tool")
    assert '[[policy.rules]] tools = ["demo.tool"]' in advice
    assert "toolkernel call demo.tool" in advice
    assert "--approve" in advice


@pytest.mark.parametrize(
    ("reasons", "named", "not_named"),
    [
        (["it is destructive"], "[[policy.rules]]", 'network = "allow"'),
        ([NETWORK_REASON], 'network = "allow"', "[[policy.rules]]"),
        ([NETWORK_REASON, "it is destructive"], 'network = "allow"', None),
    ],
)
def test_the_advice_follows_what_asks_for_approval(reasons, named, not_named) -> None:
    advice = how_to_approve("demo.tool", reasons)
    assert named in advice
    assert not_named is None or not_named not in advice
    assert all(reason in advice for reason in reasons)
    if len(reasons) == 2:
        assert "[[policy.rules]]" in advice


@pytest.mark.parametrize(
    ("action", "content", "approved"),
    [
        ("accept", {"approve": True}, True),
        ("accept", {"approve": False}, False),
        ("accept", {"approve": "no"}, False),  # not the form's boolean: fail closed
        ("accept", {"approve": "yes"}, False),
        ("accept", {}, False),
        ("accept", None, False),
        ("decline", {"approve": True}, False),
        ("cancel", None, False),
    ],
)
def test_only_an_accepted_true_approves(action: str, content: Any, approved: bool) -> None:
    from toolkernel.mcp.gateway_approval import decide

    answer = types.ElicitResult(action=action, content=content)  # type: ignore[arg-type]
    decision = decide(answer)
    assert decision.approved is approved
    # The ledger's reason says what the user did, not "accept" for a refusal.
    if action == "accept" and not approved:
        assert decision.note == "user accepted the form without approving the call"
    else:
        assert decision.note == f"user answered {action}"

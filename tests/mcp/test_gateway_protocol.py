"""The gateway as a JSON-RPC peer: every request gets an answer, and only true ones.

Over stdio, lines written by hand (``python -m toolkernel.mcp.gateway`` as a
subprocess): lines the SDK's reader refuses, batches, the end of stdin. Then what the
answers say: an approval nobody could be asked about, a success whose output no
longer fits its schema, and a bridged server that lists the same tools again.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from fixtures.bridge_support import fixture_server, open_kernel
from mcp.shared.exceptions import MCPError

from toolkernel.approval import ApprovalRequest
from toolkernel.calls import ArtifactRef, RedactionNotice, ToolCallResult
from toolkernel.codes import ErrorCode, Status
from toolkernel.definition import ToolDefinition
from toolkernel.ledger import EventType
from toolkernel.mcp import McpBridge
from toolkernel.mcp.gateway_approval import ElicitingApprover, approval_form
from toolkernel.mcp.gateway_render import PROJECTION_META, RUN_META, render_result
from toolkernel.testing import make_kernel

sys.path.insert(0, str(Path(__file__).parent / "gateway_fixtures"))

from gateway_harness import (
    RAW_HANDSHAKE,
    WAIT_S,
    ledger_events,
    make_workspace,
    stdio_client,
    stdio_messages,
    stdio_params,
)


@pytest.fixture
def served(tmp_path: Path) -> Path:
    return make_workspace(tmp_path / "served")


def request(request_id: int | str, method: str, params: dict[str, Any] | None = None) -> str:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message)  # ensure_ascii: a lone surrogate stays an escape


def raw(*lines: str) -> bytes:
    return "".join(line + "\n" for line in (*map(json.dumps, RAW_HANDSHAKE), *lines)).encode()


async def exchange(
    workspace: Path,
    sent: bytes,
    *,
    last: int | str,
    reply: Callable[[dict[str, Any]], bytes | None] | None = None,
) -> list[dict[str, Any]]:
    """What the stdio gateway writes for ``sent``, up to the answer to request ``last``
    (``reply`` as in ``stdio_messages``)."""

    def answered(messages: list[dict[str, Any]]) -> bool:
        return any(m.get("id") == last and "method" not in m for m in messages)

    return await stdio_messages(workspace, sent, until=answered, reply=reply)


def answers(messages: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    return {m["id"]: m for m in messages if "id" in m and "method" not in m}


def test_a_request_id_holding_a_lone_surrogate_is_answered_and_serving_goes_on(
    served: Path,
) -> None:
    """``"\\ud800"`` has no UTF-8 form: the error answer to it once killed the server
    (and with it every call running). Its id comes back as the client wrote it."""
    sent = raw(
        request(2, "tools/call", {"name": "fixture.steps", "arguments": {"count": 2}}),
        request("\ud800", "ping"),
        request("\udfff\ud800", "ping"),
        request(3, "ping"),
    )
    answered = answers(anyio.run(lambda: exchange(served, sent, last=3)))
    for surrogate in ("\ud800", "\udfff\ud800"):
        assert answered[surrogate]["error"]["code"] == types.INVALID_REQUEST
    assert answered[2]["result"]["isError"] is False
    assert answered[3]["result"] == {}


def test_a_request_that_is_no_valid_json_rpc_is_answered_invalid_request_with_its_id(
    served: Path,
) -> None:
    sent = raw(
        request(11, "tools/list").replace("}", ',"params":[]}'),
        request(12, "ping").replace("}", ',"params":"x"}'),
        '{"id":13,"method":"ping"}',
        '{"jsonrpc":"1.0","id":14,"method":"ping"}',
        '{"jsonrpc":"2.0","id":15,"method":7}',
        '{"jsonrpc":"2.0","id":16.5,"method":"ping"}',  # no id MCP allows: null
        '{"jsonrpc":"2.0","method":"notifications/initialized","params":[]}',  # unanswered
        request(17, "ping"),
    )
    messages = anyio.run(lambda: exchange(served, sent, last=17))
    answered = answers(messages)
    for request_id in (11, 12, 13, 14, 15):
        assert answered[request_id]["error"]["code"] == types.INVALID_REQUEST
    assert answered[None]["error"]["code"] == types.INVALID_REQUEST
    assert answered[17]["result"] == {}
    assert len(messages) == len(answered) == 8  # initialize, the six refused, the ping


def test_a_line_is_one_message_whatever_bare_cr_it_holds(served: Path) -> None:
    """MCP's stdio messages are delimited by "\\n"; a CR is JSON whitespace."""
    sent = raw('{"jsonrpc":"2.0",\r"id":2,"method":"ping"}', request(3, "ping") + "\r")
    answered = answers(anyio.run(lambda: exchange(served, sent, last=3)))
    assert (answered[2]["result"], answered[3]["result"]) == ({}, {})


def test_a_batch_is_refused_with_one_invalid_request_answer(served: Path) -> None:
    """Batches are refused, not served: MCP dropped them after 2025-03-26, and the
    SDK's session has none (its HTTP transport refuses them too). A refusal the client
    reads, never silence."""
    handshake = [dict(RAW_HANDSHAKE[0]), RAW_HANDSHAKE[1]]
    handshake[0]["params"] = {**handshake[0]["params"], "protocolVersion": "2025-03-26"}
    sent = "".join(json.dumps(line) + "\n" for line in handshake)
    sent += f"[{request(2, 'ping')},{request(3, 'tools/list')}]\n[]\n{request(4, 'ping')}\n"
    messages = anyio.run(lambda: exchange(served, sent.encode(), last=4))
    refused = [m for m in messages if m.get("id") is None]
    assert [m["error"]["code"] for m in refused] == [types.INVALID_REQUEST] * 2
    assert {m.get("id") for m in messages} == {1, None, 4}


def test_every_request_read_before_stdin_closes_is_answered_as_the_ledger_says(
    served: Path,
) -> None:
    """``printf requests | toolkernel serve``: the answers of requests done at the end
    of stdin were dropped, and a call the ledger records SUCCEEDED could be answered
    "Connection closed". A call still running there ends CANCELLED, and says so."""
    calls = {
        3: ("memory.read", {}),
        4: ("fixture.steps", {"count": 2}),
        6: ("fixture.steps", {"count": 1}),
        8: ("memory.read", {}),
    }
    lines = [request(2, "tools/list"), request(5, "ping"), request(7, "tools/list")]
    lines += [request(i, "tools/call", {"name": n, "arguments": a}) for i, (n, a) in calls.items()]
    answered = answers(anyio.run(stdio_messages, served, raw(*lines)))
    assert set(answered) == set(range(1, 9))
    run_id = answered[2]["result"]["_meta"][RUN_META]
    recorded = {
        e.tool_call_id: e.payload["result"]["status"]
        for e in ledger_events(served, run_id)
        if e.type is EventType.TOOL_CALL_RESULT
    }
    for request_id in calls:
        told = answered[request_id]["result"]["_meta"][PROJECTION_META]
        assert recorded[told["toolCallId"]] == told["status"]
        assert told["status"] in (Status.SUCCEEDED, Status.CANCELLED)


def test_listing_tools_with_a_cursor_never_given_is_invalid_params(served: Path) -> None:
    async def main() -> None:
        async with stdio_client(served, mode="legacy") as client:
            with pytest.raises(MCPError) as refused:
                await client.list_tools(cursor="page-2")
            assert refused.value.code == types.INVALID_PARAMS
            assert (await client.list_tools()).tools

    anyio.run(main)


def test_the_serving_line_escapes_a_workspace_path_a_terminal_would_obey(tmp_path: Path) -> None:
    workspace = make_workspace(tmp_path / "ws\x1b]0;owned\x07\x1b[2J")
    params = stdio_params(workspace)

    async def main() -> bytes:
        with anyio.fail_after(WAIT_S):
            done = await anyio.run_process(
                [params.command, *params.args], input=b"", env=params.env, cwd=params.cwd
            )
        return done.stderr

    stderr = anyio.run(main)
    (serving,) = [line for line in stderr.splitlines() if b"serving" in line]
    assert b"\x1b" not in serving
    assert b"\\x1b]0;owned\\x07\\x1b[2J" in serving


def test_the_approval_form_escapes_what_would_hide_or_reorder_text() -> None:
    target = "notes.txt" + "\u2028" * 3 + "(harmless)\u202e\x9b2J"
    form = approval_form("demo.tool\u202e", "1.0", {"target": target}, ["held\u202e"])
    assert not {"\u2028", "\u202e", "\x9b"} & set(form.message)
    assert "\\u2028\\u2028\\u2028(harmless)\\u202e\\u009b2J" in form.message
    assert "demo.tool\\u202e (version 1.0)" in form.message


def test_a_failed_elicitation_is_approval_required_not_a_users_refusal(served: Path) -> None:
    """The client declared elicitation but answers the request with an error: nobody
    was asked, so the model must not read that the user refused."""

    async def refuse(_context: Any, _params: types.ElicitRequestParams) -> types.ErrorData:
        return types.ErrorData(code=types.METHOD_NOT_FOUND, message="Method not found")

    async def main() -> None:
        async with stdio_client(served, mode="legacy", elicitation_callback=refuse) as client:
            listed = await client.list_tools()
            result = await client.call_tool("fixture.erase", {"target": "build/cache"})
        assert listed.meta is not None
        assert result.is_error is True
        assert result.meta is not None
        seen = result.meta[PROJECTION_META]
        assert (seen["status"], seen["errorCode"]) == (Status.DENIED, ErrorCode.APPROVAL_REQUIRED)
        assert "[[policy.rules]]" in seen["safeMessage"]
        (denied,) = [
            e.payload["note"]
            for e in ledger_events(served, listed.meta[RUN_META])
            if e.type is EventType.APPROVAL_DENIED
        ]
        assert denied == "elicitation failed: the client answered error -32601"
        (recorded,) = [
            e.payload["result"]
            for e in ledger_events(served, listed.meta[RUN_META])
            if e.type is EventType.TOOL_CALL_RESULT
        ]
        assert recorded["errorCode"] == ErrorCode.APPROVAL_REQUIRED  # the ledger agrees
        # Word for word: replay rebuilds what the model was told from the ledger.
        assert recorded["safeMessage"] == seen["safeMessage"]

    anyio.run(main)


def test_the_advice_names_the_network_setting_when_that_is_what_asks(tmp_path: Path) -> None:
    # An allow rule does not waive [policy] network = "ask": advising one would send
    # the user round in circles.
    config = (
        '[run]\nprofile = "full"\n[tools]\nmodules = ["gateway_tools"]\n'
        '[[exposure]]\ntools = ["*"]\n[policy]\nnetwork = "ask"\n'
        '[[policy.rules]]\ntools = ["fixture.fetch"]\naction = "allow"\n'
    )
    workspace = make_workspace(tmp_path / "served", config)

    async def main() -> None:
        async with stdio_client(workspace, mode="legacy") as client:
            result = await client.call_tool("fixture.fetch", {"url": "https://example.com"})
        assert result.meta is not None
        seen = result.meta[PROJECTION_META]
        assert (seen["status"], seen["errorCode"]) == (Status.DENIED, ErrorCode.APPROVAL_REQUIRED)
        assert 'network = "allow"' in seen["safeMessage"]
        assert "[[policy.rules]]" not in seen["safeMessage"]
        (recorded,) = [
            e.payload["result"]
            for e in ledger_events(workspace, result.meta[RUN_META])
            if e.type is EventType.TOOL_CALL_RESULT
        ]
        assert recorded["safeMessage"] == seen["safeMessage"]  # what the model was told

    anyio.run(main)


def test_an_unreadable_answer_to_elicitation_ends_the_wait_at_once(served: Path) -> None:
    """A client that answers elicitation/create with something that is no result (here
    a string): the SDK cannot read it, and the call waited for its ten-minute limit."""
    handshake = [dict(RAW_HANDSHAKE[0]), RAW_HANDSHAKE[1]]
    handshake[0]["params"] = {**handshake[0]["params"], "capabilities": {"elicitation": {}}}
    call = request(2, "tools/call", {"name": "fixture.erase", "arguments": {"target": "x"}})
    sent = "".join(f"{line}\n" for line in [*map(json.dumps, handshake), call]).encode()

    def garbage(message: dict[str, Any]) -> bytes | None:
        if message.get("method") != "elicitation/create":
            return None
        return json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": "zzz"}).encode() + b"\n"

    answered = anyio.run(lambda: exchange(served, sent, last=2, reply=garbage))
    answer = answers(answered)[2]
    seen = answer["result"]["_meta"][PROJECTION_META]
    assert (seen["status"], seen["errorCode"]) == (Status.DENIED, ErrorCode.APPROVAL_REQUIRED)
    assert "elicitation failed" in seen["safeMessage"]


class _MalformedAnswers:
    """A client session whose answer to elicitation/create is no ElicitResult (the
    SDK's session refuses it as this does)."""

    async def elicit_form(self, *_args: Any, **_kwargs: Any) -> types.ElicitResult:
        return types.ElicitResult.model_validate({"action": "weird"})


def test_an_elicitation_answered_with_no_result_asks_nobody() -> None:
    approver = ElicitingApprover(_MalformedAnswers(), 1)  # type: ignore[arg-type]
    held = ApprovalRequest("run_1", "call_1", "demo.tool", "1.0", {"a": 1}, ("held",))
    decision = anyio.run(approver, held)
    assert decision.approved is False
    assert decision.asked is False
    assert approver.unasked is not None  # the gateway says how to approve
    assert decision.note.startswith("elicitation failed: ")
    assert len(decision.note) <= 80  # no validation error dumped into the ledger


TOKEN_SCHEMA = {
    "type": "object",
    "properties": {"token": {"type": "string", "pattern": "^ghp_[A-Za-z0-9]{36}$"}},
    "required": ["token"],
}


def test_a_success_whose_redacted_output_breaks_its_schema_says_why(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path / "ws", builtins=False, workspace_tools=False)
    tool = kernel.register(
        ToolDefinition.from_dict(
            {
                "name": "demo.token",
                "version": "1.0",
                "description": "Returns a token.",
                "inputSchema": {"type": "object", "additionalProperties": False},
                "executionMode": "EXTERNAL_API",
                "outputContract": {"schema": TOKEN_SCHEMA},
            }
        )
    )
    redacted = ToolCallResult(
        "call_1",
        Status.SUCCEEDED,
        "demo.token succeeded. [Redacted from this result: 1 github-token.]",
        structured_output={"token": "[REDACTED]"},
        redactions=(RedactionNotice("github-token", 1, "structuredOutput"),),
    )
    cut = ToolCallResult(
        "call_2",
        Status.PARTIAL,
        "demo.token succeeded. The output was cut to fit.",
        error_code=ErrorCode.OUTPUT_TRUNCATED,
        structured_output={},
        artifacts=(ArtifactRef("sha256:full", "application/json", 9000),),
    )
    shown = {}
    for result in (redacted, cut):
        rendered = render_result(result, tool, run_id="run_1")
        assert rendered.is_error is True
        assert rendered.structured_content is None
        assert isinstance(rendered.content[0], types.TextContent)
        shown[result.status] = rendered.content[0].text
    assert "redacted no longer matches the tool's output schema" in shown[Status.SUCCEEDED]
    assert "cut to fit no longer matches the tool's output schema" in shown[Status.PARTIAL]
    assert "artifact sha256:full" in shown[Status.PARTIAL]
    kernel.close()


@pytest.mark.anyio
async def test_a_server_that_lists_the_same_tools_again_changes_no_tool(workspace: Path) -> None:
    """A bridged server's tools/list_changed with nothing changed: the gateway's
    clients were told the tools changed (every tool withdrawn and registered again)."""
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    changes: list[None] = []
    with anyio.fail_after(60):
        async with McpBridge(kernel, [fixture_server("fx")]) as bridge:
            await bridge.connect_all(run)
            listed = [tool.definition for tool in kernel.registry.latest()]
            kernel.on_tools_changed(lambda: changes.append(None))
            report = await bridge.refresh("fx")
            assert changes == []
            assert report.accepted
            assert [tool.definition for tool in kernel.registry.latest()] == listed
    kernel.close()


def test_a_line_over_the_request_limit_is_refused_unread_and_serving_goes_on(
    tmp_path: Path,
) -> None:
    """A client cannot make the gateway hold a line of gigabytes (nor scan it on the
    event loop): past four times the argument cap it is read past and refused, with the
    id its start shows (the client waits for that answer), else a null id."""
    from gateway_harness import CONFIG

    workspace = make_workspace(tmp_path / "ws", "max_argument_bytes = 1024\n" + CONFIG)
    huge = request(2, "tools/call", {"name": "memory.read", "arguments": {"x": "[" * 300_000}})
    id_last = json.dumps(
        {"jsonrpc": "2.0", "method": "tools/call", "params": {"x": "[" * 300_000}, "id": 4}
    )
    sent = raw(huge, id_last, request(3, "ping"))
    answered = anyio.run(lambda: exchange(workspace, sent, last=3))
    refused = [m for m in answered if "error" in m]
    assert [(m["id"], m["error"]["code"]) for m in refused] == [
        (2, types.INVALID_REQUEST),
        (None, types.INVALID_REQUEST),  # its id came after the part that is kept
    ]
    assert all("longer than 69,632 bytes" in m["error"]["message"] for m in refused)
    assert answers(answered)[3]["result"] == {}

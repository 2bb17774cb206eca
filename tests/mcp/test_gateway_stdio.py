"""End to end: ``python -m toolkernel.mcp.gateway`` over stdio, driven by the SDK client.

Each test starts the gateway as a subprocess on a temporary workspace whose
toolkernel.toml serves the built-in tools and the fixture tools
(``gateway_fixtures/gateway_tools.py``), then checks what the client sees and what the
ledger recorded.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

sys.path.insert(0, str(Path(__file__).parent / "gateway_fixtures"))

from gateway_harness import (
    PYTHON,
    RAW_HANDSHAKE,
    WAIT_S,
    ledger_events,
    make_workspace,
    server_env,
    stdio_answers,
    stdio_client,
    stdio_messages,
    stdio_params,
    wait_for_result,
)

from toolkernel.codes import ErrorCode, Status
from toolkernel.ledger import EventType, SqliteLedger
from toolkernel.mcp.gateway_render import PROJECTION_META, RUN_META

# "legacy" speaks the initialize handshake (what Claude Code, Codex and Goose use);
# "auto" lets the SDK client pick the 2026-07-28 per-request protocol.
MODES = ["legacy", "auto"]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return make_workspace(tmp_path / "ws")


def projection(result: types.CallToolResult) -> dict[str, Any]:
    assert result.meta is not None
    return dict(result.meta[PROJECTION_META])


async def run_id_of(client: Client) -> str:
    listed = await client.list_tools()
    assert listed.meta is not None
    return str(listed.meta[RUN_META])


def test_tools_list_shows_the_projection_with_annotations_and_records_it(workspace: Path) -> None:
    async def main() -> None:
        async with stdio_client(workspace, mode="legacy") as client:
            listed = await client.list_tools()
        tools = {tool.name: tool for tool in listed.tools}
        assert {"repo.search", "memory.read", "shell.run", "fixture.erase"} <= tools.keys()
        search = tools["repo.search"]
        assert search.input_schema["additionalProperties"] is False
        assert search.annotations is not None
        assert search.annotations.read_only_hint is True
        erase = tools["fixture.erase"].annotations
        assert erase is not None
        assert (erase.read_only_hint, erase.destructive_hint) == (False, True)
        assert listed.meta is not None
        run_id = listed.meta[RUN_META]
        exposed = [e for e in ledger_events(workspace, run_id) if e.type is EventType.TOOLS_EXPOSED]
        assert exposed
        assert {t["name"] for t in exposed[-1].payload["tools"]} == tools.keys()

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_a_successful_call_returns_structured_output_and_is_audited(
    workspace: Path, mode: str
) -> None:
    async def main() -> None:
        async with stdio_client(workspace, mode=mode) as client:
            run_id = await run_id_of(client)
            result = await client.call_tool("repo.search", {"query": "greet"})
        assert result.is_error is False
        assert result.structured_content is not None
        assert result.structured_content["matches"][0]["path"] == "src/app.py"
        assert isinstance(result.content[0], types.TextContent)
        assert "greet" in result.content[0].text
        call_id = projection(result)["toolCallId"]
        kinds = [e.type for e in ledger_events(workspace, run_id) if e.tool_call_id == call_id]
        assert kinds == [
            EventType.TOOL_CALL_REQUEST,
            EventType.TOOL_CALL_STARTED,
            EventType.TOOL_CALL_RESULT,
        ]

    anyio.run(main)


def test_refused_calls_are_error_results_and_never_dispatch(workspace: Path) -> None:
    cases = [
        ("no.such_tool", {}, Status.DENIED, ErrorCode.UNKNOWN_TOOL),
        ("fixture.echo", {"text": "hi"}, Status.DENIED, ErrorCode.POLICY_DENIED),
        ("memory.read", {"bogus": 1}, Status.INVALID_ARGUMENTS, ErrorCode.UNKNOWN_PROPERTY),
        ("file.read", {"path": "../../etc/passwd"}, Status.INVALID_ARGUMENTS, None),
    ]

    async def main() -> None:
        async with stdio_client(workspace, mode="legacy") as client:
            run_id = await run_id_of(client)
            results = [await client.call_tool(name, args) for name, args, _, _ in cases]
            still_serving = await client.call_tool("memory.read", {})
        assert still_serving.is_error is False
        events = ledger_events(workspace, run_id)
        for result, (_name, _args, status, code) in zip(results, cases, strict=True):
            seen = projection(result)
            assert result.is_error is True
            assert seen["status"] == status
            if code is not None:
                assert seen["errorCode"] == code
            assert isinstance(result.content[0], types.TextContent)
            assert result.content[0].text == seen["safeMessage"]
            kinds = [e.type for e in events if e.tool_call_id == seen["toolCallId"]]
            assert kinds == [EventType.TOOL_CALL_REQUEST, EventType.TOOL_CALL_RESULT]

    anyio.run(main)


def test_a_call_past_its_timeout_comes_back_timed_out(workspace: Path) -> None:
    async def main() -> None:
        async with stdio_client(workspace, mode="legacy") as client:
            result = await client.call_tool(
                "shell.run", {"argv": ["sleep", "10"], "timeoutMs": 200}
            )
        assert result.is_error is True
        seen = projection(result)
        assert (seen["status"], seen["errorCode"]) == (Status.TIMED_OUT, ErrorCode.TIMEOUT)
        assert seen["retryable"] is True

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_progress_reaches_a_client_that_asked_for_it(workspace: Path, mode: str) -> None:
    updates: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append((progress, total, message))

    async def main() -> None:
        async with stdio_client(workspace, mode=mode) as client:
            run_id = await run_id_of(client)
            result = await client.call_tool(
                "fixture.steps", {"count": 4}, progress_callback=on_progress
            )
        assert result.is_error is False
        assert updates == [(n, 4, f"step {n}") for n in range(1, 5)]
        call_id = projection(result)["toolCallId"]
        recorded = [
            e
            for e in ledger_events(workspace, run_id)
            if e.tool_call_id == call_id and e.type is EventType.TOOL_CALL_PROGRESS
        ]
        assert len(recorded) == 4

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_a_client_cancel_cancels_the_call_and_the_ledger_says_so(
    workspace: Path, mode: str
) -> None:
    async def main() -> None:
        async with stdio_client(workspace, mode=mode) as client:
            run_id = await run_id_of(client)
            started = anyio.Event()

            async def on_progress(_p: float, _t: float | None, _m: str | None) -> None:
                started.set()

            async with anyio.create_task_group() as group:

                async def call() -> None:
                    await client.call_tool("fixture.wait", {}, progress_callback=on_progress)

                group.start_soon(call)
                await started.wait()
                group.cancel_scope.cancel()  # the SDK sends notifications/cancelled
            recorded = await wait_for_result(workspace, run_id, "fixture.wait")
            after = await client.call_tool("memory.read", {})
        assert (recorded["status"], recorded["errorCode"]) == (
            Status.CANCELLED,
            ErrorCode.USER_CANCELLED,
        )
        assert after.is_error is False

    anyio.run(main)


def test_a_client_cancel_while_its_user_is_asked_ends_the_wait(workspace: Path) -> None:
    # Handshake-era only: on 2026-07-28 the server does not wait for the answer (the
    # form travels in an InputRequiredResult), so there is nothing to cancel there.
    mode = "legacy"
    asked = anyio.Event()

    async def never_answer(_context: Any, _params: types.ElicitRequestParams) -> Any:
        asked.set()
        await anyio.sleep_forever()

    async def main() -> None:
        async with stdio_client(workspace, mode=mode, elicitation_callback=never_answer) as c:
            run_id = await run_id_of(c)
            async with anyio.create_task_group() as group:

                async def call() -> None:
                    await c.call_tool("fixture.erase", {"target": "build/cache"})

                group.start_soon(call)
                await asked.wait()
                group.cancel_scope.cancel()  # the SDK sends notifications/cancelled
            recorded = await wait_for_result(workspace, run_id, "fixture.erase")
        assert (recorded["status"], recorded["errorCode"]) == (
            Status.CANCELLED,
            ErrorCode.USER_CANCELLED,
        )

    anyio.run(main)


def _answering(action: str, seen: list[types.ElicitRequestParams]) -> Any:
    async def answer(_context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        seen.append(params)
        content = {"approve": True} if action == "accept" else None
        return types.ElicitResult(action=action, content=content)  # type: ignore[arg-type]

    return answer


@pytest.mark.parametrize("mode", MODES)
def test_an_accepted_elicitation_approves_the_call(workspace: Path, mode: str) -> None:
    asked: list[types.ElicitRequestParams] = []

    async def main() -> None:
        callback = _answering("accept", asked)
        async with stdio_client(workspace, mode=mode, elicitation_callback=callback) as client:
            run_id = await run_id_of(client)
            result = await client.call_tool("fixture.erase", {"target": "build/cache"})
        assert result.is_error is False
        assert result.structured_content == {"erased": "build/cache"}
        assert len(asked) == 1
        assert isinstance(asked[0], types.ElicitRequestFormParams)
        assert "fixture.erase" in asked[0].message
        assert '"target": "build/cache"' in asked[0].message
        call_id = projection(result)["toolCallId"]
        events = [e for e in ledger_events(workspace, run_id) if e.tool_call_id == call_id]
        granted = [e for e in events if e.type is EventType.APPROVAL_GRANTED]
        assert granted
        assert granted[0].payload["approver"] == "mcp-elicitation"

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("action", ["decline", "cancel"])
def test_a_declined_elicitation_rejects_the_call(workspace: Path, mode: str, action: str) -> None:
    asked: list[types.ElicitRequestParams] = []

    async def main() -> None:
        callback = _answering(action, asked)
        async with stdio_client(workspace, mode=mode, elicitation_callback=callback) as client:
            run_id = await run_id_of(client)
            result = await client.call_tool("fixture.erase", {"target": "build/cache"})
        assert result.is_error is True
        seen = projection(result)
        assert (seen["status"], seen["errorCode"]) == (Status.DENIED, ErrorCode.APPROVAL_REJECTED)
        assert len(asked) == 1
        kinds = [e.type for e in ledger_events(workspace, run_id)]
        assert EventType.APPROVAL_DENIED in kinds
        assert EventType.TOOL_CALL_STARTED not in kinds

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_without_elicitation_approval_is_required_and_the_message_says_how(
    workspace: Path, mode: str
) -> None:
    async def main() -> None:
        async with stdio_client(workspace, mode=mode) as client:
            result = await client.call_tool("fixture.erase", {"target": "build/cache"})
        assert result.is_error is True
        seen = projection(result)
        assert (seen["status"], seen["errorCode"]) == (Status.DENIED, ErrorCode.APPROVAL_REQUIRED)
        assert "[[policy.rules]]" in seen["safeMessage"]
        assert "--approve" in seen["safeMessage"]

    anyio.run(main)


def test_stdout_carries_only_json_rpc(workspace: Path) -> None:
    requests = [
        *RAW_HANDSHAKE,
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "shell.run", "arguments": {"argv": ["echo", "to-stdout"]}},
        },
    ]
    stdin = "".join(json.dumps(r) + "\n" for r in requests).encode()
    lines: list[str] = []

    async def main() -> tuple[int | None, str]:
        command = [PYTHON, "-m", "toolkernel.mcp.gateway", "--workspace", str(workspace)]
        with anyio.fail_after(WAIT_S):
            async with await anyio.open_process(
                command, env={**os.environ, **server_env()}
            ) as process:
                assert process.stdin is not None
                assert process.stdout is not None
                await process.stdin.send(stdin)
                buffered = b""
                async for chunk in process.stdout:
                    buffered += chunk
                    *complete, buffered = buffered.split(b"\n")
                    lines.extend(line.decode() for line in complete)
                    if any('"id":3' in line.replace(" ", "") for line in lines):
                        break
                await process.stdin.aclose()  # end of input: the server exits
                code = await process.wait()
                assert process.stderr is not None
                errors = (await process.stderr.receive()).decode()
        return code, errors

    code, errors = anyio.run(main)
    assert code == 0
    messages = [json.loads(line) for line in lines]
    assert all(m.get("jsonrpc") == "2.0" for m in messages)
    answered = {m["id"]: m for m in messages if "id" in m}
    assert set(answered) == {1, 2, 3}
    assert answered[3]["result"]["isError"] is False
    assert "toolkernel serve:" in errors


def test_a_bad_configuration_exits_2_with_the_error_on_stderr(tmp_path: Path) -> None:
    workspace = make_workspace(tmp_path / "ws", config="[run]\nprofile = 'nobody'\n")
    done = subprocess.run(
        [PYTHON, "-m", "toolkernel.mcp.gateway", "--workspace", str(workspace)],
        input="",
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        env={**os.environ, **server_env()},
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("ConfigError:")


def test_a_lone_surrogate_in_the_arguments_gets_an_answer(workspace: Path) -> None:
    """Valid JSON ("\\ud800"), no UTF-8 form; the SDK's client cannot even send it, so
    the request is written by hand. The SDK's reader refuses the line, and its client
    used to wait forever; it now gets an error answer (and later requests still do)."""
    lines = [
        *RAW_HANDSHAKE,
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "memory.read", "arguments": {"key": "\ud800"}},
        },
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "memory.read", "arguments": {}},
        },
    ]
    sent = "".join(json.dumps(line) + "\n" for line in lines)  # ensure_ascii: "\\ud800"
    # Nested past what the SDK's and Python's JSON readers take: once fatal to serve.
    deep = "[" * 1000 + "]" * 1000
    sent += f'{{"jsonrpc":"2.0","id":4,"method":"ping","params":{{"x":{deep}}}}}\n'
    sent += '{"jsonrpc":"2.0","id":5,"method":"ping"}\n'

    answers = anyio.run(stdio_answers, workspace, sent, {2, 3, 5})
    assert answers[2]["error"]["code"] == types.INVALID_REQUEST
    assert "could not be read" in answers[2]["error"]["message"]
    assert answers[3]["result"]["isError"] is False
    assert "result" in answers[5]  # still serving after the line it could not read


def test_requests_too_deep_or_too_long_for_json_readers_get_an_answer(workspace: Path) -> None:
    """Nested past Python's recursion limit, or an integer of more digits than Python
    converts: the SDK's reader refuses the line, and so did the fallback that looked
    for its id, so these requests went unanswered. The id found is the request's own,
    never one inside ``params``."""
    deep = "[" * 5000 + "]" * 5000
    digits = "1" + "0" * 5000
    sent = "".join(json.dumps(line) + "\n" for line in RAW_HANDSHAKE)
    sent += (
        '{"jsonrpc":"2.0","method":"tools/call","params":{"id":99,"name":"repo.search",'
        f'"arguments":{{"query":"x","extra":{deep}}}}},"id":2}}\n'
        '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"fixture.steps",'
        f'"arguments":{{"count":{digits}}}}}}}\n'
        f'{{"jsonrpc":"2.0","id":"four","method":"ping","params":{{"x":{deep}}}}}\n'
        # A string JSON refuses (a bad escape, a raw tab) before the id.
        '{"jsonrpc":"2.0","method":"ping","params":{"x":"a\\qb","y":"a\tb"},"id":6}\n'
        '{"jsonrpc":"2.0","id":5,"method":"ping"}\n'
    )
    answers = anyio.run(stdio_answers, workspace, sent, {2, 3, "four", 5, 6})
    for request_id in (2, 3, "four", 6):
        assert answers[request_id]["error"]["code"] == types.INVALID_REQUEST
        assert "could not be read" in answers[request_id]["error"]["message"]
    assert 99 not in answers
    assert "result" in answers[5]  # still serving


def test_a_second_request_under_an_id_still_open_is_refused(workspace: Path) -> None:
    """Two calls open under one id could not be told apart by their answers, nor by a
    cancel: one of them would run on where the client cannot stop it."""

    def call(token: str) -> str:
        params = {"name": "fixture.wait", "arguments": {}, "_meta": {"progressToken": token}}
        return json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": params})

    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}}
    ping = {"jsonrpc": "2.0", "id": 6, "method": "ping"}
    sent = "".join(json.dumps(line) + "\n" for line in RAW_HANDSHAKE) + call("first") + "\n"
    replied: list[str] = []

    def reply(message: dict[str, Any]) -> bytes | None:
        if message.get("method") == "notifications/progress" and not replied:
            replied.append("duplicate")  # the first call runs: the same id again
            return (call("second") + "\n").encode()
        if message.get("id") == 5 and "error" in message:
            return (json.dumps(cancel) + "\n" + json.dumps(ping) + "\n").encode()
        return None

    def pinged(messages: list[dict[str, Any]]) -> bool:
        return any(m.get("id") == 6 for m in messages)

    messages = anyio.run(
        lambda: stdio_messages(workspace, sent.encode(), until=pinged, reply=reply)
    )
    refused = [m for m in messages if m.get("id") == 5 and "error" in m]
    assert [m["error"]["code"] for m in refused] == [types.INVALID_REQUEST]
    assert "in use by a request not answered yet" in refused[0]["error"]["message"]
    progress = {m["params"]["progressToken"] for m in messages if "method" in m}
    assert progress == {"first"}  # the second never ran
    with SqliteLedger(workspace / ".toolkernel" / "ledger.db") as ledger:
        (run,) = ledger.runs()
        results = [
            (e.payload["result"]["status"], e.payload["toolName"])
            for e in ledger.events(run.run_id)
            if e.type is EventType.TOOL_CALL_RESULT
        ]
    assert results == [(Status.CANCELLED, "fixture.wait")]  # the first, cancelled


def test_a_client_that_closes_stdout_stops_the_gateway_cleanly(workspace: Path) -> None:
    """The client goes away (its end of our stdout closes) while stdin stays open: the
    first answer that cannot be written ends the session, as the end of stdin does,
    with exit 0 and one line saying why; the call still running ends CANCELLED."""
    waiting = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "fixture.wait", "arguments": {}, "_meta": {"progressToken": "w"}},
    }
    sent = "".join(json.dumps(line) + "\n" for line in [*RAW_HANDSHAKE, waiting])
    params = stdio_params(workspace)
    # Popen, not anyio: closing anyio's stdout stream does not close the pipe.
    process = subprocess.Popen(
        [params.command, *params.args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=params.cwd,
        env={**os.environ, **(params.env or {})},
        bufsize=0,
    )
    try:
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.write(sent.encode())
        _read_until(process.stdout, b'"method":"notifications/progress"')  # fixture.wait runs
        process.stdout.close()  # the client is gone; stdin stays open
        process.stdin.write(b'{"jsonrpc":"2.0","id":3,"method":"ping"}\n')
        code = process.wait(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
        _, errors = process.communicate(timeout=WAIT_S)
    assert code == 0, errors
    assert b"the client closed its end of stdout" in errors
    assert b"Error" not in errors
    with SqliteLedger(workspace / ".toolkernel" / "ledger.db") as ledger:
        report = ledger.verify()
        (run,) = ledger.runs()
        results = [
            e.payload["result"]["status"]
            for e in ledger.events(run.run_id)
            if e.type is EventType.TOOL_CALL_RESULT
        ]
    assert report.ok
    assert report.unfinished == []
    assert results == [Status.CANCELLED]


def _read_until(stdout: Any, marker: bytes) -> bytes:
    """What the gateway wrote on ``stdout`` until ``marker``; every wait bounded."""
    deadline = time.monotonic() + WAIT_S
    seen = b""
    while marker not in seen.replace(b" ", b""):
        ready, _, _ = select.select([stdout], [], [], max(0.0, deadline - time.monotonic()))
        chunk = stdout.read(65536) if ready else b""
        if not chunk:
            raise AssertionError(f"no {marker!r} from the gateway: {seen!r}")
        seen += chunk
    return seen

"""The gateway over streamable HTTP (``/mcp``): SDK clients and the MCP conformance suite.

The conformance suite's server scenarios that need no particular tool must pass
against ``toolkernel serve --transport http``; the others are listed, with how they
fare and why, in docs/mcp-clients.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import httpx
import mcp_types as types
import pytest
from fixtures.bridge_support import (
    FIXTURE_SERVER,
    OPEN_POLICY,
    recorded_pids,
    running,
    wait_for_line,
)
from mcp import Client
from starlette.datastructures import Headers
from starlette.responses import Response

sys.path.insert(0, str(Path(__file__).parent / "gateway_fixtures"))

from gateway_harness import WAIT_S, HttpGateway, ledger_events, make_workspace

from toolkernel.cli import main as cli_main
from toolkernel.codes import ErrorCode, Status
from toolkernel.errors import UsageError
from toolkernel.ledger import EventType, LedgerError, SqliteLedger
from toolkernel.mcp.gateway import _Allowed, _allowed, check_host
from toolkernel.mcp.gateway_render import PROJECTION_META, RUN_META


class _Answer(NamedTuple):
    status_code: int
    headers: dict[str, str]
    text: str


ROOT = Path(__file__).resolve().parents[2]
CONFORMANCE = ROOT / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"

# The server scenarios of @modelcontextprotocol/conformance 0.1.10 that apply to a
# tools-only governed gateway (docs/mcp-clients.md has the full table).
PASSING_SCENARIOS = [
    "server-initialize",
    "ping",
    "tools-list",
    "tools-call-error",
    "server-sse-multiple-streams",
]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return make_workspace(tmp_path / "ws")


@pytest.fixture
def gateway(workspace: Path) -> Iterator[HttpGateway]:
    with HttpGateway(workspace) as server:
        yield server


def projection(result: types.CallToolResult) -> dict[str, Any]:
    assert result.meta is not None
    return dict(result.meta[PROJECTION_META])


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_list_and_call_over_streamable_http(
    gateway: HttpGateway, workspace: Path, mode: str
) -> None:
    async def main() -> None:
        with anyio.fail_after(WAIT_S):
            async with Client(gateway.url, mode=mode) as client:
                listed = await client.list_tools()
                found = await client.call_tool("repo.search", {"query": "greet"})
                refused = await client.call_tool("fixture.echo", {"text": "hi"})
        assert "repo.search" in {tool.name for tool in listed.tools}
        assert found.is_error is False
        assert found.structured_content is not None
        assert found.structured_content["totalMatches"] == 1
        assert refused.is_error is True
        assert projection(refused)["errorCode"] == ErrorCode.POLICY_DENIED
        assert listed.meta is not None
        run_id = listed.meta[RUN_META]
        kinds = [e.type for e in ledger_events(workspace, run_id)]
        assert kinds.count(EventType.TOOL_CALL_RESULT) == 2

    anyio.run(main)


def test_each_http_session_gets_its_own_run(gateway: HttpGateway) -> None:
    async def run_of_new_session() -> str:
        async with Client(gateway.url, mode="legacy") as client:
            listed = await client.list_tools()
            assert listed.meta is not None
            return str(listed.meta[RUN_META])

    async def main() -> tuple[str, str]:
        with anyio.fail_after(WAIT_S):
            return await run_of_new_session(), await run_of_new_session()

    first, second = anyio.run(main)
    assert first != second


def test_elicitation_reaches_the_user_over_http(gateway: HttpGateway) -> None:
    asked: list[str] = []

    async def approve(_context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True})

    async def main() -> types.CallToolResult:
        with anyio.fail_after(WAIT_S):
            async with Client(gateway.url, mode="legacy", elicitation_callback=approve) as client:
                return await client.call_tool("fixture.erase", {"target": "tmp"})

    result = anyio.run(main)
    assert result.is_error is False
    assert projection(result)["status"] == Status.SUCCEEDED
    assert len(asked) == 1
    assert "fixture.erase" in asked[0]


@pytest.mark.parametrize("scenario", PASSING_SCENARIOS)
def test_conformance_server_scenario_passes(
    gateway: HttpGateway, tmp_path: Path, scenario: str
) -> None:
    out = tmp_path / "conformance"
    done = subprocess.run(
        [
            "node",
            str(CONFORMANCE),
            "server",
            "--url",
            gateway.url,
            "--scenario",
            scenario,
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    reports = list(out.glob(f"server-{scenario}-*/checks.json"))
    assert len(reports) == 1, done.stdout + done.stderr
    checks = json.loads(reports[0].read_text())
    statuses = {check["id"]: check["status"] for check in checks}
    assert "SUCCESS" in statuses.values(), statuses
    assert "FAILURE" not in statuses.values(), statuses


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost"])
def test_loopback_addresses_are_served_without_asking(host: str) -> None:
    check_host(host, allow_remote=False)  # no error


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "10.0.0.1", "example.com"])
def test_an_address_other_machines_reach_needs_allow_remote(host: str) -> None:
    with pytest.raises(UsageError, match="--allow-remote"):
        check_host(host, allow_remote=False)
    check_host(host, allow_remote=True)  # the explicit opt-in


def test_serve_refuses_a_public_address_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--transport", "http", "--host", "0.0.0.0", "--port", "0"]
    code = cli_main([*argv, "--workspace", str(tmp_path)])
    assert code == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert not (tmp_path / ".toolkernel").exists()  # no kernel, no ledger was opened


def refused(allowed: _Allowed, **headers: str) -> int | None:
    refusal = allowed.refusal(Headers(headers={"host": "127.0.0.1:8000", **headers}))
    return None if refusal is None else refusal.status_code


@pytest.mark.parametrize("host", ["127.0.0.2", "0:0:0:0:0:0:0:1", "::1", "localhost"])
def test_every_loopback_address_gets_host_and_origin_checks(host: str) -> None:
    allowed = _allowed(host, 8000)
    named = f"[{host}]" if ":" in host else host
    assert refused(allowed, host=f"{named}:8000") is None
    assert refused(allowed, host=named) is None
    assert refused(allowed, origin=f"http://{named}:3000") is None
    assert refused(allowed, host="evil.example:8000") == 421
    assert refused(allowed, origin="http://evil.example:8000") == 403
    assert refused(allowed, origin="null") == 403


def test_an_allowed_remote_address_takes_any_host_but_only_its_own_origin() -> None:
    allowed = _allowed("192.168.1.20", 8000)
    assert refused(allowed, host="mcp.example.com") is None
    assert refused(allowed, origin="http://192.168.1.20:8000") is None
    assert refused(allowed, origin="http://192.168.1.20") == 403
    assert refused(allowed, origin="http://192.168.1.20:3000") == 403
    assert refused(allowed, origin="http://mcp.example.com") == 403


def test_on_port_80_the_origin_without_a_port_is_the_listening_address() -> None:
    allowed = _allowed("192.168.1.20", 80, hosts=["mcp.example.com"])
    assert refused(allowed, host="192.168.1.20", origin="http://192.168.1.20") is None
    assert refused(allowed, host="mcp.example.com") is None
    assert refused(allowed, host="evil.example") == 421


def test_requests_too_deep_or_too_long_for_json_readers_get_a_parse_error(
    gateway: HttpGateway,
) -> None:
    """Over HTTP every POST gets a response: the SDK answers a body it cannot parse
    (nesting past its limit, an integer longer than it takes) with 400 and a JSON-RPC
    parse error, and the session goes on."""
    headers = {"Accept": "application/json, text/event-stream"}
    initialize = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    deep = "[" * 5000 + "]" * 5000
    unreadable = [
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"repo.search",'
        f'"arguments":{{"query":"x","extra":{deep}}}}}}}',
        '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fixture.steps",'
        f'"arguments":{{"count":1{"0" * 5000}}}}}}}',
    ]

    def post(body: object, extra: dict[str, str] | None = None) -> _Answer:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        sent = {**headers, "Content-Type": "application/json", **(extra or {})}
        request = urllib.request.Request(gateway.url, data=data, headers=sent, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=WAIT_S) as response:
                return _Answer(response.status, dict(response.headers), response.read().decode())
        except urllib.error.HTTPError as error:
            return _Answer(error.code, dict(error.headers), error.read().decode())

    started = post(initialize)
    headers["Mcp-Session-Id"] = {k.lower(): v for k, v in started.headers.items()}["mcp-session-id"]
    post({"jsonrpc": "2.0", "method": "notifications/initialized"})
    answers = [post(body) for body in unreadable]
    ping = post({"jsonrpc": "2.0", "id": 3, "method": "ping"})
    for answer in answers:
        assert answer.status_code == 400
        assert json.loads(answer.text)["error"]["code"] == types.PARSE_ERROR
    assert ping.status_code == 200
    assert '"id":3' in ping.text.replace(" ", "")


def _stopped_mid_call(server: HttpGateway) -> str:
    """SIGTERM to the gateway while a client's call of ``fixture.wait`` runs; the run's id."""
    run_ids: list[str] = []

    async def main() -> None:
        with anyio.fail_after(WAIT_S):
            async with Client(server.url, mode="legacy") as client:
                listed = await client.list_tools()
                assert listed.meta is not None
                run_ids.append(str(listed.meta[RUN_META]))
                running = anyio.Event()

                async def progressed(
                    progress: float, total: float | None, text: str | None
                ) -> None:
                    running.set()  # fixture.wait reports progress once it runs

                async def call() -> None:
                    try:
                        await client.call_tool("fixture.wait", {}, progress_callback=progressed)
                    except Exception:  # the server went away mid-call
                        return

                async with anyio.create_task_group() as group:
                    group.start_soon(call)
                    await running.wait()
                    assert await anyio.to_thread.run_sync(server.stop) == 0
                    group.cancel_scope.cancel()

    anyio.run(main)
    return run_ids[0]


def test_a_call_cut_short_by_stopping_the_server_is_recorded_as_a_shutdown(
    workspace: Path,
) -> None:
    """SIGTERM to `serve --transport http` mid-call: the ledger says the runtime was
    stopped (RUNTIME_STOPPED), not that a user cancelled the call."""
    from gateway_harness import wait_for_result

    run_id = _stopped_mid_call(HttpGateway(workspace))
    recorded = anyio.run(wait_for_result, workspace, run_id, "fixture.wait")
    assert (recorded["status"], recorded["errorCode"]) == (
        Status.CANCELLED,
        ErrorCode.RUNTIME_STOPPED,
    )


def test_stopping_mid_call_says_so_in_one_line_and_logs_no_error_for_what_it_cut(
    workspace: Path,
) -> None:
    """The responses a stop ends on purpose (the call's, the session's stream) are no
    errors of the ASGI application: the operator reads one line saying what happens."""
    server = HttpGateway(workspace)
    _stopped_mid_call(server)
    log = "".join(server.stderr)
    assert [line for line in server.stderr if "stopping on" in line] == [
        "toolkernel serve: stopping on SIGTERM\n"
    ], log
    assert "ERROR" not in log
    assert "without completing response" not in log


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_second_signal_kills_a_bridged_server_that_ignores_the_first(
    tmp_path: Path, record: Path, signum: signal.Signals
) -> None:
    """As over stdio: while the gateway waits for a bridged server that ignores SIGTERM
    and outlives its stdin, a second signal kills it and what it started, instead of
    ending the gateway with them left running."""
    options = ["--record", str(record), "--children", "--stubborn"]
    command = json.dumps([sys.executable, str(FIXTURE_SERVER), *options])
    config = f'{OPEN_POLICY}\n[[mcp.servers]]\nname = "fx"\ncommand = {command}\n'
    server = HttpGateway(make_workspace(tmp_path / "ws", config))
    processes = recorded_pids(record)  # the server is connected before the gateway listens
    server.process.send_signal(signum)

    async def stopping() -> None:
        with anyio.fail_after(WAIT_S):
            await wait_for_line(record, "stdin closed")  # the gateway is stopping it

    anyio.run(stopping)
    server.process.send_signal(signum)
    code = server.process.wait(timeout=WAIT_S)
    left = {name: pid for name, pid in processes.items() if running(pid)}
    for pid in left.values():  # they would hold the gateway's stderr open for good
        os.kill(pid, signal.SIGKILL)
    server.stop()
    log = "".join(server.stderr)
    assert sorted(processes) == ["child", "daemon", "server"]
    assert left == {}, log
    assert code == 0, log
    assert f"stopping now on {signum.name}" in log


MODERN = "2026-07-28"


def test_a_2026_07_28_call_in_flight_ends_when_the_server_is_stopped(workspace: Path) -> None:
    """Such a call runs in its HTTP request's own task, which uvicorn waited for: the
    server went on until the call ended by itself, and the ledger said SUCCEEDED."""
    from gateway_harness import wait_for_result

    server = HttpGateway(workspace)
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": "shell.run",
    }
    # A command: its STARTED is stored before it runs (a read-only call's only after).
    arguments = {"argv": ["sleep", "30"]}
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "shell.run", "arguments": arguments, "_meta": meta},
    }

    def call() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(server.url, headers=headers, json=body, timeout=WAIT_S)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    try:
        wait_until_started(workspace, "shell.run")
    finally:
        started = time.monotonic()
        assert server.stop() == 0
    assert time.monotonic() - started < 10
    run_id = next(iter_run_ids(workspace))
    recorded = anyio.run(wait_for_result, workspace, run_id, "shell.run")
    assert (recorded["status"], recorded["errorCode"]) == (
        Status.CANCELLED,
        ErrorCode.RUNTIME_STOPPED,
    )


def wait_until_started(workspace: Path, tool: str) -> None:
    """Until the ledger holds the STARTED event of a call of ``tool``."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        path = workspace / ".toolkernel" / "ledger.db"
        with contextlib.suppress(LedgerError), SqliteLedger(path, read_only=True) as ledger:
            for run in ledger.runs():
                if any(
                    e.type is EventType.TOOL_CALL_STARTED and e.payload["toolName"] == tool
                    for e in ledger.events(run.run_id)
                ):
                    return
        time.sleep(0.05)
    pytest.fail(f"{tool} never started")


def iter_run_ids(workspace: Path) -> Iterator[str]:
    with SqliteLedger(workspace / ".toolkernel" / "ledger.db", read_only=True) as ledger:
        yield from (run.run_id for run in ledger.runs())


def test_a_page_of_an_allowed_origin_gets_the_cors_answers_a_browser_needs() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await Response("ok", headers={"mcp-session-id": "s1"})(scope, receive, send)

    guarded = _allowed("127.0.0.1", 8000, origins=["https://app.example"]).guard(app)

    async def main() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=guarded)
        base = "http://127.0.0.1:8000"
        async with httpx.AsyncClient(transport=transport, base_url=base) as client:
            page = {"Origin": "https://app.example"}
            preflight = await client.options(
                "/mcp", headers={**page, "Access-Control-Request-Method": "POST"}
            )
            posted = await client.post("/mcp", headers=page, content=b"{}")
            plain = await client.post("/mcp", content=b"{}")
        return preflight, posted, plain

    preflight, posted, plain = anyio.run(main)
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    assert "mcp-session-id" in preflight.headers["access-control-allow-headers"]
    assert posted.headers["access-control-allow-origin"] == "https://app.example"
    assert "mcp-session-id" in posted.headers["access-control-expose-headers"]
    assert "access-control-allow-origin" not in plain.headers  # no page, no CORS


def test_a_bridged_http_server_leaves_no_request_lines_or_traceback_in_the_log(
    tmp_path: Path,
) -> None:
    """httpx logged every request ("HTTP Request: POST http://…?token=…") at INFO, a
    token in the URL with it, and a downstream that went away left a full exception
    group on stderr: the operator reads one line saying the server is gone."""
    downstream = HttpGateway(make_workspace(tmp_path / "down"))
    try:
        url = f"{downstream.url}?token=s3cr3t-in-the-url"
        config = OPEN_POLICY + f'\n[[mcp.servers]]\nname = "down"\nurl = "{url}"\n'
        with HttpGateway(make_workspace(tmp_path / "up", config)) as upstream:

            async def call() -> tuple[types.CallToolResult, types.CallToolResult]:
                with anyio.fail_after(WAIT_S):
                    async with Client(upstream.url) as client:
                        served = await client.call_tool("down.memory_read", {})
                        downstream.stop()
                        gone = await client.call_tool("down.memory_read", {})
                return served, gone

            served, gone = anyio.run(call)
            assert served.is_error is False, projection(served)
            assert gone.is_error is True
            assert projection(gone)["errorCode"] == ErrorCode.REMOTE_ERROR
            upstream.stop()
    finally:
        downstream.stop()
    log = "".join(upstream.stderr)
    assert "HTTP Request" not in log
    assert "s3cr3t-in-the-url" not in log
    assert "Traceback" not in log
    assert "ExceptionGroup" not in log

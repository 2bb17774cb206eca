"""The HTTP gateway against clients that do not play by the rules: raw requests.

Web pages (Host and Origin), requests that name a session they do not own, many
sessions coming and going, arguments that are not an object, a cancelled call.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp.server.streamable_http import REQUEST_CANCELLED

sys.path.insert(0, str(Path(__file__).parent / "gateway_fixtures"))

from gateway_harness import (
    CONFIG,
    RAW_HANDSHAKE,
    WAIT_S,
    HttpGateway,
    ledger_events,
    make_workspace,
    stdio_answers,
)

from toolkernel.cli import main as cli_main
from toolkernel.codes import ErrorCode, Status
from toolkernel.ledger import EventType
from toolkernel.mcp.gateway_render import PROJECTION_META, RUN_META

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
HANDSHAKE_VERSION = "2025-06-18"
MODERN_VERSION = "2026-07-28"
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
CONCURRENCY = 16
"""Sessions opened at once by the tests that need hundreds of them."""


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return make_workspace(tmp_path / "ws")


@pytest.fixture
def gateway(workspace: Path) -> Iterator[HttpGateway]:
    with HttpGateway(workspace) as server:
        yield server


def messages(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a response, whether JSON or an event stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        return [json.loads(d) for d in data if d.strip()]
    return [response.json()] if response.content else []


def answer(response: httpx.Response) -> dict[str, Any]:
    """The one answer (result or error) among a response's messages."""
    answers = [m for m in messages(response) if "result" in m or "error" in m]
    assert len(answers) == 1, (response.status_code, response.text)
    return answers[0]


async def open_session(http: httpx.AsyncClient, url: str, **headers: str) -> httpx.Response:
    """An initialize request (and the initialized notification when it succeeds)."""
    started = await http.post(url, headers={**HEADERS, **headers}, json=RAW_HANDSHAKE[0])
    session_id = started.headers.get("mcp-session-id")
    if session_id is not None:
        sent = {**HEADERS, **headers, **session_headers(session_id)}
        await http.post(url, headers=sent, json=RAW_HANDSHAKE[1])
    return started


def session_headers(session_id: str) -> dict[str, str]:
    return {"Mcp-Session-Id": session_id, "MCP-Protocol-Version": HANDSHAKE_VERSION}


async def in_session(
    http: httpx.AsyncClient, url: str, session_id: str, method: str, params: dict[str, Any]
) -> dict[str, Any]:
    """The answer to a request in a handshake-era session."""
    body = {"jsonrpc": "2.0", "id": uuid.uuid4().hex, "method": method, "params": params}
    sent = {**HEADERS, **session_headers(session_id)}
    return answer(await http.post(url, headers=sent, json=body))


async def sessionless(
    http: httpx.AsyncClient,
    url: str,
    method: str,
    params: dict[str, Any],
    session_id: str | None = None,
) -> dict[str, Any]:
    """The answer to a 2026-07-28 request (no handshake), naming ``session_id`` if given."""
    sent = {**HEADERS, "MCP-Protocol-Version": MODERN_VERSION, "Mcp-Method": method}
    if method == "tools/call":
        sent["Mcp-Name"] = params["name"]
    if session_id is not None:
        sent["Mcp-Session-Id"] = session_id
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": ENVELOPE}}
    return answer(await http.post(url, headers=sent, json=body))


def run_of(message: dict[str, Any]) -> str:
    return str(message["result"]["_meta"][RUN_META])


def projection(message: dict[str, Any]) -> dict[str, Any]:
    return dict(message["result"]["_meta"][PROJECTION_META])


def status_codes(url: str, *headers: dict[str, str]) -> list[int]:
    """The HTTP status of an initialize request sent with each set of ``headers``, and
    last that of a 2026-07-28 request sent with the first set."""

    async def main() -> list[int]:
        with anyio.fail_after(WAIT_S):
            async with httpx.AsyncClient(timeout=WAIT_S) as http:
                codes = [(await open_session(http, url, **h)).status_code for h in headers]
                modern = {"MCP-Protocol-Version": MODERN_VERSION, "Mcp-Method": "tools/list"}
                body = {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "tools/list",
                    "params": {"_meta": ENVELOPE},
                }
                sent = await http.post(url, headers={**HEADERS, **headers[0], **modern}, json=body)
                return [*codes, sent.status_code]

    return anyio.run(main)


# --- Host and Origin: DNS rebinding, cross-origin pages --------------------------


def test_a_remote_gateway_refuses_a_web_page_of_another_origin(workspace: Path) -> None:
    """With --allow-remote the Host a client uses is not known, so any is taken; but
    a request from a web page (it carries Origin) is refused unless the page is the
    gateway's own address (or an --allowed-origin)."""
    with HttpGateway(workspace, "--host", "0.0.0.0", "--allow-remote") as server:
        evil = f"evil.example:{server.port}"
        codes = status_codes(
            server.url,
            {"Origin": f"http://{evil}", "Host": evil},  # a page on a rebound name
            {"Origin": f"http://{evil}"},
            {"Origin": "null"},
            {"Origin": "https://evil.example"},
            {},  # no Origin: not a browser
            {"Host": evil},
            {"Origin": f"http://0.0.0.0:{server.port}"},
        )
    assert codes == [403, 403, 403, 403, 200, 200, 200, 403]


def test_an_allowed_origin_is_served_by_a_remote_gateway(workspace: Path) -> None:
    with HttpGateway(
        workspace, "--host", "0.0.0.0", "--allow-remote", "--allowed-origin", "https://app.example"
    ) as server:
        codes = status_codes(
            server.url,
            {"Origin": "https://app.example"},
            {"Origin": "https://app.example.evil"},
            {"Origin": "https://app.example:8443"},
        )
    assert codes == [200, 403, 403, 200]


def test_allowed_hosts_make_a_remote_gateway_check_the_host(workspace: Path) -> None:
    with HttpGateway(
        workspace, "--host", "0.0.0.0", "--allow-remote", "--allowed-host", "mcp.example:*"
    ) as server:
        codes = status_codes(
            server.url,
            {"Host": f"evil.example:{server.port}"},
            {"Host": "127.0.0.1"},
            {"Host": f"mcp.example:{server.port}"},
            {"Host": f"0.0.0.0:{server.port}"},
        )
    assert codes == [421, 421, 200, 200, 421]


def test_loopback_names_are_taken_without_a_port(gateway: HttpGateway) -> None:
    """What a client of ``http://localhost/mcp`` (port 80, or a tunnel's) sends."""
    codes = status_codes(
        gateway.url,
        {"Host": "127.0.0.1"},
        {"Host": "localhost"},
        {"Host": "[::1]"},
        {"Host": "localhost", "Origin": "http://localhost"},
        {"Host": "evil.example"},
        {"Origin": "http://evil.example"},
        {"Origin": "http://localhost.evil.example"},
    )
    assert codes == [200, 200, 200, 200, 421, 403, 403, 200]


def test_an_allowed_host_and_origin_are_served_on_loopback_too(workspace: Path) -> None:
    """A reverse proxy on this machine forwards its own Host, a web app its Origin."""
    with HttpGateway(
        workspace, "--allowed-host", "MCP.Example", "--allowed-origin", "https://app.example:8443"
    ) as server:
        codes = status_codes(
            server.url,
            {"Host": "mcp.example"},
            {"Host": "mcp.example:8000"},
            {"Origin": "https://app.example:8443"},
            {"Origin": "https://app.example"},
        )
    assert codes == [200, 421, 200, 403, 200]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--allowed-origin", "https://app.example.com/"),
        ("--allowed-origin", "app.example.com"),
        ("--allowed-origin", "null"),
        ("--allowed-origin", "*"),
        ("--allowed-host", "http://mcp.example"),
        ("--allowed-host", "mcp.example/mcp"),
    ],
)
def test_a_malformed_allowed_host_or_origin_is_refused_before_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    argv = ["serve", "--transport", "http", "--port", "0", option, value]
    assert cli_main([*argv, "--workspace", str(tmp_path)]) == 2
    assert option in capsys.readouterr().err
    assert not (tmp_path / ".toolkernel").exists()  # no kernel, no ledger was opened


# --- Sessions and their runs ------------------------------------------------------


def test_a_request_without_a_session_never_acts_in_a_sessions_run(
    gateway: HttpGateway, workspace: Path
) -> None:
    """A 2026-07-28 request reaches the gateway whatever Mcp-Session-Id it names (the
    SDK checks the header on the handshake-era path only): it gets the shared run,
    never the named session's, nor a run of its own per invented id."""

    async def main() -> dict[str, Any]:
        with anyio.fail_after(WAIT_S):
            async with httpx.AsyncClient(timeout=WAIT_S) as http:
                url = gateway.url
                victim = (await open_session(http, url)).headers["mcp-session-id"]
                victims = run_of(await in_session(http, url, victim, "tools/list", {}))
                shared = run_of(await sessionless(http, url, "tools/list", {}))
                named = await sessionless(http, url, "tools/list", {}, victim)
                call = {"name": "repo.search", "arguments": {"query": "greet"}}
                called = await sessionless(http, url, "tools/call", call, victim)
                ended = await http.delete(url, headers={**HEADERS, **session_headers(victim)})
                after = await sessionless(http, url, "tools/list", {}, victim)
                invented = [
                    await sessionless(http, url, "tools/list", {}, uuid.uuid4().hex)
                    for _ in range(3)
                ]
                return {
                    "victim": victims,
                    "shared": shared,
                    "named": run_of(named),
                    "called": run_of(called),
                    "ended": ended.status_code,
                    "after": run_of(after),
                    "invented": {run_of(m) for m in invented},
                }

    runs = anyio.run(main)
    assert runs["ended"] == 200
    assert runs["shared"] != runs["victim"]
    assert runs["named"] == runs["called"] == runs["after"] == runs["shared"]
    assert runs["invented"] == {runs["shared"]}
    kinds = [e.type for e in ledger_events(workspace, runs["victim"])]
    assert EventType.TOOL_CALL_REQUEST not in kinds  # nothing ran in the victim's run


def test_a_session_that_ends_has_its_run_forgotten(gateway: HttpGateway) -> None:
    async def main() -> tuple[str, str]:
        with anyio.fail_after(WAIT_S):
            async with httpx.AsyncClient(timeout=WAIT_S) as http:
                session = (await open_session(http, gateway.url)).headers["mcp-session-id"]
                run = run_of(await in_session(http, gateway.url, session, "tools/list", {}))
                sent = {**HEADERS, **session_headers(session)}
                assert (await http.delete(gateway.url, headers=sent)).status_code == 200
                return session, run

    session, run = anyio.run(main)
    assert run in gateway.wait_for_line(f"session {session} ended")


async def come_and_go(http: httpx.AsyncClient, url: str, count: int) -> None:
    """``count`` sessions, ``CONCURRENCY`` at a time, each listing tools then ending."""
    limiter = anyio.CapacityLimiter(CONCURRENCY)

    async def one() -> None:
        async with limiter:
            session = (await open_session(http, url)).headers["mcp-session-id"]
            await in_session(http, url, session, "tools/list", {})
            await http.delete(url, headers={**HEADERS, **session_headers(session)})

    async with anyio.create_task_group() as group:
        for _ in range(count):
            group.start_soon(one)


def test_a_live_session_keeps_its_run_while_hundreds_come_and_go(tmp_path: Path) -> None:
    """Its budget (two calls) stays spent: the session was not moved to a new run."""
    workspace = make_workspace(tmp_path / "ws", CONFIG + "\n[budget]\nmax_calls = 2\n")
    with HttpGateway(workspace) as server:
        call = {"name": "repo.search", "arguments": {"query": "greet"}}

        async def main() -> list[dict[str, Any]]:
            with anyio.fail_after(WAIT_S * 4):
                async with httpx.AsyncClient(timeout=WAIT_S) as http:
                    url = server.url
                    mine = (await open_session(http, url)).headers["mcp-session-id"]
                    results = [
                        await in_session(http, url, mine, "tools/call", call) for _ in range(2)
                    ]
                    await come_and_go(http, url, 300)
                    results.append(await in_session(http, url, mine, "tools/call", call))
                    return results

        results = anyio.run(main)
    assert len({run_of(r) for r in results}) == 1
    assert [projection(r)["status"] for r in results] == [
        Status.SUCCEEDED,
        Status.SUCCEEDED,
        Status.DENIED,
    ]
    assert projection(results[-1])["errorCode"] == ErrorCode.BUDGET_EXCEEDED


def test_a_session_past_the_limit_is_refused_until_one_ends(gateway: HttpGateway) -> None:
    """The SDK keeps as many sessions open as the gateway keeps runs for them."""
    from toolkernel.mcp.gateway import MAX_SESSIONS

    async def main() -> list[int]:
        with anyio.fail_after(WAIT_S * 4):
            async with httpx.AsyncClient(timeout=WAIT_S) as http:
                url = gateway.url
                limiter = anyio.CapacityLimiter(CONCURRENCY)
                sessions: list[str] = []

                async def one() -> None:
                    async with limiter:
                        started = await open_session(http, url)
                        sessions.append(started.headers["mcp-session-id"])

                async with anyio.create_task_group() as group:
                    for _ in range(MAX_SESSIONS):
                        group.start_soon(one)
                refused = await open_session(http, url)
                sent = {**HEADERS, **session_headers(sessions[0])}
                await http.delete(url, headers=sent)
                served = await open_session(http, url)
                return [refused.status_code, served.status_code]

    assert anyio.run(main) == [503, 200]


# --- Arguments that are not an object ---------------------------------------------

NOT_OBJECTS: list[Any] = [["rm", "-rf", "/"], '{"query": "greet"}', 7, True]
"""``arguments`` the SDK refuses; the JSON text in a string is never read as arguments."""


def assert_refused_and_recorded(
    workspace: Path, run_id: str, answers: list[dict[str, Any]]
) -> None:
    for message in answers:
        assert message["result"]["isError"] is True
        assert projection(message)["status"] == Status.INVALID_ARGUMENTS
        assert projection(message)["errorCode"] == ErrorCode.ARGUMENTS_NOT_OBJECT
    events = ledger_events(workspace, run_id)
    results = [e.payload["result"] for e in events if e.type is EventType.TOOL_CALL_RESULT]
    assert [r["errorCode"] for r in results] == [ErrorCode.ARGUMENTS_NOT_OBJECT] * len(answers)
    kinds = [e.type for e in events]
    assert kinds.count(EventType.TOOL_CALL_REQUEST) == len(answers)
    assert EventType.TOOL_CALL_STARTED not in kinds


def test_arguments_that_are_not_an_object_are_a_recorded_tool_error(
    gateway: HttpGateway, workspace: Path
) -> None:
    async def main() -> list[dict[str, Any]]:
        with anyio.fail_after(WAIT_S):
            async with httpx.AsyncClient(timeout=WAIT_S) as http:
                session = (await open_session(http, gateway.url)).headers["mcp-session-id"]
                return [
                    await in_session(
                        http,
                        gateway.url,
                        session,
                        "tools/call",
                        {"name": "repo.search", "arguments": arguments},
                    )
                    for arguments in NOT_OBJECTS
                ]

    answers = anyio.run(main)
    assert_refused_and_recorded(workspace, run_of(answers[0]), answers)


def test_arguments_that_are_not_an_object_are_a_recorded_tool_error_without_a_session(
    gateway: HttpGateway, workspace: Path
) -> None:
    async def main() -> list[dict[str, Any]]:
        with anyio.fail_after(WAIT_S):
            async with httpx.AsyncClient(timeout=WAIT_S) as http:
                return [
                    await sessionless(
                        http,
                        gateway.url,
                        "tools/call",
                        {"name": "repo.search", "arguments": arguments},
                    )
                    for arguments in NOT_OBJECTS
                ]

    answers = anyio.run(main)
    assert_refused_and_recorded(workspace, run_of(answers[0]), answers)


def test_arguments_that_are_not_an_object_are_a_recorded_tool_error_over_stdio(
    workspace: Path,
) -> None:
    calls = [
        {
            "jsonrpc": "2.0",
            "id": 10 + n,
            "method": "tools/call",
            "params": {"name": "repo.search", "arguments": arguments},
        }
        for n, arguments in enumerate(NOT_OBJECTS)
    ]
    sent = "".join(json.dumps(line) + "\n" for line in [*RAW_HANDSHAKE, *calls])
    expected = {call["id"] for call in calls}

    answers = anyio.run(stdio_answers, workspace, sent, expected)
    ordered = [answers[call["id"]] for call in calls]
    assert_refused_and_recorded(workspace, run_of(ordered[0]), ordered)


# --- Cancellation -----------------------------------------------------------------


def test_a_cancelled_call_is_answered_request_cancelled_and_recorded(
    gateway: HttpGateway, workspace: Path
) -> None:
    """docs/mcp-clients.md: over HTTP the SDK ends the cancelled request's stream with
    a REQUEST_CANCELLED error (-32800); the ledger says USER_CANCELLED."""

    async def main() -> tuple[str, list[dict[str, Any]]]:
        with anyio.fail_after(WAIT_S):
            async with httpx.AsyncClient(timeout=WAIT_S) as http:
                url = gateway.url
                session = (await open_session(http, url)).headers["mcp-session-id"]
                run = run_of(await in_session(http, url, session, "tools/list", {}))
                sent = {**HEADERS, **session_headers(session)}
                call = {
                    "jsonrpc": "2.0",
                    "id": 42,
                    "method": "tools/call",
                    "params": {
                        "name": "fixture.wait",
                        "arguments": {},
                        "_meta": {"progressToken": 1},
                    },
                }
                received: list[dict[str, Any]] = []
                async with http.stream("POST", url, headers=sent, json=call) as stream:
                    async for line in stream.aiter_lines():
                        if not line.startswith("data:") or not line[5:].strip():
                            continue
                        received.append(json.loads(line[5:]))
                        if received[-1].get("method") == "notifications/progress":
                            cancel = {
                                "jsonrpc": "2.0",
                                "method": "notifications/cancelled",
                                "params": {"requestId": 42, "reason": "the user pressed stop"},
                            }
                            await http.post(url, headers=sent, json=cancel)
                return run, received

    run, received = anyio.run(main)
    assert received[-1]["id"] == 42
    assert received[-1]["error"]["code"] == REQUEST_CANCELLED
    assert not any("result" in message for message in received)
    results = [
        e.payload["result"]
        for e in ledger_events(workspace, run)
        if e.type is EventType.TOOL_CALL_RESULT
    ]
    assert [(r["status"], r["errorCode"]) for r in results] == [
        (Status.CANCELLED, ErrorCode.USER_CANCELLED)
    ]


def test_a_sessionless_call_is_not_recorded_as_a_listing_too(
    gateway: HttpGateway, workspace: Path
) -> None:
    # The SDK checks a 2026-07-28 call's Mcp-Param headers against the tool's schema;
    # it used to get the schema by listing the tools: a TOOLS_EXPOSED event per call.
    async def main() -> str:
        with anyio.fail_after(WAIT_S):
            async with httpx.AsyncClient(timeout=WAIT_S) as http:
                run = run_of(await sessionless(http, gateway.url, "tools/list", {}))
                call = {"name": "repo.search", "arguments": {"query": "greet"}}
                for _ in range(3):
                    called = await sessionless(http, gateway.url, "tools/call", call)
                    assert projection(called)["status"] == "SUCCEEDED"
                return run

    run = anyio.run(main)
    kinds = [e.type for e in ledger_events(workspace, run)]
    assert kinds.count(EventType.TOOLS_EXPOSED) == 1
    assert kinds.count(EventType.TOOL_CALL_RESULT) == 3


def _record(logger: str, error: BaseException | None) -> logging.LogRecord:
    info = (type(error), error, error.__traceback__) if error is not None else None
    return logging.LogRecord(logger, logging.ERROR, __file__, 1, "boom", (), info)


def _raised_from(cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException:
            raise RuntimeError(
                "Unexpected ASGI message 'http.response.start' sent, "
                "after response already completed."
            ) from None
    except RuntimeError as error:
        return error


def test_tracebacks_of_a_request_racing_its_sessions_end_become_one_line(caplog):
    """A cancel notification that reaches a session its DELETE just ended: the SDK and
    uvicorn each logged a traceback (found by a tester: about one session in three)."""
    from toolkernel.mcp.gateway import _without_ended_session_tracebacks as keep

    caplog.set_level(logging.INFO, logger="toolkernel.serve")
    assert keep(_record("mcp.server.streamable_http", anyio.ClosedResourceError())) is False
    assert keep(_record("uvicorn.error", _raised_from(anyio.ClosedResourceError()))) is False
    assert [r.getMessage() for r in caplog.records] == [
        "a request for a session that had just ended was dropped"
    ]
    # Anything else is left to be logged as it was.
    assert keep(_record("uvicorn.error", ValueError("a real bug"))) is True
    assert keep(_record("uvicorn.error", None)) is True

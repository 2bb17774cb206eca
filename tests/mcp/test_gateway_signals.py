"""``toolkernel serve`` over stdio stops on SIGTERM and SIGINT, even while its client
keeps stdin open: the calls in flight are concluded, the kernel closed, the ledger whole,
and the bridged servers stopped with whatever they started. A second signal kills the
bridged servers rather than leave them running.

Each test starts ``python -m toolkernel serve`` as a subprocess whose stdin is a pipe
the test holds open until the server has exited.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from fixtures.bridge_support import (
    FIXTURE_SERVER,
    OPEN_POLICY,
    recorded_pids,
    running,
    wait_for_line,
)

sys.path.insert(0, str(Path(__file__).parent / "gateway_fixtures"))

from gateway_harness import (
    PYTHON,
    RAW_HANDSHAKE,
    WAIT_S,
    make_workspace,
    server_env,
    wait_for_result,
)

from toolkernel.codes import ErrorCode, Status
from toolkernel.mcp.gateway_render import RUN_META

STOP_SIGNALS = [signal.SIGTERM, signal.SIGINT]
STOPS = ["stdin closed", *STOP_SIGNALS]

HANDSHAKE: list[dict[str, Any]] = [
    *RAW_HANDSHAKE,
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "fixture.wait", "arguments": {}, "_meta": {"progressToken": "t"}},
    },
]


async def open_gateway(workspace: Path) -> Process:
    command = [PYTHON, "-m", "toolkernel", "serve", "--workspace", str(workspace)]
    return await anyio.open_process(command, env={**os.environ, **server_env()}, cwd=workspace)


async def messages_until(process: Process, *wanted: Any) -> list[dict[str, Any]]:
    """What the server wrote on stdout, until each of ``wanted`` accepted a message."""
    assert process.stdout is not None
    seen: list[dict[str, Any]] = []
    buffered = b""
    async for chunk in process.stdout:
        *lines, buffered = (buffered + chunk).split(b"\n")
        seen.extend(json.loads(line) for line in lines)
        if all(any(want(message) for message in seen) for want in wanted):
            return seen
    raise AssertionError(f"the server closed stdout after {seen}")


async def stopped(process: Process, signum: signal.Signals) -> tuple[int, str]:
    """Send ``signum`` with stdin still open; the exit status and all of stderr."""
    assert process.stderr is not None
    process.send_signal(signum)
    code = await process.wait()
    errors = b"".join([chunk async for chunk in process.stderr])
    return code, errors.decode(errors="replace")


def verify_ledger(workspace: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "toolkernel", "ledger", "verify", "--workspace", str(workspace)],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: s.name)
def test_a_stop_signal_ends_the_server_and_its_calls_while_stdin_stays_open(
    tmp_path: Path, signum: signal.Signals
) -> None:
    workspace = make_workspace(tmp_path / "ws")

    async def main() -> tuple[str, int, str]:
        with anyio.fail_after(WAIT_S):
            async with await open_gateway(workspace) as process:
                assert process.stdin is not None
                sent = "".join(json.dumps(message) + "\n" for message in HANDSHAKE)
                await process.stdin.send(sent.encode())
                seen = await messages_until(
                    process,
                    lambda m: m.get("id") == 2,
                    lambda m: m.get("method") == "notifications/progress",  # fixture.wait runs
                )
                listed = next(m for m in seen if m.get("id") == 2)["result"]
                code, errors = await stopped(process, signum)
                await process.stdin.aclose()
        return listed["_meta"][RUN_META], code, errors

    run_id, code, errors = anyio.run(main)
    assert code == 0, errors
    assert "Traceback" not in errors
    recorded = anyio.run(wait_for_result, workspace, run_id, "fixture.wait")
    assert recorded["status"] == Status.CANCELLED
    assert recorded["errorCode"] == ErrorCode.RUNTIME_STOPPED  # a shutdown, not a client's cancel
    verified = verify_ledger(workspace)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_sigterm_while_a_bridged_server_starts_stops_it_and_the_server(tmp_path: Path) -> None:
    started = tmp_path / "started"
    hang = f"import os, time; open({str(started)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    config = f"""
[[mcp.servers]]
name = "stuck"
command = {json.dumps([PYTHON, "-c", hang])}
start_timeout_ms = 60000
"""
    workspace = make_workspace(tmp_path / "ws", config=config)

    async def main() -> tuple[int, str]:
        with anyio.fail_after(WAIT_S):
            async with await open_gateway(workspace) as process:
                while not started.is_file() or not started.read_text():
                    await anyio.sleep(0.02)  # bounded polling of another process
                code, errors = await stopped(process, signal.SIGTERM)
                assert process.stdin is not None
                await process.stdin.aclose()
        return code, errors

    code, errors = anyio.run(main)
    assert code == 0, errors
    assert "Traceback" not in errors
    with pytest.raises(ProcessLookupError):  # the server that was starting is gone too
        os.kill(int(started.read_text()), 0)
    verified = verify_ledger(workspace)  # nothing was proposed: nothing recorded, no pass
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert "nothing recorded there yet" in verified.stdout


# A bridged fixture server, listed, with a call of its ``slow`` in flight.
SLOW_CALL: list[dict[str, Any]] = [
    *RAW_HANDSHAKE,
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "fx.slow"}},
]


def bridging_workspace(root: Path, record: Path, *options: str) -> Path:
    """A workspace whose ``serve`` bridges the fixture server (as ``fx``) with ``options``."""
    command = [PYTHON, str(FIXTURE_SERVER), "--record", str(record), *options]
    server = f'[[mcp.servers]]\nname = "fx"\ncommand = {json.dumps(command)}\n'
    return make_workspace(root, config=OPEN_POLICY + server)


async def slow_call_running(process: Process, record: Path) -> str:
    """Send ``SLOW_CALL``; the run's id once ``fx.slow`` runs in the bridged server."""
    assert process.stdin is not None
    await process.stdin.send("".join(json.dumps(m) + "\n" for m in SLOW_CALL).encode())
    seen = await messages_until(process, lambda m: m.get("id") == 2)
    await wait_for_line(record, "started slow")
    return str(next(m for m in seen if m.get("id") == 2)["result"]["_meta"][RUN_META])


async def open_logging_gateway(workspace: Path) -> Process:
    """``open_gateway`` with its stderr in ``serve.log`` beside the workspace: a process
    left running would hold a pipe open, and reading it would wait for that process."""
    command = [PYTHON, "-m", "toolkernel", "serve", "--workspace", str(workspace)]
    with (workspace.parent / "serve.log").open("wb") as log:
        env = {**os.environ, **server_env()}
        return await anyio.open_process(command, env=env, cwd=workspace, stderr=log)


def serve_log(workspace: Path) -> str:
    return (workspace.parent / "serve.log").read_text(encoding="utf-8", errors="replace")


async def stopped_by(process: Process, how: str | signal.Signals) -> int:
    """Stop the gateway by closing its stdin or by a signal; its exit status."""
    assert process.stdin is not None
    if isinstance(how, signal.Signals):
        process.send_signal(how)
    else:
        await process.stdin.aclose()
    return await process.wait()


@pytest.mark.parametrize("how", STOPS, ids=lambda how: getattr(how, "name", "EOF"))
def test_what_a_bridged_server_started_is_gone_when_serve_stops(
    tmp_path: Path, record: Path, how: str | signal.Signals
) -> None:
    """The fixture server exits when its stdin closes, leaving its helpers (one in its
    process group, one in a session of its own) behind, unless serve stops them."""
    workspace = bridging_workspace(tmp_path / "ws", record, "--children")

    async def main() -> tuple[dict[str, int], int]:
        with anyio.fail_after(WAIT_S):
            async with await open_logging_gateway(workspace) as process:
                await slow_call_running(process, record)
                helpers = recorded_pids(record)
                assert all(running(pid) for pid in helpers.values())
                code = await stopped_by(process, how)
        return helpers, code

    helpers, code = anyio.run(main)
    assert code == 0, serve_log(workspace)
    assert sorted(helpers) == ["child", "daemon"]
    assert {name: pid for name, pid in helpers.items() if running(pid)} == {}


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: s.name)
def test_stopping_serve_mid_call_does_not_say_the_bridged_server_is_restarted(
    tmp_path: Path, record: Path, signum: signal.Signals
) -> None:
    """The server answers; it is closed because serve stops, not for being stuck."""
    workspace = bridging_workspace(tmp_path / "ws", record)

    async def main() -> tuple[str, int]:
        with anyio.fail_after(WAIT_S):
            async with await open_logging_gateway(workspace) as process:
                run_id = await slow_call_running(process, record)
                code = await stopped_by(process, signum)
        return run_id, code

    run_id, code = anyio.run(main)
    errors = serve_log(workspace)
    assert code == 0, errors
    assert f"stopping on {signum.name}" in errors
    assert "not answering" not in errors
    assert "restarted" not in errors
    recorded = anyio.run(wait_for_result, workspace, run_id, "fx.slow")
    assert (recorded["status"], recorded["errorCode"]) == (
        Status.CANCELLED,
        ErrorCode.RUNTIME_STOPPED,
    )


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: s.name)
def test_a_second_signal_kills_a_bridged_server_that_ignores_the_first(
    tmp_path: Path, record: Path, signum: signal.Signals
) -> None:
    """The server ignores SIGTERM and SIGINT and stays up after its stdin closes, so
    stopping it takes the SDK's whole escalation; a second signal while serve waits for
    it kills it and its helpers instead of ending serve with them left running."""
    workspace = bridging_workspace(tmp_path / "ws", record, "--children", "--stubborn")

    async def main() -> tuple[str, dict[str, int], int]:
        with anyio.fail_after(WAIT_S):
            async with await open_logging_gateway(workspace) as process:
                run_id = await slow_call_running(process, record)
                processes = recorded_pids(record)
                process.send_signal(signum)
                await wait_for_line(record, "stdin closed")  # serve is stopping it
                code = await stopped_by(process, signum)
        return run_id, processes, code

    run_id, processes, code = anyio.run(main)
    errors = serve_log(workspace)
    assert code == 0, errors
    assert "Traceback" not in errors
    assert f"stopping now on {signum.name}" in errors
    assert sorted(processes) == ["child", "daemon", "server"]
    assert {name: pid for name, pid in processes.items() if running(pid)} == {}
    recorded = anyio.run(wait_for_result, workspace, run_id, "fx.slow")
    assert (recorded["status"], recorded["errorCode"]) == (
        Status.CANCELLED,
        ErrorCode.RUNTIME_STOPPED,
    )
    verified = verify_ledger(workspace)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_sigterm_stops_a_server_whose_client_stopped_reading(tmp_path: Path) -> None:
    """Answers fill the stdout pipe of a client that never reads: the write blocks for
    good, and must not keep SIGTERM from stopping the server."""
    import time

    from gateway_harness import stdio_params

    params = stdio_params(make_workspace(tmp_path / "ws"))
    process = subprocess.Popen(
        [params.command, *params.args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(params.env or {})},
        cwd=params.cwd,
    )
    assert process.stdin is not None
    lines = [json.dumps(message) for message in RAW_HANDSHAKE]
    lines += [
        json.dumps({"jsonrpc": "2.0", "id": n, "method": "tools/list"}) for n in range(2, 400)
    ]
    os.set_blocking(process.stdin.fileno(), False)
    try:
        process.stdin.write(("\n".join(lines) + "\n").encode())
        process.stdin.flush()
    except BlockingIOError:
        pass  # the server stopped reading too: enough is queued
    try:
        time.sleep(3)  # the answers fill the pipe nobody reads
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=WAIT_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()
        with contextlib.suppress(OSError):  # what is left unwritten has nowhere to go
            process.stdin.close()

"""``toolkernel serve`` over stdio stops on SIGTERM and SIGINT, even while its client
keeps stdin open: the calls in flight are concluded, the kernel closed, the ledger whole.

Each test starts ``python -m toolkernel serve`` as a subprocess whose stdin is a pipe
the test holds open until the server has exited.
"""

from __future__ import annotations

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
    verified = verify_ledger(workspace)
    assert verified.returncode == 0, verified.stdout + verified.stderr

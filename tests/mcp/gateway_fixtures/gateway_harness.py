"""Helpers for the gateway tests: a workspace, the server command, the ledger."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from toolkernel.ledger import Event, EventType, SqliteLedger

FIXTURES = Path(__file__).resolve().parent
PYTHON = sys.executable
WAIT_S = 30

# initialize and initialized, as a client writes them by hand on stdin.
RAW_HANDSHAKE: list[dict[str, Any]] = [
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    },
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
]

CONFIG = """\
[run]
profile = "developer"

[tools]
modules = ["gateway_tools"]

[[exposure]]
tools = ["*"]

[[policy.rules]]
tools = ["fixture.echo"]
action = "deny"
reason = "Echo is switched off in this workspace."
"""


def make_workspace(root: Path, config: str = CONFIG) -> Path:
    """A small repository with a toolkernel.toml that serves the fixture tools."""
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("def greet():\n    return 'hello gateway'\n")
    (root / "README.md").write_text("# demo\n")
    (root / "toolkernel.toml").write_text(textwrap.dedent(config))
    return root


def server_env() -> dict[str, str]:
    """The environment of a gateway subprocess: the fixture tools importable."""
    paths = [str(FIXTURES), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def stdio_params(workspace: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=PYTHON,
        args=[
            "-m",
            "toolkernel.mcp.gateway",
            "--transport",
            "stdio",
            "--workspace",
            str(workspace),
        ],
        env=server_env(),
        cwd=str(workspace),
    )


@asynccontextmanager
async def stdio_client(workspace: Path, **options: Any) -> AsyncIterator[Client]:
    """An SDK client connected to ``python -m toolkernel.mcp.gateway`` over stdio.

    The whole session is bounded by ``WAIT_S``.
    """
    with anyio.fail_after(WAIT_S):
        async with Client(stdio_params(workspace), **options) as client:
            yield client


def ledger_events(workspace: Path, run_id: str) -> list[Event]:
    with SqliteLedger(workspace / ".toolkernel" / "ledger.db") as ledger:
        return list(ledger.events(run_id))


async def wait_for_result(workspace: Path, run_id: str, tool: str) -> dict[str, Any]:
    """The recorded result of the last call of ``tool`` once it is in the ledger."""
    with anyio.fail_after(WAIT_S):
        while True:
            results = [
                e.payload["result"]
                for e in ledger_events(workspace, run_id)
                if e.type is EventType.TOOL_CALL_RESULT and e.payload.get("toolName") == tool
            ]
            if results:
                return dict(results[-1])
            await anyio.sleep(0.02)  # bounded polling of another process's ledger


class HttpGateway:
    """``python -m toolkernel.mcp.gateway --transport http --port 0`` as a subprocess.

    Its stderr is read by a thread; ``url`` is known once the server said where it
    listens. ``options`` are more ``serve`` options (``--host``, ``--allowed-origin``).
    ``stop`` sends SIGTERM (uvicorn shuts down gracefully), then SIGKILL.
    """

    def __init__(self, workspace: Path, *options: str) -> None:
        command = [PYTHON, "-m", "toolkernel.mcp.gateway", "--transport", "http", "--port", "0"]
        self.process = subprocess.Popen(
            [*command, *options, "--workspace", str(workspace)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **server_env()},
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            # --host 0.0.0.0 is reached through this machine's loopback address.
            self.url = self._wait_for_url().replace("//0.0.0.0:", "//127.0.0.1:")
        except BaseException:
            self.stop()
            raise

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].split("/", 1)[0])

    def wait_for_line(self, text: str) -> str:
        """The first line of stderr still unread that contains ``text``."""
        while True:
            line = self.lines.get(timeout=WAIT_S)
            self.stderr.append(line)
            if not line:
                raise AssertionError(f"the gateway exited before saying {text!r}")
            if text in line:
                return line

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.put(line)
        self.lines.put("")  # end of output

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + WAIT_S
        while True:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            self.stderr.append(line)
            if not line:
                raise RuntimeError("the gateway exited:\n" + "".join(self.stderr))
            found = re.search(r"listening on (http://\S+/mcp)", line)
            if found:
                return found.group(1)

    def __enter__(self) -> HttpGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the server; it must exit cleanly (code 0)."""
        code = self.stop()
        if exc[0] is None:
            assert code == 0, "".join(self.stderr)

    def stop(self) -> int:
        self.process.terminate()
        try:
            code = self.process.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(timeout=WAIT_S)
        self._reader.join(timeout=WAIT_S)
        assert self.process.stderr is not None
        self.process.stderr.close()
        while not self.lines.empty():
            self.stderr.append(self.lines.get_nowait())
        return code


async def stdio_messages(
    workspace: Path,
    sent: bytes,
    *,
    until: Callable[[list[dict[str, Any]]], bool] | None = None,
    reply: Callable[[dict[str, Any]], bytes | None] | None = None,
) -> list[dict[str, Any]]:
    """What the stdio gateway writes for the raw lines ``sent``, up to the first point
    where ``until`` holds of it (then stdin is closed). Without ``until``, ``sent`` is
    all its stdin: everything it writes until it exits, which it must do cleanly.
    ``reply`` gives what to write back to a message the gateway wrote (a request of its
    own), if anything."""
    params = stdio_params(workspace)
    messages: list[dict[str, Any]] = []
    with anyio.fail_after(WAIT_S):
        async with await anyio.open_process(
            [params.command, *params.args], env=params.env, cwd=params.cwd
        ) as process:
            assert process.stdin is not None
            assert process.stdout is not None
            await process.stdin.send(sent)
            if until is None:
                await process.stdin.aclose()
            buffered = b""
            async for chunk in process.stdout:
                *lines, buffered = (buffered + chunk).split(b"\n")
                for message in map(json.loads, lines):
                    messages.append(message)
                    if reply is not None and (answer := reply(message)) is not None:
                        await process.stdin.send(answer)
                if until is not None and until(messages):
                    await process.stdin.aclose()
                    return messages
            if until is None:
                assert await process.wait() == 0
                return messages + ([json.loads(buffered)] if buffered.strip() else [])
    raise AssertionError(f"the gateway stopped writing before the awaited answers: {messages}")


async def stdio_answers(
    workspace: Path, sent: str, expected: set[int | str]
) -> dict[int | str, dict[str, Any]]:
    """The stdio gateway's answers to the raw lines ``sent``, once ``expected`` (request
    ids) are all in."""

    def answered(messages: list[dict[str, Any]]) -> bool:
        return expected <= {m.get("id") for m in messages if "id" in m}

    messages = await stdio_messages(workspace, sent.encode(), until=answered)
    return {m.get("id"): m for m in messages if "id" in m}

"""The bridge against real third-party servers run as subprocesses: the npm reference
server ``server-everything`` (stdio and streamable HTTP) and PyPI's ``mcp-server-time``
and ``mcp-server-git``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import anyio
import pytest
from fixtures.bridge_support import EVERYTHING, everything_server, free_port, open_kernel

from toolkernel.codes import ErrorCode, Status
from toolkernel.definition import ConcurrencyGroup, TrustLevel
from toolkernel.mcp import McpBridge, ServerConfig

pytestmark = pytest.mark.anyio

TIME = ServerConfig(name="time", command=(sys.executable, "-m", "mcp_server_time"))


async def test_server_everything_tools_are_listed_and_called(workspace):
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    with anyio.fail_after(60):
        async with McpBridge(kernel, [everything_server()]) as bridge:
            [report] = await bridge.connect_all(run)
            assert {"every.echo", "every.get-sum", "every.get-tiny-image"} <= set(report.accepted)
            echo = await kernel.call(run, "every.echo", {"message": "hello"})
            total = await kernel.call(run, "every.get-sum", {"a": 2, "b": 3})
            image = await kernel.call(run, "every.get-tiny-image", {})
    assert echo.status is Status.SUCCEEDED
    assert echo.structured_output["content"][0]["text"] == "Echo: hello"
    assert "5" in total.structured_output["content"][0]["text"]
    images = [c for c in image.structured_output["content"] if c["type"] == "image"]
    assert images
    assert kernel.artifacts.read(images[0]["artifact"]).startswith(b"\x89PNG")


async def test_server_everything_progress_becomes_progress_events(workspace):
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    seen: list[tuple[float, float | None]] = []
    with anyio.fail_after(60):
        async with McpBridge(kernel, [everything_server()]) as bridge:
            await bridge.connect_all(run)
            result = await kernel.call(
                run,
                "every.trigger-long-running-operation",
                {"duration": 0.3, "steps": 3},
                on_progress=lambda _id, p, t, _m: seen.append((p, t)),
            )
    assert result.status is Status.SUCCEEDED
    assert seen == [(1, 3), (2, 3), (3, 3)]


async def test_server_everything_timeout_cancels_and_the_session_survives(workspace):
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    server = everything_server(timeout_ms=400)
    with anyio.fail_after(60):
        async with McpBridge(kernel, [server]) as bridge:
            await bridge.connect_all(run)
            slow = await kernel.call(
                run, "every.trigger-long-running-operation", {"duration": 20, "steps": 20}
            )
            after = await kernel.call(run, "every.echo", {"message": "again"})
    assert slow.status is Status.TIMED_OUT
    assert slow.error_code is ErrorCode.TIMEOUT
    assert after.status is Status.SUCCEEDED


async def test_trusted_annotations_make_read_only_tools_read_only(workspace):
    kernel = open_kernel(workspace)
    server = everything_server(trust=TrustLevel.TRUSTED)
    with anyio.fail_after(60):
        async with McpBridge(kernel, [server]) as bridge:
            await bridge.connect_all()
            echo = kernel.registry.find("every.echo")
            toggle = kernel.registry.find("every.toggle-simulated-logging")
    assert echo is not None
    assert toggle is not None
    assert echo.definition.read_only
    assert echo.definition.concurrency_group is ConcurrencyGroup.READ_ONLY
    assert toggle.definition.safety.mutating


async def test_structured_content_of_server_everything_matches_its_schema(workspace):
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    with anyio.fail_after(60):
        async with McpBridge(kernel, [everything_server()]) as bridge:
            await bridge.connect_all(run)
            result = await kernel.call(run, "every.get-structured-content", {"location": "Chicago"})
    assert result.status is Status.SUCCEEDED
    assert result.structured_output == {
        "temperature": 36,
        "conditions": "Light rain / drizzle",
        "humidity": 82,
    }


async def test_only_allowed_environment_reaches_a_stdio_server(workspace, monkeypatch):
    monkeypatch.setenv("TK_SECRET_TOKEN", "s3cret")
    monkeypatch.setenv("TK_VISIBLE", "yes")
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    server = everything_server(env_allow=("TK_VISIBLE",), env=(("TK_SET", "set"),))
    with anyio.fail_after(60):
        async with McpBridge(kernel, [server]) as bridge:
            await bridge.connect_all(run)
            result = await kernel.call(run, "every.get-env", {})
    text = result.structured_output["content"][0]["text"]
    assert "TK_VISIBLE" in text
    assert "TK_SET" in text
    assert "TK_SECRET_TOKEN" not in text
    assert "s3cret" not in text


async def test_mcp_server_time_call_and_error(workspace):
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    with anyio.fail_after(60):
        async with McpBridge(kernel, [TIME]) as bridge:
            [report] = await bridge.connect_all(run)
            assert set(report.accepted) == {"time.get_current_time", "time.convert_time"}
            now = await kernel.call(run, "time.get_current_time", {"timezone": "Europe/Warsaw"})
            bad = await kernel.call(run, "time.get_current_time", {"timezone": "Mars/Olympus"})
    assert now.status is Status.SUCCEEDED
    assert now.structured_output["timezone"] == "Europe/Warsaw"  # structuredContent + schema
    assert bad.status is Status.FAILED
    assert bad.error_code is ErrorCode.TOOL_ERROR
    assert "Invalid timezone" in bad.structured_output["content"][0]["text"]


async def test_mcp_server_git_status_through_the_bridge(workspace):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    server = ServerConfig(
        name="git",
        command=(sys.executable, "-m", "mcp_server_git", "--repository", str(workspace)),
        tools=frozenset({"git_status"}),
    )
    with anyio.fail_after(60):
        async with McpBridge(kernel, [server]) as bridge:
            [report] = await bridge.connect_all(run)
            assert report.accepted == ("git.git_status",)
            status = await kernel.call(run, "git.git_status", {"repo_path": str(workspace)})
    assert status.status is Status.SUCCEEDED
    assert "src/" in status.structured_output["content"][0]["text"]


@pytest.fixture
def everything_http() -> Iterator[str]:
    node = shutil.which("node")
    if node is None or not (EVERYTHING / "index.js").is_file():
        pytest.fail("server-everything is not installed (make test installs node peers)")
    port = free_port()
    env = {**os.environ, "PORT": str(port)}
    process = subprocess.Popen(
        [node, str(EVERYTHING / "index.js"), "streamableHttp"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        for _ in range(200):  # bounded: the server prints one line once it listens
            line = process.stderr.readline()
            if "listening" in line or not line:
                break
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stderr is not None:
            process.stderr.close()


async def test_streamable_http_server_list_call_and_progress(workspace, everything_http):
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    server = ServerConfig(name="web", url=everything_http)
    progress: list[float] = []
    with anyio.fail_after(60):
        async with McpBridge(kernel, [server]) as bridge:
            [report] = await bridge.connect_all(run)
            assert report.connected, report.error
            echo = await kernel.call(run, "web.echo", {"message": "over http"})
            slow = await kernel.call(
                run,
                "web.trigger-long-running-operation",
                {"duration": 0.3, "steps": 3},
                on_progress=lambda _id, p, _t, _m: progress.append(p),
            )
    assert echo.status is Status.SUCCEEDED
    assert echo.structured_output["content"][0]["text"] == "Echo: over http"
    assert slow.status is Status.SUCCEEDED
    assert progress == [1, 2, 3]

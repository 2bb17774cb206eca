"""Each stdio server writes its stderr on an open file description of its own.

A Node.js server makes its stderr non-blocking; were that stderr the errlog itself
(shared with the gateway and every other server), a Python server logging a burst would
fail with BlockingIOError as soon as the pipe filled.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import anyio
import pytest
from fixtures.bridge_support import HERE, everything_server, open_kernel

from toolkernel.codes import Status
from toolkernel.mcp import McpBridge, ServerConfig
from toolkernel.mcp.bridge import STDERR_FLUSH_S

pytestmark = pytest.mark.anyio

ROUGH_SERVER = HERE / "rough_server.py"
BURST = 20_000  # about 2.5 MB: many times what a pipe holds


def rough_server(name: str = "rough") -> ServerConfig:
    return ServerConfig(name=name, command=(sys.executable, str(ROUGH_SERVER)))


class PipeLog:
    """An errlog that is a pipe, as a gateway's stderr is; a thread drains it."""

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        self.writer: IO[str] = os.fdopen(write_fd, "w", encoding="utf-8")
        self._reader = os.fdopen(read_fd, "rb")
        self._chunks: list[bytes] = []
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    @property
    def blocking(self) -> bool:
        return os.get_blocking(self.writer.fileno())

    def text(self) -> str:
        self.writer.close()
        self._thread.join(timeout=30)
        return b"".join(self._chunks).decode("utf-8", "replace")

    def _drain(self) -> None:
        while chunk := self._reader.read1(65_536):
            self._chunks.append(chunk)
        self._reader.close()


@pytest.fixture
def errlog() -> Iterator[PipeLog]:
    log = PipeLog()
    yield log
    log.writer.close()


async def test_a_node_server_cannot_make_the_shared_stderr_nonblocking_for_the_others(
    workspace, errlog
):
    kernel = open_kernel(workspace)
    run = kernel.start_run()
    servers = [everything_server("every"), rough_server()]
    with anyio.fail_after(60):
        async with McpBridge(kernel, servers, errlog=errlog.writer) as bridge:
            reports = await bridge.connect_all(run)
            assert all(report.connected for report in reports), reports
            echo = await kernel.call(run, "every.echo", {"message": "hi"})
            assert echo.status is Status.SUCCEEDED
            assert errlog.blocking  # Node.js changed its own pipe, not ours
            burst = await kernel.call(run, "rough.burst", {"lines": BURST})
            assert burst.status is Status.SUCCEEDED, burst.safe_message
    logged = errlog.text()
    assert "rough server ready" in logged  # what servers write still reaches the errlog
    assert f"{BURST - 1} noise" in logged


async def test_a_servers_stderr_is_a_description_of_its_own_written_directly(workspace, errlog):
    """The errlog (a pipe here, as a gateway's stderr is) is opened again for the
    server: the same pipe, nothing to copy, and flags of its own (see above)."""
    kernel = open_kernel(workspace)
    with anyio.fail_after(30):
        async with McpBridge(kernel, [rough_server()], errlog=errlog.writer) as bridge:
            [report] = await bridge.connect_all()
            assert report.connected, report.error
            ours = os.fstat(errlog.writer.fileno())
            children = [
                entry
                for entry in Path("/proc").iterdir()
                if entry.name.isdigit() and _parent(entry) == os.getpid() and _is_rough(entry)
            ]
            assert children
            for child in children:
                theirs = (child / "fd" / "2").stat()
                assert (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)
            assert _copiers() == 0
    assert "rough server ready" in errlog.text()


async def test_an_errlog_that_cannot_be_opened_again_gets_a_copy(workspace):
    """An in-memory errlog has no file to open: a pipe of the server's own, copied."""
    import io

    kernel = open_kernel(workspace)
    errlog = io.StringIO()
    with anyio.fail_after(30):
        async with McpBridge(kernel, [rough_server()], errlog=errlog) as bridge:
            [report] = await bridge.connect_all()
            assert report.connected, report.error
            assert _copiers() == 1
    assert "rough server ready" in errlog.getvalue()


def _copiers() -> int:
    return sum(t.name == "mcp-server-stderr" for t in threading.enumerate())


def _parent(process: Path) -> int:
    try:
        stat = (process / "stat").read_text(encoding="utf-8")
        return int(stat.rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _is_rough(process: Path) -> bool:
    try:
        return str(ROUGH_SERVER).encode() in (process / "cmdline").read_bytes()
    except OSError:
        return False


async def test_a_process_a_server_leaves_behind_does_not_keep_its_stderr_copier(
    workspace, tmp_path
):
    # The server's background process holds its stderr open after each crash; the
    # bridge still stops copying (and closes the pipe) once the server is gone.
    import io

    from fixtures.bridge_support import FIXTURE_SERVER

    pids = tmp_path / "pids"
    cmd = (
        f"setsid sleep 60 </dev/null >/dev/null & echo $! >> {pids}; "
        f"exec {sys.executable} {FIXTURE_SERVER}"
    )
    kernel = open_kernel(workspace)
    server = ServerConfig(name="fx", command=("sh", "-c", cmd))

    try:
        with anyio.fail_after(60):
            async with McpBridge(kernel, [server], errlog=io.StringIO()) as bridge:
                await bridge.connect_all()
                run = kernel.start_run()
                for _ in range(4):
                    await kernel.call(run, "fx.crash", {})
                    echoed = await kernel.call(run, "fx.echo", {"message": "x"})
                    assert echoed.status is Status.SUCCEEDED
                await anyio.sleep(STDERR_FLUSH_S + 1)  # the crashed ones' flush window
                assert _copiers() == 1  # the running server's own
            assert _copiers() == 0
    finally:
        kernel.close()
        for pid in pids.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)


async def test_an_errlog_file_written_at_our_own_offset_loses_no_server_line(workspace, tmp_path):
    """`toolkernel serve 2>serve.log`: a file opened without O_APPEND, where the
    server appending on a description of its own would be overwritten by our next
    line; its stderr is copied instead."""
    kernel = open_kernel(workspace)
    log = tmp_path / "serve.log"
    with log.open("w", encoding="utf-8") as errlog:
        errlog.write("runtime: starting\n")
        errlog.flush()
        with anyio.fail_after(30):
            async with McpBridge(kernel, [rough_server()], errlog=errlog) as bridge:
                [report] = await bridge.connect_all()
                assert report.connected, report.error
                assert _copiers() == 1
        errlog.write("runtime: done\n")
    text = log.read_text(encoding="utf-8")
    assert "rough server ready" in text
    assert text.startswith("runtime: starting\n")
    assert text.endswith("runtime: done\n")

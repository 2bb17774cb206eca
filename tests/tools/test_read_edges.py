"""The edges of what tools read back: file.read's long lines, huge files, encodings and
deadline; artifact.read's long lines; shell.run's previews; verifier.run's test ids."""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from tool_support import call_while_stuck, exposing_all, with_timeout

from toolkernel.artifacts import ArtifactStore
from toolkernel.cancel import CancellationToken
from toolkernel.codes import ErrorCode, Status
from toolkernel.redaction import SECRET_MASK, Redactor
from toolkernel.testing import make_kernel
from toolkernel.tools import files, install, workspace_io
from toolkernel.tools.adapter import PREVIEW_BYTES, _capture
from toolkernel.tools.patch import MAX_PATCHED_BYTES
from toolkernel.tools.verifier import parse_junit

pytestmark = pytest.mark.anyio

CONFIG = exposing_all("developer")

PASSWORD = "S3cr3t-P4ss-2024-Vx9-long-passphrase"


@pytest.fixture
def kernel(ws: Path, tools_kernel):
    return tools_kernel(ws, CONFIG)


async def read(kernel, **arguments: Any) -> dict[str, Any]:
    result = await kernel.call(kernel.start_run(), "file.read", arguments)
    assert result.status is Status.SUCCEEDED, result.safe_message
    return result.structured_output


async def test_utf16_without_a_byte_order_mark_is_read_as_little_endian(kernel, ws):
    """Python's incremental UTF-16 decoder raises without a BOM: FAILED, 'the tool raised
    UnicodeError'."""
    (ws / "le.txt").write_bytes("héllo\r\nwörld\r\n".encode("utf-16-le"))
    (ws / "bom.txt").write_bytes("héllo\nwörld\n".encode("utf-16"))

    bare = await read(kernel, path="le.txt", encoding="utf-16")
    marked = await read(kernel, path="bom.txt", encoding="utf-16", startLine=2)

    assert bare["content"] == "héllo\r\nwörld\r\n"
    assert bare["totalLines"] == 2
    assert marked["content"] == "wörld\n"


async def test_a_line_longer_than_max_bytes_says_where_in_the_line_to_read_on(kernel, ws):
    """A 200 KB one-line file said 'continue with startLine=2': a line that does not
    exist, and the rest of line 1 out of reach."""
    line = "var a=" + "1+" * 100_000 + "0;\n"
    (ws / "app.min.js").write_text(line + "var b=1;\n")

    pieces = []
    column = 1
    for _ in range(5):
        out = await read(kernel, path="app.min.js", startColumn=column, maxBytes=131_072)
        pieces.append(out["content"])
        if "nextColumn" not in out:
            break
        assert (out["truncated"], out["nextLine"], out["endLine"]) == (True, 1, 1)
        column = out["nextColumn"]

    assert len(pieces) == 2
    assert "".join(pieces) == line + "var b=1;\n"


async def test_a_single_cut_line_never_points_past_the_end_of_the_file(kernel, ws):
    (ws / "one.txt").write_text("x" * 300 + "\n")

    cut = await kernel.call(kernel.start_run(), "file.read", {"path": "one.txt", "maxBytes": 100})
    out = cut.structured_output
    rest = await read(kernel, path="one.txt", startColumn=out["nextColumn"])

    assert (out["nextLine"], out["nextColumn"], out["totalLines"]) == (1, 101, 1)
    assert "startLine=1, startColumn=101" in cut.safe_message
    assert out["content"] + rest["content"] == "x" * 300 + "\n"
    assert rest["truncated"] is False


async def test_reading_on_inside_a_line_shows_nothing_of_a_secret_across_the_column(kernel, ws):
    """The part of a line read from startColumn starts after the keyword (or inside the
    value): what the kernel's redaction would no longer recognise is masked whole."""
    line = f'{{"host":"db.internal","password":"{PASSWORD}","port":5432}}'
    (ws / "settings.json").write_text(line + "\n")
    at = line.index(PASSWORD)
    for column in range(at - 12, at + len(PASSWORD) - 5):
        out = await read(kernel, path="settings.json", startColumn=column + 1)
        shown = out["content"]
        assert not any(PASSWORD[i : i + 6] in shown for i in range(len(PASSWORD) - 5)), column
        assert shown.endswith(',"port":5432}\n')
        assert SECRET_MASK in shown


async def test_a_file_larger_than_file_patch_changes_is_read_only_as_far_as_the_range(kernel, ws):
    """Lines 1-2 of an 8 GiB file hashed all of it (25 s, past the timeout): the hash is
    the baseHash of file.patch, which changes nothing that large."""
    with (ws / "big.log").open("wb") as handle:  # text for its first 8 KiB, then sparse
        handle.write(b"line one\nline two\n" * 1000)
        handle.truncate(MAX_PATCHED_BYTES + 1)

    out = await read(kernel, path="big.log", endLine=2)

    assert out["content"] == "line one\nline two\n"
    assert (out["sha256"], out["totalLines"]) == (None, None)
    assert out["size"] == MAX_PATCHED_BYTES + 1


async def test_a_file_file_patch_can_change_still_gets_its_hash_and_line_count(kernel, ws):
    data = b"a\n" * 1000
    (ws / "small.txt").write_bytes(data)

    out = await read(kernel, path="small.txt", endLine=2)

    assert out["totalLines"] == 1000
    assert out["sha256"] == "sha256:" + hashlib.sha256(data).hexdigest()


async def test_a_read_stuck_in_its_work_times_out_and_leaves_the_loop_free(
    ws, monkeypatch, tools_kernel
):
    """The handler read on the event loop: its timeout never fired, and nothing else ran."""
    entered, release = threading.Event(), threading.Event()
    real_open = files.open_file

    def stuck_open(dir_fd: int, name: str) -> int:
        entered.set()
        release.wait(5)
        return real_open(dir_fd, name)

    monkeypatch.setattr(files, "open_file", stuck_open)
    (ws / "f.txt").write_text("a\n")
    kernel = tools_kernel(ws, CONFIG, first=[with_timeout(files.file_read, 1_000)])
    result, ticks_while_stuck = await call_while_stuck(
        lambda: kernel.call(kernel.start_run(), "file.read", {"path": "f.txt"}), entered, release
    )

    assert (result.status, result.error_code) == (Status.TIMED_OUT, ErrorCode.TIMEOUT)
    assert ticks_while_stuck > 0


async def test_abandoned_work_stops_at_its_next_checkpoint():
    started, release, ended = threading.Event(), threading.Event(), threading.Event()
    steps: list[int] = []
    stopped: list[BaseException] = []

    def work(checkpoint: Any) -> None:
        started.set()
        release.wait(5)
        try:
            for step in range(1000):
                checkpoint()
                steps.append(step)
        except BaseException as exc:
            stopped.append(exc)
        finally:
            ended.set()

    ctx = type("Ctx", (), {"token": CancellationToken()})()
    with anyio.move_on_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(workspace_io.in_worker, ctx, work)
            await anyio.to_thread.run_sync(started.wait, 5)
            group.cancel_scope.cancel()
    release.set()

    assert ended.wait(5)
    assert steps == []
    assert len(stopped) == 1


def test_an_artifact_line_of_64_kib_or_more_says_it_was_cut_and_where_the_rest_is(tmp_path):
    """A 100,000-byte line read with maxBytes=65536 came back cut with eof: true; with
    65535, 'continue with startLine=2', a line that does not exist."""
    line = b"A" * 100_000 + b"\n"
    kernel = make_kernel(tmp_path / "ws", CONFIG, workspace_tools=False)
    assert install(kernel) is not None
    try:
        alone = kernel.artifacts.put(line, media_type="text/plain")
        followed = kernel.artifacts.put(line + b"next\n", media_type="text/plain")
        run = kernel.start_run()
        for cap in (65_536, 65_535, 100):
            result = kernel.call_sync(
                run, "artifact.read", {"artifactId": alone.id, "startLine": 1, "maxBytes": cap}
            )
            out = result.structured_output
            assert (out["eof"], out["lineCut"], out["nextByte"]) == (False, True, cap)
            assert "nextLine" not in out
            assert f"startByte={cap}" in result.safe_message
            rest = kernel.call_sync(
                run, "artifact.read", {"artifactId": alone.id, "startByte": out["nextByte"]}
            ).structured_output
            assert len(out["content"]) + (line.decode()[cap:].find("\n") + 1) == len(line)
            assert rest["content"].startswith("A" * 100)
        out = kernel.call_sync(
            run, "artifact.read", {"artifactId": followed.id, "startLine": 1, "maxBytes": 100}
        ).structured_output
        assert (out["lineCut"], out["nextByte"], out["nextLine"]) == (True, 100, 2)
    finally:
        kernel.close()


def test_an_artifact_line_is_cut_between_characters(tmp_path):
    kernel = make_kernel(tmp_path / "ws", CONFIG, workspace_tools=False)
    assert install(kernel) is not None
    try:
        ref = kernel.artifacts.put("é".encode() * 100 + b"\n", media_type="text/plain")
        out = kernel.call_sync(
            kernel.start_run(),
            "artifact.read",
            {"artifactId": ref.id, "startLine": 1, "maxBytes": 5},
        ).structured_output
    finally:
        kernel.close()
    assert (out["content"], out["nextByte"]) == ("éé", 4)


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="2" skipped="0" tests="3">
<testcase classname="tests.test_calc" name="test_div_zero" time="0.001">
<failure message="ZeroDivisionError: division by zero">def test_div_zero():
&gt;       assert div(1, 0) == 0

tests/test_calc.py:5:
_ _ _ _
    def div(a, b):
&gt;       return a / b
E       ZeroDivisionError: division by zero

src/calc.py:2: ZeroDivisionError</failure></testcase>
<testcase classname="tests.unit.test_ops.TestAdd" name="test_big" time="0.001">
<failure message="assert 1 == 2">src/ops.py:7: AssertionError</failure></testcase>
<testcase classname="tests.test_calc" name="test_ok" time="0.001"/>
</testsuite></testsuites>
"""


def test_a_failure_raised_in_the_code_under_test_keeps_the_tests_own_id(tmp_path):
    """The id was built from the traceback's last frame: src/calc.py::test_div_zero,
    which re-running by id cannot find."""
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "test_calc.py").write_text("")
    (tmp_path / "tests" / "unit" / "test_ops.py").write_text("")

    report = parse_junit(JUNIT.encode(), tmp_path)

    assert report is not None
    failure, in_class = report.entries
    assert failure.test == "tests/test_calc.py::test_div_zero"
    assert (failure.file, failure.line) == ("src/calc.py", 2)  # where it was raised
    assert in_class.test == "tests/unit/test_ops.py::TestAdd::test_big"


def test_a_test_id_is_not_looked_up_through_a_link(tmp_path):
    """The report is the command's: a link it planted must not tell what exists outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "probe.py").write_text("")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "tests").symlink_to(outside)
    junit = JUNIT.replace("tests.unit.test_ops.TestAdd", "tests.probe.Klass")

    report = parse_junit(junit.encode(), workspace)

    assert report is not None
    assert report.entries[1].test == "tests/probe/Klass.py::test_big"


def capture(tmp_path: Path, output: bytes):
    path = tmp_path / "stdout"
    path.write_bytes(output)
    store = ArtifactStore(tmp_path / "artifacts", redactor=Redactor(tmp_path))
    return _capture(store, path, "stdout", "call_1")


@pytest.mark.parametrize("lead", ["x", "", "xy"])
@pytest.mark.parametrize("count", [1500, 1800, 5000])
def test_a_preview_cut_inside_a_character_shows_it_once_and_whole(tmp_path, lead, count):
    """An output of 2-4 KiB cut mid-character: the tail began with U+FFFD and repeated
    the head's last character's bytes."""
    text = lead + "é" * count

    captured = capture(tmp_path, text.encode())

    assert "\ufffd" not in captured.head + captured.tail
    assert text.startswith(captured.head)
    assert text.endswith(captured.tail)
    if len(text.encode()) <= 2 * PREVIEW_BYTES:
        assert captured.head + captured.tail == text


def test_the_tail_never_repeats_what_the_head_shows(tmp_path):
    """The head runs on to a line end past PREVIEW_BYTES; the tail began before it."""
    text = "a " * 2250 + "\n" + "b " * 250

    captured = capture(tmp_path, text.encode())

    assert text.startswith(captured.head)
    assert text.endswith(captured.tail)
    assert len(captured.head) + len(captured.tail) <= len(text)


def test_previews_still_mask_a_secret_cut_at_the_tail(tmp_path):
    output = ("é" * 1500 + f" password = {PASSWORD} " + "é" * 900).encode()
    captured = capture(tmp_path, output)
    shown = Redactor(tmp_path).redact_text(captured.head + captured.tail, Counter())
    assert PASSWORD[:8] not in shown

"""file.patch writes what ``git apply`` writes: lines broken at "\\n" alone, git's
quoted names, creation diffs, the diff's own line endings; and it works off the event
loop, under its timeout."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tool_support import call_while_stuck, exposing_all, with_timeout

from toolkernel.codes import ErrorCode, Status
from toolkernel.testing import make_kernel
from toolkernel.tools import diffs, install
from toolkernel.tools import patch as patch_module
from toolkernel.tools.diffs import apply_unified_diff, parse_unified_diff

pytestmark = pytest.mark.anyio

CONFIG = exposing_all("workspace-write")

# Every character str.splitlines breaks at, besides "\n" and "\r".
SPLITLINES_BREAKS = "\f\v\x1c\x1d\x1e\x85\u2028\u2029"


@pytest.fixture
def kernel(ws: Path, tools_kernel):
    return tools_kernel(ws, CONFIG)


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


async def patch(kernel, name: str, diff: str, original: bytes | None):
    arguments: dict[str, Any] = {"path": name, "diff": diff}
    if original is not None:
        arguments["baseHash"] = sha(original)
    return await kernel.call(kernel.start_run(), "file.patch", arguments)


def git_apply(tmp_path: Path, name: str, original: bytes | None, diff: str) -> bytes | None:
    """What ``git apply`` makes of ``original`` (``None``: it refused the diff)."""
    where = tmp_path / "git"
    where.mkdir(exist_ok=True)
    target = where / name
    target.unlink(missing_ok=True)
    if original is not None:
        target.write_bytes(original)
    (where / "change.diff").write_bytes(diff.encode())
    applied = subprocess.run(
        ["git", "apply", "change.diff"], cwd=where, capture_output=True, check=False
    )
    return target.read_bytes() if applied.returncode == 0 else None


async def test_a_page_break_line_added_before_blank_lines_is_written_where_the_diff_says(
    kernel, ws, tmp_path
):
    """str.splitlines broke the diff's "+\\f" into two lines: the change SUCCEEDED and
    wrote a blank line instead of the page break."""
    original, wanted = b"a\n\n\n\n", b"a\n\x0c\n\n\n\n"
    diff = "--- a/f.txt\n+++ b/f.txt\n@@ -1,4 +1,5 @@\n a\n+\x0c\n \n \n \n"
    (ws / "f.txt").write_bytes(original)

    result = await patch(kernel, "f.txt", diff, original)

    assert result.status is Status.SUCCEEDED, result.safe_message
    assert (ws / "f.txt").read_bytes() == wanted == git_apply(tmp_path, "f.txt", original, diff)


async def test_a_git_diff_of_a_file_with_a_page_break_applies(kernel, ws, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    source = "int a;\n\x0c\n/* page 2 */\nint b = 1;\n"
    (repo / "m.c").write_text(source)
    git = [
        "git",
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@example.com",
        "-c",
        "commit.gpgsign=false",
    ]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "m.c"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "first"], cwd=repo, check=True)
    (repo / "m.c").write_text(source.replace("b = 1", "b = 2"))
    diff = subprocess.run(
        ["git", "diff", "--no-color", "--src-prefix=a/", "--dst-prefix=b/"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (ws / "m.c").write_text(source)

    result = await patch(kernel, "m.c", diff, source.encode())

    assert result.status is Status.SUCCEEDED, result.safe_message
    assert (ws / "m.c").read_bytes() == (repo / "m.c").read_bytes()


async def test_a_line_holding_a_line_separator_is_one_line_of_the_diff(kernel, ws, tmp_path):
    original = "const s = 'a\u2028b';\nlet x = 1;\n".encode()
    diff = (
        "--- a/m.js\n+++ b/m.js\n@@ -1,2 +1,2 @@\n"
        " const s = 'a\u2028b';\n-let x = 1;\n+let x = 2;\n"
    )
    (ws / "m.js").write_bytes(original)

    result = await patch(kernel, "m.js", diff, original)

    assert result.status is Status.SUCCEEDED, result.safe_message
    written = (ws / "m.js").read_bytes()
    assert written == "const s = 'a\u2028b';\nlet x = 2;\n".encode()
    assert written == git_apply(tmp_path, "m.js", original, diff)


lines_with_breaks = st.lists(st.text(alphabet="ab \t" + SPLITLINES_BREAKS, max_size=4), max_size=12)


@given(old=lines_with_breaks, new=lines_with_breaks)
def test_any_text_with_characters_splitlines_breaks_at_round_trips_through_difflib(old, new):
    old_text = "".join(line + "\n" for line in old)
    new_text = "".join(line + "\n" for line in new)
    diff = "".join(difflib.unified_diff([t + "\n" for t in old], [t + "\n" for t in new]))
    applied, _, _ = apply_unified_diff(old_text, diff) if diff else (old_text, 0, 0)
    assert applied == new_text


@given(
    lines=st.lists(st.sampled_from("abc"), max_size=40),
    old=st.lists(st.sampled_from("abcd"), max_size=4),
    want=st.integers(0, 45),
    floor=st.integers(0, 45),
    wide=st.booleans(),
)
def test_the_hunk_search_finds_the_match_nearest_to_where_the_header_says(
    lines, old, want, floor, wide
):
    """The one-string search agrees with trying each offset, nearest first (the later
    of two as near, as git apply and patch choose), in both of its spellings of a line."""
    points = 0 if wide else diffs._CODE_POINTS  # 0: two characters a line, as past 0x110000
    with mock.patch.object(diffs, "_CODE_POINTS", points):
        index = diffs._LineIndex([line + "\n" for line in lines])
    last = len(lines) - len(old)
    expected = None
    if last >= floor:
        target = min(max(want, floor), last)
        for distance in range(max(target - floor, last - target) + 1):
            hits = [
                at
                for at in (target + distance, target - distance)
                if floor <= at <= last and lines[at : at + len(old)] == old
            ]
            if hits:
                expected = hits[0]
                break
    assert index.find(old, want, floor) == expected


def test_parsing_a_hunk_gathers_its_lines_once_not_at_every_line(monkeypatch):
    """Each line recounted the hunk's old and new lines: a 200 KB diff of one hunk took
    minutes to parse, in validation, on the event loop."""
    gathered = Counter[str]()
    for side in ("old", "new"):
        real = getattr(diffs.Hunk, side)

        def counted(hunk: diffs.Hunk, real: Any = real, side: str = side) -> list[str]:
            gathered[side] += 1
            return real.fget(hunk)

        monkeypatch.setattr(diffs.Hunk, side, property(counted))
    lines = 5_000
    diff = f"@@ -1,{lines} +1,{lines} @@\n" + " same\n" * lines

    (hunk,), _ = parse_unified_diff(diff)

    assert len(hunk.lines) == lines
    assert max(gathered.values()) <= 2


async def test_a_creation_diff_is_refused_for_a_file_that_exists(kernel, ws, tmp_path):
    """It prepended the "new" text to the file's own; git apply refuses it."""
    original = b"print('old')\n"
    diff = (
        "diff --git a/app.py b/app.py\nnew file mode 100644\nindex 0000000..1111111\n"
        "--- /dev/null\n+++ b/app.py\n@@ -0,0 +1,2 @@\n+print('new')\n+print('more')\n"
    )
    (ws / "app.py").write_bytes(original)

    result = await patch(kernel, "app.py", diff, original)

    assert (result.status, result.error_code) == (Status.FAILED, ErrorCode.PRECONDITION_FAILED)
    assert "already exists" in result.safe_message
    assert (ws / "app.py").read_bytes() == original
    assert git_apply(tmp_path, "app.py", original, diff) is None


async def test_a_creation_diff_creates_a_file_that_does_not_exist(kernel, ws):
    diff = "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x = 1\n"

    result = await patch(kernel, "new.py", diff, None)

    assert result.status is Status.SUCCEEDED, result.safe_message
    assert (ws / "new.py").read_bytes() == b"x = 1\n"


async def test_a_git_diff_of_a_quoted_file_name_applies(kernel, ws, tmp_path):
    original = b"hello\nworld\n"
    diff = (
        'diff --git "a/caf\\303\\251.txt" "b/caf\\303\\251.txt"\n'
        "index 94954ab..0f3bed4 100644\n"
        '--- "a/caf\\303\\251.txt"\n+++ "b/caf\\303\\251.txt"\n'
        "@@ -1,2 +1,2 @@\n hello\n-world\n+WORLD\n"
    )
    (ws / "café.txt").write_bytes(original)

    result = await patch(kernel, "café.txt", diff, original)

    assert result.status is Status.SUCCEEDED, result.safe_message
    written = (ws / "café.txt").read_bytes()
    assert written == b"hello\nWORLD\n" == git_apply(tmp_path, "café.txt", original, diff)


@pytest.mark.parametrize(
    ("quoted", "name"),
    [
        ("tab\\there.txt", "tab\there.txt"),
        ('say \\"hi\\".txt', 'say "hi".txt'),
        ("back\\\\slash.txt", "back\\slash.txt"),
        ("two words.txt", "two words.txt"),
    ],
)
def test_git_quoted_names_are_unquoted_in_every_header(quoted, name):
    diff = (
        f'diff --git "a/{quoted}" "b/{quoted}"\n'
        f'--- "a/{quoted}"\n+++ "b/{quoted}"\t2024-01-01\n@@ -1 +1 @@\n-a\n+b\n'
    )
    assert parse_unified_diff(diff)[1] == {name}


def test_a_quoted_name_with_two_different_paths_is_not_one_name():
    diff = '--- "a/x.txt"\n+++ "b/.env"\n@@ -1 +1 @@\n-a\n+b\n'
    assert parse_unified_diff(diff)[1] == {"x.txt", ".env"}
    git = 'diff --git "a/x.txt" "b/.env"\n@@ -1 +1 @@\n-a\n+b\n'
    assert parse_unified_diff(git)[1] - {"x.txt"}


@pytest.mark.parametrize(
    ("original", "diff"),
    [
        (None, "--- /dev/null\n+++ b/win.bat\n@@ -0,0 +1,2 @@\n+@echo off\r\n+echo hi\r\n"),
        (
            b"@echo off",
            "--- a/win.bat\n+++ b/win.bat\n@@ -1 +1,2 @@\n-@echo off\n"
            "\\ No newline at end of file\n+@echo off\r\n+echo hi\r\n",
        ),
    ],
    ids=["new file", "one line without newline"],
)
async def test_a_file_without_a_line_ending_takes_the_diffs(kernel, ws, tmp_path, original, diff):
    if original is not None:
        (ws / "win.bat").write_bytes(original)

    result = await patch(kernel, "win.bat", diff, original)

    assert result.status is Status.SUCCEEDED, result.safe_message
    written = (ws / "win.bat").read_bytes()
    assert written == b"@echo off\r\necho hi\r\n" == git_apply(tmp_path, "win.bat", original, diff)


def test_a_file_with_its_own_line_ending_keeps_it_whatever_the_diff_uses():
    applied, _, _ = apply_unified_diff("a\nb\n", "@@ -1,2 +1,3 @@\n a\n+c\r\n b\n")
    assert applied == "a\nc\nb\n"


async def test_a_patch_stuck_in_its_work_times_out_and_leaves_the_loop_free(
    ws, monkeypatch, tools_kernel
):
    """Reading and applying ran on the event loop: the 20 s timeout never fired (a stale
    hunk against 300,000 lines ended FAILED after 59 s) and every other call waited."""
    entered, release = threading.Event(), threading.Event()
    real_read = patch_module._read_current

    def stuck_read(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(5)
        return real_read(*args, **kwargs)

    monkeypatch.setattr(patch_module, "_read_current", stuck_read)
    original = b"a\n"
    (ws / "f.txt").write_bytes(original)
    quick = with_timeout(patch_module.file_patch, 1_000)
    kernel = tools_kernel(ws, CONFIG, first=[quick])
    result, ticks_while_stuck = await call_while_stuck(
        lambda: patch(kernel, "f.txt", "@@ -1 +1 @@\n-a\n+b\n", original), entered, release
    )

    assert (result.status, result.error_code) == (Status.TIMED_OUT, ErrorCode.TIMEOUT)
    assert ticks_while_stuck > 0
    assert (ws / "f.txt").read_bytes() == original


async def test_a_deadline_passing_while_the_file_is_written_leaves_it_as_it_was(ws, monkeypatch):
    """The call reports TIMED_OUT at once; the abandoned write stops before its rename,
    so the file is not changed behind that result."""
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()
    real_write = patch_module.atomic_write

    def slow_write(*args: Any, **kwargs: Any) -> None:
        entered.set()
        release.wait(5)
        try:
            real_write(*args, **kwargs)
        finally:
            finished.set()

    monkeypatch.setattr(patch_module, "atomic_write", slow_write)
    original = b"a\n"
    (ws / "f.txt").write_bytes(original)
    quick = dataclasses.replace(
        patch_module.file_patch,
        definition=dataclasses.replace(patch_module.file_patch.definition, timeout_ms=1_000),
    )
    kernel = make_kernel(ws, CONFIG, workspace_tools=False)
    kernel.register(quick)
    assert install(kernel) is not None
    try:
        with anyio.fail_after(10):
            result = await patch(kernel, "f.txt", "@@ -1 +1 @@\n-a\n+b\n", original)
    finally:
        release.set()
        kernel.close()

    assert (result.status, result.error_code) == (Status.TIMED_OUT, ErrorCode.TIMEOUT)
    assert entered.is_set()
    assert finished.wait(5)
    assert (ws / "f.txt").read_bytes() == original
    assert sorted(p.name for p in ws.iterdir() if p.name.endswith(".tmp")) == []


async def test_a_deadline_passing_after_the_rename_is_the_patch_done(ws, monkeypatch, tools_kernel):
    """Once the new file is renamed into place the patch has happened: a deadline that
    passes while the directory is synced must not report TIMED_OUT for a changed file."""
    import os
    import stat
    import time

    real_fsync = os.fsync

    def slow_directory_fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            time.sleep(1.5)  # a slow journal commit, past the call's deadline
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_directory_fsync)
    original = b"a\n"
    (ws / "f.txt").write_bytes(original)
    kernel = tools_kernel(ws, CONFIG, first=[with_timeout(patch_module.file_patch, 1_000)])
    result = await patch(kernel, "f.txt", "@@ -1 +1 @@\n-a\n+b\n", original)
    assert result.status is Status.SUCCEEDED
    assert (ws / "f.txt").read_bytes() == b"b\n"


def test_a_hunk_as_near_before_and_after_its_line_is_applied_after_as_git_does(tmp_path):
    """'a' stands one line before and one after where the header points: git apply
    (and patch) take the later one; so must we, or the patch edits another 'a'."""
    original, diff = b"a\nb\na\n", "--- a/f.txt\n+++ b/f.txt\n@@ -2 +2 @@\n-a\n+z\n"
    applied, _, _ = apply_unified_diff(original.decode(), diff)
    assert applied.encode() == git_apply(tmp_path, "f.txt", original, diff) == b"a\nb\nz\n"

"""file.patch through a real Kernel: preconditions, atomic writes, idempotency, diffs."""

from __future__ import annotations

import codecs
import difflib
import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tool_support import exposing_all

from toolkernel.codes import ErrorCode, Status
from toolkernel.testing import make_kernel
from toolkernel.tools import install
from toolkernel.tools.diffs import PatchError, _git_path, apply_unified_diff, parse_unified_diff

pytestmark = pytest.mark.anyio

CONFIG = exposing_all("workspace-write")

ORIGINAL = "def greet():\n    return 'hello'\n\n\ndef part():\n    return 1\n"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    target = root / "src" / "app.py"
    target.write_text(ORIGINAL)
    target.chmod(0o640)
    return root


@pytest.fixture
def kernel(ws: Path):
    kernel = make_kernel(ws, CONFIG, workspace_tools=False)
    assert install(kernel) is not None
    yield kernel
    kernel.close()


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


async def patch(kernel, run=None, *, key: str | None = None, **arguments):
    run = run or kernel.start_run()
    return await kernel.call(run, "file.patch", arguments, idempotency_key=key)


async def test_an_edit_applies_against_the_hash_file_read_returned(kernel, ws):
    run = kernel.start_run()
    read = await kernel.call(run, "file.read", {"path": "src/app.py"})
    result = await patch(
        kernel,
        run,
        path="src/app.py",
        baseHash=read.structured_output["sha256"],
        edits=[{"search": "'hello'", "replace": "'hi'"}],
    )
    assert result.status is Status.SUCCEEDED, result.safe_message
    new = (ws / "src" / "app.py").read_bytes()
    assert new == ORIGINAL.replace("'hello'", "'hi'").encode()
    assert result.structured_output["sha256"] == sha(new)
    assert (ws / "src" / "app.py").stat().st_mode & 0o777 == 0o640


async def test_a_unified_diff_applies(kernel, ws):
    wanted = ORIGINAL.replace("return 1", "return 2")
    diff = "".join(
        difflib.unified_diff(
            ORIGINAL.splitlines(True), wanted.splitlines(True), "a/src/app.py", "b/src/app.py"
        )
    )
    result = await patch(kernel, path="src/app.py", baseHash=sha(ORIGINAL.encode()), diff=diff)
    assert result.status is Status.SUCCEEDED, result.safe_message
    assert (ws / "src" / "app.py").read_text() == wanted
    assert result.structured_output["linesAdded"] == 1


async def test_a_changed_file_fails_the_precondition_and_is_left_alone(kernel, ws):
    stale = sha(ORIGINAL.encode())
    (ws / "src" / "app.py").write_text(ORIGINAL + "# edited by someone else\n")
    result = await patch(
        kernel, path="src/app.py", baseHash=stale, edits=[{"search": "1", "replace": "2"}]
    )
    assert result.status is Status.FAILED
    assert result.error_code is ErrorCode.PRECONDITION_FAILED
    assert (ws / "src" / "app.py").read_text().endswith("# edited by someone else\n")


async def test_a_failing_hunk_writes_nothing_and_leaves_no_temporary_file(kernel, ws):
    diff = (
        "--- a/src/app.py\n+++ b/src/app.py\n"
        "@@ -1,2 +1,2 @@\n def greet():\n-    return 'hello'\n+    return 'hey'\n"
        "@@ -5,2 +5,2 @@\n def part():\n-    return 42\n+    return 43\n"
    )
    before = sorted(p.name for p in (ws / "src").iterdir())
    result = await patch(kernel, path="src/app.py", baseHash=sha(ORIGINAL.encode()), diff=diff)
    assert result.error_code is ErrorCode.PRECONDITION_FAILED
    assert "hunk 2" in result.safe_message
    assert (ws / "src" / "app.py").read_text() == ORIGINAL
    assert sorted(p.name for p in (ws / "src").iterdir()) == before


async def test_a_failed_write_keeps_the_old_file_whole(kernel, ws, monkeypatch):
    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("toolkernel.tools.workspace_io.os.fsync", broken_fsync)
    result = await patch(
        kernel,
        path="src/app.py",
        baseHash=sha(ORIGINAL.encode()),
        edits=[{"search": "'hello'", "replace": "'x'"}],
    )
    assert result.status is Status.FAILED
    assert (ws / "src" / "app.py").read_text() == ORIGINAL
    assert sorted(p.name for p in (ws / "src").iterdir()) == ["app.py"]


async def test_a_repeated_idempotency_key_does_not_apply_twice(kernel, ws):
    run = kernel.start_run()
    arguments = {
        "path": "src/app.py",
        "baseHash": sha(ORIGINAL.encode()),
        "edits": [{"search": "return 1", "replace": "return 1 + 1"}],
    }
    first = await patch(kernel, run, key="edit-1", **arguments)
    second = await patch(kernel, run, key="edit-1", **arguments)
    assert first.status is second.status is Status.SUCCEEDED
    assert second.structured_output == first.structured_output
    assert (ws / "src" / "app.py").read_text().count("return 1 + 1") == 1


async def test_a_new_file_is_created_without_base_hash_and_never_overwritten(kernel, ws):
    created = await patch(
        kernel, path="src/pkg/new.py", edits=[{"search": "", "replace": "VALUE = 1\n"}]
    )
    assert created.status is Status.SUCCEEDED
    assert created.structured_output["created"] is True
    assert (ws / "src" / "pkg" / "new.py").read_text() == "VALUE = 1\n"
    again = await patch(
        kernel, path="src/pkg/new.py", edits=[{"search": "", "replace": "VALUE = 2\n"}]
    )
    assert again.error_code is ErrorCode.PRECONDITION_FAILED


async def test_ambiguous_edits_and_bad_arguments_are_rejected(kernel, ws):
    base = sha(ORIGINAL.encode())
    twice = await patch(
        kernel, path="src/app.py", baseHash=base, edits=[{"search": "return", "replace": "r"}]
    )
    assert twice.error_code is ErrorCode.PRECONDITION_FAILED
    both = await patch(kernel, path="src/app.py", baseHash=base, diff="@@", edits=[])
    assert both.error_code is ErrorCode.SCHEMA_VIOLATION
    bad_hash = await patch(kernel, path="src/app.py", baseHash="md5:abc", edits=[])
    assert bad_hash.error_code is ErrorCode.SCHEMA_VIOLATION
    other_file = "--- a/other.py\n+++ b/other.py\n@@ -1 +1 @@\n-a\n+b\n"
    wrong = await patch(kernel, path="src/app.py", baseHash=base, diff=other_file)
    assert wrong.error_code is ErrorCode.SCHEMA_VIOLATION
    assert (ws / "src" / "app.py").read_text() == ORIGINAL


HUNK = "@@ -6 +6 @@\n-    return 1\n+    return 2\n"
GIT_HEADER = "diff --git a/src/app.py b/src/app.py\nindex 0123abc..4567def 100644\n"
PLAIN_HEADERS = "--- a/src/app.py\n+++ b/src/app.py\n"


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(
            "diff --git a/src/app.py b/.env\nsimilarity index 90%\n"
            "rename from src/app.py\nrename to .env\n",
            id="rename-to-env",
        ),
        pytest.param(
            "diff --git a/src/app.py b/src/app.py\nrename from src/app.py\nrename to .env\n"
            + PLAIN_HEADERS,
            id="rename-lines-under-a-same-path-header",
        ),
        pytest.param(
            "diff --git a/src/app.py b/src/copy.py\nsimilarity index 90%\n"
            "copy from src/app.py\ncopy to src/copy.py\n" + PLAIN_HEADERS,
            id="copy",
        ),
        pytest.param("diff --git a/src/app.py b/.env\n" + PLAIN_HEADERS, id="git-header-names-env"),
        pytest.param("diff --git a/src/app.py b/../../x\n", id="git-header-names-traversal"),
        pytest.param("diff --git a/src/app.py b//etc/passwd\n", id="git-header-names-absolute"),
        pytest.param(
            "diff --git a/src/app.py b/src/app.py\ndeleted file mode 100644\n" + PLAIN_HEADERS,
            id="deleted-file-mode",
        ),
        pytest.param("--- a/src/app.py\n+++ /dev/null\n", id="plus-dev-null-deletion"),
        pytest.param(
            "diff --git a/src/app.py b/src/app.py\nold mode 100644\nnew mode 100755\n"
            + PLAIN_HEADERS,
            id="old-new-mode",
        ),
        pytest.param(
            "diff --git a/src/app.py b/src/app.py\nnew file mode 120000\n" + PLAIN_HEADERS,
            id="new-symlink-mode",
        ),
        pytest.param(
            "diff --git a/src/app.py b/src/app.py\nindex 0123abc..4567def 100644\n"
            "GIT binary patch\nliteral 3\nKcmZ>e\n\n",
            id="git-binary-patch",
        ),
        pytest.param(
            GIT_HEADER + "Binary files a/src/app.py and b/src/app.py differ\n",
            id="binary-files-differ",
        ),
    ],
)
async def test_git_headers_that_rename_copy_delete_or_name_another_path_are_refused(
    kernel, ws, headers
):
    before = sorted(p.name for p in ws.rglob("*"))
    result = await patch(
        kernel, path="src/app.py", baseHash=sha(ORIGINAL.encode()), diff=headers + HUNK
    )
    assert result.status is Status.INVALID_ARGUMENTS
    assert result.error_code is ErrorCode.SCHEMA_VIOLATION
    assert (ws / "src" / "app.py").read_text() == ORIGINAL
    assert sorted(p.name for p in ws.rglob("*")) == before


async def test_a_git_header_after_the_hunks_is_refused_too(kernel, ws):
    diff = GIT_HEADER + PLAIN_HEADERS + HUNK + "diff --git a/src/app.py b/.env\nrename to .env\n"
    result = await patch(kernel, path="src/app.py", baseHash=sha(ORIGINAL.encode()), diff=diff)
    assert result.error_code is ErrorCode.SCHEMA_VIOLATION
    assert (ws / "src" / "app.py").read_text() == ORIGINAL


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("./src/app.py", "./src/app.py"),  # diff -u ./src/app.py ...
        ("a/./src/app.py", "b/./src/app.py"),
        ("src/app.py\t2026-12-01 05:00:00", "./src/app.py\t2026-12-01 05:01:00"),
    ],
)
async def test_headers_naming_the_path_with_a_dot_segment_apply(kernel, ws, old, new):
    """``./src/app.py`` is the patched path, spelt as ``diff -u ./src/app.py`` writes it."""
    wanted = ORIGINAL.replace("return 1", "return 2")
    hunks = "".join(
        difflib.unified_diff(ORIGINAL.splitlines(True), wanted.splitlines(True), n=1)
    ).split("\n", 2)[2]
    diff = f"--- {old}\n+++ {new}\n{hunks}"
    result = await patch(kernel, path="src/app.py", baseHash=sha(ORIGINAL.encode()), diff=diff)
    assert result.status is Status.SUCCEEDED, result.safe_message
    assert (ws / "src" / "app.py").read_text() == wanted


async def test_headers_naming_another_file_are_refused_naming_it(kernel, ws):
    diff = "--- src/app.py\n+++ src/app.py.new\n@@ -6 +6 @@\n-    return 1\n+    return 2\n"
    result = await patch(kernel, path="src/app.py", baseHash=sha(ORIGINAL.encode()), diff=diff)
    assert result.error_code is ErrorCode.SCHEMA_VIOLATION
    assert "'src/app.py.new'" in result.safe_message
    assert "'src/app.py'" in result.safe_message
    assert (ws / "src" / "app.py").read_text() == ORIGINAL


def test_a_diff_git_line_of_many_spaces_is_read_in_one_pass():
    """The path of ``diff --git a/P b/P`` is found at the middle, not by trying every
    space: a line of 100,000 spaces took minutes that way."""
    assert _git_path("a/my file.py b/my file.py") == "my file.py"
    spaced = "a/x" + " " * 100_000 + "b/y"
    assert _git_path(spaced) == spaced  # two paths: refused as naming another
    assert _git_path("a/app.py b/.env") == "a/app.py b/.env"


async def test_a_rename_refusal_says_what_is_unsupported_and_what_to_send(kernel):
    diff = "diff --git a/src/app.py b/.env\nrename from src/app.py\nrename to .env\n" + HUNK
    result = await patch(kernel, path="src/app.py", baseHash=sha(ORIGINAL.encode()), diff=diff)
    assert result.error_code is ErrorCode.SCHEMA_VIOLATION
    assert "rename" in result.safe_message
    assert "unified diff" in result.safe_message


@pytest.mark.parametrize("headers", [GIT_HEADER + PLAIN_HEADERS, GIT_HEADER.split("\n")[0] + "\n"])
async def test_git_diff_output_for_the_patched_file_still_applies(kernel, ws, headers):
    result = await patch(
        kernel, path="src/app.py", baseHash=sha(ORIGINAL.encode()), diff=headers + HUNK
    )
    assert result.status is Status.SUCCEEDED, result.safe_message
    assert (ws / "src" / "app.py").read_text() == ORIGINAL.replace("return 1", "return 2")


async def test_a_git_diff_may_create_a_plain_new_file(kernel, ws):
    diff = (
        "diff --git a/src/new.py b/src/new.py\nnew file mode 100644\n"
        "index 0000000..4567def\n--- /dev/null\n+++ b/src/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
    )
    result = await patch(kernel, path="src/new.py", diff=diff)
    assert result.status is Status.SUCCEEDED, result.safe_message
    assert (ws / "src" / "new.py").read_text() == "x = 1\n"


async def test_write_scope_is_enforced_before_dispatch(ws):
    kernel = make_kernel(
        ws, CONFIG + '\n[policy]\nwrite_scope = ["docs/**"]\n', workspace_tools=False
    )
    install(kernel)
    try:
        result = await patch(kernel, path="src/x.py", edits=[{"search": "", "replace": "x"}])
    finally:
        kernel.close()
    assert result.error_code is ErrorCode.WRITE_SCOPE_DENIED
    assert not (ws / "src" / "x.py").exists()


lines = st.lists(st.text(alphabet="ab \t", max_size=4), max_size=12)


@given(old=lines, new=lines)
def test_applying_difflib_output_reproduces_the_new_text(old, new):
    old_text = "".join(line + "\n" for line in old)
    new_text = "".join(line + "\n" for line in new)
    diff = "".join(difflib.unified_diff(old_text.splitlines(True), new_text.splitlines(True)))
    applied, _, _ = apply_unified_diff(old_text, diff) if diff else (old_text, 0, 0)
    assert applied == new_text


@given(old=lines, new=lines)
def test_git_diff_output_parses_to_the_one_path_and_applies(old, new):
    old_text = "".join(line + "\n" for line in old)
    new_text = "".join(line + "\n" for line in new)
    body = "".join(
        difflib.unified_diff(
            old_text.splitlines(True), new_text.splitlines(True), "a/f.txt", "b/f.txt"
        )
    )
    if not body:
        return
    diff = "diff --git a/f.txt b/f.txt\nindex 0123456..789abcd 100644\n" + body
    assert parse_unified_diff(diff)[1] == {"f.txt"}
    assert apply_unified_diff(old_text, diff)[0] == new_text


GIT_KEYWORDS = [
    "diff --git a/f.txt b/",
    "diff --git ",
    "rename from ",
    "rename to ",
    "rename old ",
    "rename new ",
    "copy from ",
    "copy to ",
    "similarity index ",
    "dissimilarity index ",
    "deleted file mode ",
    "new file mode ",
    "old mode ",
    "new mode ",
    "index ",
    "Binary files a/f.txt and b/",
    "GIT binary patch ",
    "--- a/",
    "+++ b/",
]
other_paths = st.builds(
    str.__add__,
    st.sampled_from([".env", "../..", "/etc/passwd", "f.txt.orig", "b/.env", "~/.ssh/x"]),
    st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=8),
)


GIT_DIFF_LINES = [
    "diff --git a/f.txt b/f.txt",
    "index 0123456..789abcd 100644",
    "--- a/f.txt",
    "+++ b/f.txt",
    "@@ -1 +1 @@",
    "-a",
    "+b",
]


@given(keyword=st.sampled_from(GIT_KEYWORDS), other=other_paths, at=st.integers(1, 2))
def test_no_header_line_lets_another_path_through(keyword, other, at):
    """Within a git header (after ``diff --git``, up to its ``---`` line) every line
    that names a path or asks for more than a text change is refused or seen."""
    lines = [*GIT_DIFF_LINES]
    lines.insert(at, keyword + other)
    try:
        _, names = parse_unified_diff("\n".join(lines) + "\n")
    except PatchError:
        return
    assert names - {"f.txt"}


@given(keyword=st.sampled_from(GIT_KEYWORDS), other=other_paths, at=st.sampled_from([0, 7]))
def test_outside_the_header_only_file_lines_name_paths(keyword, other, at):
    """Before ``diff --git`` or after the hunks, git apply reads header words as prose (a
    commit message, a signature), and so does file.patch: they change nothing. A ``---``
    or ``+++`` line there still names a path."""
    lines = [*GIT_DIFF_LINES]
    lines.insert(at, keyword + other)
    names_a_path = keyword.startswith(("--- ", "+++ ", "diff --git"))
    try:
        _, names = parse_unified_diff("\n".join(lines) + "\n")
    except PatchError:
        assert names_a_path
        return
    if names_a_path:
        assert names - {"f.txt"}
    else:
        assert names == {"f.txt"}


@pytest.mark.parametrize(
    "prose",
    [
        "index rebuild is now lazy",
        "new mode of operation documented",
        "Binary files are skipped now",
        "rename from the old scheme",
    ],
)
def test_a_commit_message_with_header_words_is_prose(prose):
    """``git format-patch`` output: the message comes before ``diff --git``."""
    diff = f"Subject: [PATCH] speed up\n\n{prose}\n---\n" + "\n".join(GIT_DIFF_LINES) + "\n"
    _, names = parse_unified_diff(diff)
    assert names == {"f.txt"}


def test_the_no_newline_marker_is_honoured():
    diff = "@@ -1,2 +1,2 @@\n a\n-b\n+c\n\\ No newline at end of file\n"
    assert apply_unified_diff("a\nb\n", diff)[0] == "a\nc"


async def _read_then_patch(kernel, ws, data: bytes, read_as: str, **change):
    (ws / "legacy.txt").write_bytes(data)
    run = kernel.start_run()
    read = await kernel.call(run, "file.read", {"path": "legacy.txt", "encoding": read_as})
    assert read.status is Status.SUCCEEDED, read.safe_message
    return read, await patch(
        kernel, run, path="legacy.txt", baseHash=read.structured_output["sha256"], **change
    )


@pytest.mark.parametrize(
    ("encoding", "data", "expected"),
    [
        ("latin-1", "café = 1\nx = 2\n".encode("latin-1"), "café = 10\nx = 2\n".encode("latin-1")),
        ("cp1252", "price = 5 €\n".encode("cp1252"), "price = 10 €\n".encode("cp1252")),
        (
            "utf-16",
            codecs.BOM_UTF16_BE + "café = 1\n".encode("utf-16-be"),
            codecs.BOM_UTF16_BE + "café = 10\n".encode("utf-16-be"),
        ),
        ("utf-16", "café = 1\n".encode("utf-16-le"), "café = 10\n".encode("utf-16-le")),
    ],
)
async def test_a_file_in_another_encoding_is_patched_in_its_own_encoding(
    kernel, ws, encoding, data, expected
):
    search = "5 €" if encoding == "cp1252" else "café = 1"
    replace = "10 €" if encoding == "cp1252" else "café = 10"
    read, result = await _read_then_patch(
        kernel,
        ws,
        data,
        encoding,
        encoding=encoding,
        edits=[{"search": search, "replace": replace}],
    )
    assert search in read.structured_output["content"]
    assert result.status is Status.SUCCEEDED, result.safe_message
    assert (ws / "legacy.txt").read_bytes() == expected


async def test_a_file_that_is_not_utf8_gets_no_utf8_text_added(kernel, ws):
    data = "café = 1\nx = 2\n".encode("latin-1")
    _, result = await _read_then_patch(
        kernel, ws, data, "latin-1", edits=[{"search": "x = 2", "replace": "x = 'naïve'"}]
    )
    assert result.error_code is ErrorCode.PRECONDITION_FAILED
    assert "'legacy.txt' is not UTF-8 text" in result.safe_message
    assert "pass the encoding file.read used" in result.safe_message
    assert (ws / "legacy.txt").read_bytes() == data


async def test_an_ascii_change_to_a_file_that_is_not_utf8_keeps_its_other_bytes(kernel, ws):
    data = "café = 1\nx = 2\n".encode("latin-1")
    _, result = await _read_then_patch(
        kernel, ws, data, "latin-1", edits=[{"search": "x = 2", "replace": "x = 3"}]
    )
    assert result.status is Status.SUCCEEDED, result.safe_message
    assert (ws / "legacy.txt").read_bytes() == "café = 1\nx = 3\n".encode("latin-1")


@pytest.mark.parametrize(
    ("encoding", "data", "why"),
    [
        ("latin-1", b"price = 5\n", "latin-1 cannot encode '€'"),
        ("ascii", b"price = 5\n", "ascii cannot encode '€'"),
        ("cp1252", b"price = \x81 5\n", "'legacy.txt' is not cp1252 text (byte 0x81 at offset 8)"),
    ],
)
async def test_text_the_encoding_cannot_hold_is_refused_and_nothing_is_written(
    kernel, ws, encoding, data, why
):
    _, result = await _read_then_patch(
        kernel,
        ws,
        data,
        "latin-1",
        encoding=encoding,
        edits=[{"search": "5", "replace": "5 €"}],
    )
    assert result.error_code is ErrorCode.PRECONDITION_FAILED
    assert why in result.safe_message
    assert (ws / "legacy.txt").read_bytes() == data

"""file.read through a real Kernel: line ranges, the size cap, binary files, encodings."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest

from toolkernel.codes import ErrorCode, Status
from toolkernel.redaction import SECRET_MASK
from toolkernel.testing import make_kernel
from toolkernel.tools import install

pytestmark = pytest.mark.anyio

CONFIG = """
[[exposure]]
tools = ["*"]
"""


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "lines.txt").write_text("".join(f"line {i}\n" for i in range(1, 101)))
    return root


@pytest.fixture
def kernel(ws: Path):
    kernel = make_kernel(ws, CONFIG, workspace_tools=False)
    assert install(kernel) is not None
    yield kernel
    kernel.close()


async def read(kernel, **arguments):
    return await kernel.call(kernel.start_run(), "file.read", arguments)


async def test_a_line_range_comes_back_with_the_hash_of_the_whole_file(kernel, ws):
    result = await read(kernel, path="src/lines.txt", startLine=10, endLine=12)
    assert result.status is Status.SUCCEEDED
    out = result.structured_output
    assert out["content"] == "line 10\nline 11\nline 12\n"
    assert (out["startLine"], out["endLine"], out["totalLines"]) == (10, 12, 100)
    whole = (ws / "src" / "lines.txt").read_bytes()
    assert out["sha256"] == "sha256:" + hashlib.sha256(whole).hexdigest()


async def test_the_size_cap_cuts_at_a_line_and_says_where_to_continue(kernel):
    result = await read(kernel, path="src/lines.txt", maxBytes=20)
    out = result.structured_output
    assert out["content"] == "line 1\nline 2\n"
    assert out["truncated"] is True
    assert out["nextLine"] == 3
    assert "startLine=3" in result.safe_message


async def test_a_binary_file_is_described_not_dumped(kernel, ws):
    blob = bytes(range(256)) * 40
    (ws / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0" + blob)
    result = await read(kernel, path="logo.png")
    out = result.structured_output
    assert out["binary"] is True
    assert out["mediaType"] == "image/png"
    assert out["size"] == 9 + len(blob)
    assert "content" not in out
    assert out["sha256"].startswith("sha256:")


async def test_encodings_are_decoded(kernel, ws):
    (ws / "latin.txt").write_bytes("café\n".encode("latin-1"))
    (ws / "wide.txt").write_bytes("naïve\nzwei\n".encode("utf-16"))
    latin = await read(kernel, path="latin.txt", encoding="latin-1")
    assert latin.structured_output["content"] == "café\n"
    wide = await read(kernel, path="wide.txt", encoding="utf-16", startLine=2)
    assert wide.structured_output["content"] == "zwei\n"


async def test_missing_files_and_directories_are_not_found(kernel):
    missing = await read(kernel, path="src/nope.txt")
    assert missing.error_code is ErrorCode.NOT_FOUND
    directory = await read(kernel, path="src")
    assert directory.error_code is ErrorCode.NOT_FOUND


async def test_links_out_of_the_workspace_and_forbidden_files_are_refused(kernel, ws, tmp_path):
    (tmp_path / "secret.txt").write_text("host secret\n")
    (ws / "escape.txt").symlink_to(tmp_path / "secret.txt")
    (ws / ".env").write_text("TOKEN=abc\n")
    escape = await read(kernel, path="escape.txt")
    assert escape.error_code is ErrorCode.SYMLINK_ESCAPE
    forbidden = await read(kernel, path=".env")
    assert forbidden.error_code is ErrorCode.FORBIDDEN_PATH


async def test_a_fifo_is_refused_without_hanging(kernel, ws):
    os.mkfifo(ws / "pipe")
    result = await read(kernel, path="pipe")
    assert result.error_code is ErrorCode.NOT_FOUND


async def test_end_before_start_is_out_of_bounds(kernel):
    result = await read(kernel, path="src/lines.txt", startLine=5, endLine=4)
    assert result.status is Status.INVALID_ARGUMENTS
    assert result.error_code is ErrorCode.OUT_OF_BOUNDS


async def test_a_whole_number_sent_as_a_float_reaches_the_tool_as_an_integer(kernel):
    """JSON Schema counts 1.0 as an integer; the tool must not echo "lines 10.0-12"."""
    result = await read(kernel, path="src/lines.txt", startLine=10.0, endLine=12)
    assert result.status is Status.SUCCEEDED
    assert result.structured_output["startLine"] == 10
    assert type(result.structured_output["startLine"]) is int
    assert "10.0" not in result.safe_message


async def test_a_name_too_long_for_the_file_system_says_so(kernel):
    result = await read(kernel, path="src/" + "n" * 300 + ".txt")
    assert (result.status, result.error_code) == (Status.FAILED, ErrorCode.NOT_FOUND)
    assert "too long" in result.safe_message


PASSWORD = "S3cr3t-P4ss-2024-Vx9-long-passphrase"
TOKEN = "ghp_" + "R8kT3mZq9XwL2vN7pB4sY6dF1hJ0cE5aG8uK"


async def test_a_line_cut_at_max_bytes_shows_nothing_of_a_secret_across_the_cut(kernel, ws):
    """One line longer than maxBytes comes back cut before the kernel redacts it: swept
    through a value, the cut showed 31 of a password's 36 characters."""
    line = f'{{"db":{{"host":"db.internal","password":"{PASSWORD}"}},"gh":{{"token":"{TOKEN}"}}}}'
    (ws / "settings.json").write_text(line + "\n")
    for secret in (PASSWORD, TOKEN):
        at = line.index(secret)
        for cut in range(at + 1, at + len(secret)):
            result = await read(kernel, path="settings.json", maxBytes=cut)
            content = result.structured_output["content"]
            assert result.structured_output["truncated"] is True
            assert content.startswith('{"db":{"host":"db.internal","password":')
            assert not any(secret[i : i + 6] in content for i in range(len(secret) - 5)), content
            assert len(content.encode()) <= cut + len(SECRET_MASK)


async def test_running_out_of_descriptors_is_the_runtimes_retryable_failure(
    kernel, monkeypatch, caplog
):
    """Not the file's: 'is not a regular file that can be read', NOT_FOUND, for a file
    that is there, told the model to look elsewhere."""

    def exhausted(*_args: object, **_kwargs: object) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr("toolkernel.tools.files.open_file", exhausted)
    result = await read(kernel, path="src/lines.txt")

    assert (result.status, result.error_code) == (Status.FAILED, ErrorCode.INTERNAL_ERROR)
    assert result.retryable is True
    assert "Too many open files" in caplog.text

"""The content-addressed store and artifact.read, its continuation tool."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from toolkernel.artifacts import ArtifactStore
from toolkernel.codes import ErrorCode, Status
from toolkernel.errors import ToolPartial, UsageError
from toolkernel.functions import tool
from toolkernel.testing import make_kernel
from toolkernel.tools import install

pytestmark = pytest.mark.anyio

CONFIG = """
[[exposure]]
tools = ["*"]
"""


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_put_is_content_addressed_and_owner_only(tmp_path):
    store = ArtifactStore(tmp_path / "state" / "artifacts")
    ref = store.put(b"hello", media_type="text/plain", producer="call_1")
    again = store.put(b"hello", producer="call_2")
    assert ref.id == again.id
    assert ref.id == "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    path = store.root / ref.id[7:9] / ref.id[7:]
    assert mode(path) == 0o600
    assert mode(path.with_suffix(".json")) == 0o600
    assert mode(store.root) == mode(path.parent) == 0o700
    assert store.metadata(ref.id)["producer"] == "call_1"
    assert store.read(ref.id, 1, 3) == b"el"


def test_put_file_moves_a_large_file_in_without_reading_it_whole(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")
    staging = store.staging_dir()
    source = staging / "stdout"
    with source.open("wb") as handle:
        for _ in range(64):
            handle.write(b"x" * 1024 * 1024)
    ref = store.put_file(source, media_type="text/plain", move=True)
    assert ref.size == 64 * 1024 * 1024
    assert not source.exists()
    assert store.read(ref.id, ref.size - 2) == b"xx"


def test_put_file_copies_when_asked_and_the_writer_streams(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")
    source = tmp_path / "report.txt"
    source.write_bytes(b"abc")
    copied = store.put_file(source)
    assert source.exists()
    with store.writer(media_type="text/plain") as writer:
        writer.write(b"a")
        writer.write(b"bc")
        streamed = writer.commit()
    assert copied.id == streamed.id


def test_an_uncommitted_writer_leaves_nothing(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")

    def produce() -> None:
        with store.writer() as writer:
            writer.write(b"partial")
            raise RuntimeError("producer died")

    with pytest.raises(RuntimeError):
        produce()
    assert list((store.root / ".incoming").iterdir()) == []


@pytest.fixture
def kernel(tmp_path: Path):
    kernel = make_kernel(tmp_path / "ws", CONFIG, workspace_tools=False)
    assert install(kernel) is not None
    yield kernel
    kernel.close()


async def read(kernel, **arguments):
    return await kernel.call(kernel.start_run(), "artifact.read", arguments)


async def test_artifact_read_serves_byte_ranges_with_a_continuation(kernel):
    ref = kernel.artifacts.put(b"0123456789" * 10, media_type="text/plain")
    first = await read(kernel, artifactId=ref.id, startByte=5, maxBytes=10)
    out = first.structured_output
    assert out["content"] == "5678901234"
    assert (out["startByte"], out["endByte"], out["nextByte"]) == (5, 15, 15)
    last = await read(kernel, artifactId=ref.id, startByte=95)
    assert last.structured_output["content"] == "56789"
    assert last.structured_output["eof"] is True


async def test_artifact_read_serves_line_ranges(kernel):
    ref = kernel.artifacts.put("".join(f"row {i}\n" for i in range(1, 1001)).encode())
    middle = await read(kernel, artifactId=ref.id, startLine=500, endLine=502)
    assert middle.structured_output["content"] == "row 500\nrow 501\nrow 502\n"
    capped = await read(kernel, artifactId=ref.id, startLine=999, maxBytes=8)
    assert capped.structured_output["content"] == "row 999\n"
    assert capped.structured_output["nextLine"] == 1000
    tail = await read(kernel, artifactId=ref.id, startLine=1000)
    assert tail.structured_output["eof"] is True


async def test_artifact_read_continues_a_partial_result(kernel):
    run = kernel.start_run()
    search = await kernel.call(run, "repo.search", {"query": "zzz"})
    ref = search.artifacts[0]
    continued = await kernel.call(run, "artifact.read", {"artifactId": ref.id, "startLine": 1})
    assert continued.status is Status.SUCCEEDED
    assert '"type":"summary"' in continued.structured_output["content"]


async def test_artifact_read_refuses_unknown_ids_and_mixed_ranges(kernel):
    unknown = await read(kernel, artifactId="sha256:" + "0" * 64)
    assert unknown.error_code is ErrorCode.NOT_FOUND
    ref = kernel.artifacts.put(b"abc")
    mixed = await read(kernel, artifactId=ref.id, startByte=0, startLine=1)
    assert mixed.error_code is ErrorCode.SCHEMA_VIOLATION
    malformed = await read(kernel, artifactId="sha256:" + "g" * 64)
    assert malformed.error_code is ErrorCode.NOT_FOUND


@pytest.mark.parametrize(
    ("bounds", "prop"),
    [({"startByte": 5, "endByte": 2}, "endByte"), ({"startLine": 9, "endLine": 3}, "endLine")],
)
async def test_a_range_that_ends_before_it_starts_is_out_of_bounds(kernel, bounds, prop):
    ref = kernel.artifacts.put(b"0123456789\n" * 20, media_type="text/plain")
    result = await read(kernel, artifactId=ref.id, **bounds)
    assert (result.status, result.error_code) == (
        Status.INVALID_ARGUMENTS,
        ErrorCode.OUT_OF_BOUNDS,
    )
    assert f"'{prop}'" in result.safe_message


# --- a bounded store: the least recently used artifacts go first ----------------------


def _aged(store: ArtifactStore, data: bytes, age_s: int) -> str:
    """Store ``data`` and date its last use ``age_s`` seconds back."""
    ref = store.put(data)
    path = store.root / ref.id[7:9] / ref.id[7:]
    used = path.stat().st_mtime - age_s
    os.utime(path, (used, used))
    return ref.id


def test_a_store_over_its_bound_drops_the_least_recently_used_artifacts(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts", max_bytes=3000)
    oldest = _aged(store, b"a" * 1000, 300)
    middle = _aged(store, b"b" * 1000, 200)
    recent = _aged(store, b"c" * 1000, 100)
    store.read(oldest, 0, 1)  # read since: now the most recently used
    newest = store.put(b"d" * 1000).id
    assert store.read(newest) == b"d" * 1000
    assert store.read(oldest, 0, 3) == b"aaa"
    assert store.read(recent, 0, 3) == b"ccc"
    with pytest.raises(UsageError, match="pruned") as gone:
        store.read(middle)
    assert "3000 bytes" in str(gone.value)
    assert not (store.root / middle[7:9] / f"{middle[7:]}.json").exists()  # its sidecar too


def test_an_artifact_larger_than_the_bound_is_kept_alone(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts", max_bytes=1000)
    small = _aged(store, b"s" * 500, 100)
    large = store.put(b"L" * 4000).id
    assert store.read(large, 0, 2) == b"LL"
    with pytest.raises(UsageError, match="pruned"):
        store.read(small)


def test_storing_the_same_bytes_again_counts_as_a_use(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts", max_bytes=2000)
    first = _aged(store, b"x" * 1000, 300)
    second = _aged(store, b"y" * 1000, 200)
    assert store.put(b"x" * 1000).id == first  # used again: the newer of the two now
    store.put(b"z" * 1000)
    assert store.read(first, 0, 1) == b"x"
    with pytest.raises(UsageError, match="pruned"):
        store.read(second)


async def test_the_configured_bound_applies_to_what_tools_store(workspace):
    big = "needle line\n" * 3_000  # its matches: about 570 KB of ripgrep JSON
    (workspace / "a.txt").write_text(big)
    (workspace / "b.txt").write_text(big.replace("needle", "pinned"))
    kernel = make_kernel(workspace, CONFIG + "[artifacts]\nmax_mib = 1\n")
    install(kernel)
    with kernel:
        assert kernel.artifacts.max_bytes == 1024 * 1024
        run = kernel.start_run()
        ids = []
        for query in ("needle", "pinned", "needle"):  # two do not fit in 1 MiB
            result = await kernel.call(run, "repo.search", {"query": query})
            assert result.status in (Status.SUCCEEDED, Status.PARTIAL), result.safe_message
            [artifact] = result.artifacts
            ids.append(artifact.id)
            _age_all(kernel.artifacts, 120)  # past the minute a fresh artifact is kept
        stored = sum(
            p.stat().st_size for p in kernel.artifacts.root.glob("??/*") if p.suffix != ".json"
        )
        assert 0 < stored <= 1024 * 1024
        assert kernel.artifacts.read(ids[-1], 0, 1)
        gone = await kernel.call(run, "artifact.read", {"artifactId": ids[1]})
        assert gone.error_code is ErrorCode.NOT_FOUND
        assert "pruned" in gone.safe_message  # the model used a result's id: it is told why


async def test_the_artifacts_of_one_result_are_not_pruned_by_each_other(workspace):
    """A result's message and its output, stored one after the other: storing the
    second must not prune the first, which the model is told to read."""

    @tool("t.big", max_output_bytes=1000)
    def big() -> dict:
        """Fail with a long log and a long output."""
        raise ToolPartial("log: " + "m" * 700_000, output={"data": "d" * 700_000})

    kernel = make_kernel(workspace, CONFIG + "[artifacts]\nmax_mib = 1\n")
    kernel.register(big)
    with kernel:
        result = await kernel.call(kernel.start_run(), "t.big", {})
        assert len(result.artifacts) == 2
        for artifact in result.artifacts:
            assert kernel.artifacts.read(artifact.id, 0, 1)


def _age_all(store: ArtifactStore, seconds: int) -> None:
    for path in store.root.glob("??/*"):
        used = path.stat().st_mtime - seconds
        os.utime(path, (used, used))

"""The artifact store keeps no secret the runtime knew when it stored an artifact.

``artifact.read`` masks what the process reading knows; an artifact outlives the
process that made it, so a ``[sandbox] secret_env`` value kept in a command's stdout
was served whole to the model by a later process without the variable (another CLI
call, a ``serve`` from another shell, a rotated token).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkernel import artifacts
from toolkernel.artifacts import ArtifactStore
from toolkernel.calls import ArtifactRef
from toolkernel.codes import Status
from toolkernel.kernel import Kernel
from toolkernel.redaction import SECRET_MASK, Redactor
from toolkernel.testing import make_kernel

pytestmark = pytest.mark.anyio

SECRET = "tok_9f8e7d6c5b4a3210"
MASK = SECRET_MASK.encode()
CONFIG = """
[run]
profile = "developer"

[[exposure]]
tools = ["*"]

[sandbox]
secret_env = ["DEPLOY_TOKEN"]
"""


def masking_store(root: Path) -> ArtifactStore:
    return ArtifactStore(root / "artifacts", redactor=Redactor(root / "ws", [SECRET]))


def stored(store: ArtifactStore, ref: ArtifactRef) -> bytes:
    """The artifact's bytes, checked against what its ref and sidecar say of them."""
    data = store.read(ref.id)
    assert ref.id == "sha256:" + hashlib.sha256(data).hexdigest()
    assert ref.size == len(data) == store.metadata(ref.id)["size"]
    return data


def test_put_stores_a_known_secret_masked(tmp_path: Path) -> None:
    store = masking_store(tmp_path)
    ref = store.put(f"export TOKEN={SECRET}\nok\n".encode())
    assert stored(store, ref) == b"export TOKEN=" + MASK + b"\nok\n"


def test_put_masks_the_encoded_forms_the_redactor_knows(tmp_path: Path) -> None:
    store = masking_store(tmp_path)
    encoded = base64.b64encode(f"user:{SECRET}".encode())
    as_json = json.dumps({"headers": {"Authorization": f"Basic {encoded.decode()}"}})
    data = stored(store, store.put(as_json.encode() + b"\n" + repr(SECRET).encode()))
    assert SECRET.encode() not in data
    assert base64.b64encode(SECRET.encode())[:8] not in data
    assert data.count(MASK) == 2


@pytest.mark.parametrize("inside", range(1, len(SECRET)))
def test_a_secret_that_the_cut_of_a_block_goes_through_is_masked_whole(
    tmp_path: Path, inside: int
) -> None:
    store = masking_store(tmp_path)
    assert store.redactor is not None
    held = store.redactor.max_secret_length - 1  # what a block keeps for the next one
    filler = b"x" * artifacts._MASK_BLOCK
    trailer = b"z" * (held - len(SECRET) + inside)  # the cut falls ``inside`` the secret
    with store.writer() as writer:
        writer.write(filler + SECRET.encode() + trailer)
        writer.write(b"\n")
        ref = writer.commit()
    assert stored(store, ref) == filler + MASK + trailer + b"\n"


@pytest.mark.parametrize("split", range(1, len(SECRET)))
def test_a_secret_split_between_two_large_writes_is_masked(tmp_path: Path, split: int) -> None:
    store = masking_store(tmp_path)
    before, after = b"x" * artifacts._MASK_BLOCK, b"y" * artifacts._MASK_BLOCK
    with store.writer() as writer:
        writer.write(before + SECRET[:split].encode())
        writer.write(SECRET[split:].encode() + after)
        ref = writer.commit()
    assert stored(store, ref) == before + MASK + after


def test_a_spilled_file_holding_a_secret_across_its_chunks_is_stored_masked(
    tmp_path: Path,
) -> None:
    store = masking_store(tmp_path)
    source = store.staging_dir() / "stdout"
    head = b"y" * (artifacts._CHUNK - 7)  # the secret straddles the first read of the file
    source.write_bytes(head + SECRET.encode() + b" done\n")
    ref = store.put_file(source, media_type="text/plain", move=True)
    assert not source.exists()
    assert stored(store, ref) == head + MASK + b" done\n"


def test_a_spilled_file_without_a_known_secret_is_moved_in_as_it_is(tmp_path: Path) -> None:
    store = masking_store(tmp_path)
    source = store.staging_dir() / "stdout"
    source.write_bytes(b"tok_ and 9f8e7d6c but no secret\n")
    inode = source.stat().st_ino
    ref = store.put_file(source, move=True)
    assert stored(store, ref) == b"tok_ and 9f8e7d6c but no secret\n"
    assert (store.root / ref.id[7:9] / ref.id[7:]).stat().st_ino == inode  # renamed


def test_a_store_without_known_secrets_keeps_the_bytes_as_written(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts", redactor=Redactor(tmp_path / "ws"))
    data = f"export TOKEN={SECRET}\n".encode()
    assert stored(store, store.put(data)) == data


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(
        st.sampled_from([SECRET.encode(), b"\n", b"tok_9f8e", b"x" * 40_000, b"3210", b"ab"]),
        max_size=12,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=200_000), max_size=6),
)
def test_how_the_bytes_are_written_does_not_change_what_is_stored(
    tmp_path_factory: pytest.TempPathFactory, pieces: list[bytes], cuts: list[int]
) -> None:
    """Whatever the writes, every occurrence of the secret is masked, as in the whole."""
    store = masking_store(tmp_path_factory.mktemp("store"))
    data = b"".join(pieces)
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    with store.writer() as writer:
        for start, end in itertools.pairwise(bounds):
            writer.write(data[start:end])
        ref = writer.commit()
    assert stored(store, ref) == data.replace(SECRET.encode(), MASK)


@pytest.fixture
def kernels() -> Iterator[list[Kernel]]:
    opened: list[Kernel] = []
    yield opened
    for kernel in opened:
        kernel.close()


async def test_a_later_process_without_the_secret_reads_the_command_output_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernels: list[Kernel]
) -> None:
    workspace = tmp_path / "ws"
    monkeypatch.setenv("DEPLOY_TOKEN", SECRET)
    first = make_kernel(workspace, CONFIG)
    kernels.append(first)
    ran = await first.call(
        first.start_run(), "shell.run", {"argv": ["sh", "-c", "echo using $DEPLOY_TOKEN"]}
    )
    assert ran.status is Status.SUCCEEDED, ran.safe_message
    stdout = ran.structured_output["stdout"]

    monkeypatch.delenv("DEPLOY_TOKEN")  # the token rotated, or serve runs elsewhere
    later = make_kernel(workspace, CONFIG)
    kernels.append(later)
    read = await later.call(later.start_run(), "artifact.read", {"artifactId": stdout["artifact"]})
    assert read.status is Status.SUCCEEDED, read.safe_message
    assert read.structured_output["content"] == f"using {SECRET_MASK}\n"
    kept = later.artifacts.read(stdout["artifact"])
    assert kept == b"using " + MASK + b"\n"
    assert stdout["bytes"] == len(kept)  # the model's offsets for artifact.read


def test_a_native_tools_output_over_the_budget_is_stored_masked(tmp_path: Path) -> None:
    # The kernel's own store (output over the projection budget) masks them too.
    from toolkernel.functions import tool

    @tool("big.report")
    def report() -> str:
        """A long report that quotes the token."""
        return ("filler " * 40_000) + f"token={SECRET} end"

    kernel = make_kernel(tmp_path / "ws", CONFIG, workspace_tools=False, secrets=[SECRET])
    try:
        kernel.register(report)
        result = kernel.call_sync(kernel.start_run(), "big.report", {})
        [ref] = result.artifacts
        stored = kernel.artifacts.read(ref.id)
    finally:
        kernel.close()
    assert result.status is Status.PARTIAL
    assert SECRET.encode() not in stored
    assert b"token=" + MASK + b" end" in stored

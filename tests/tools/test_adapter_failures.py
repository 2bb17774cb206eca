"""The runtime's own failures around a sandboxed command are the runtime's, not the tool's.

Running out of file descriptors while the sandbox's view was prepared reached the
model as "the tool raised ExceptionGroup" (TOOL_ERROR), and an artifacts directory
that is a file as "the tool raised NotADirectoryError": the call blamed the tool, and
said nothing the operator could act on.
"""

from __future__ import annotations

import errno
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tool_support import exposing_all

from toolkernel.codes import ErrorCode, Status, safe_message
from toolkernel.kernel import Kernel
from toolkernel.testing import make_kernel
from toolkernel.tools import adapter as adapter_module

pytestmark = pytest.mark.anyio

CONFIG = exposing_all("developer")
ADAPTER_LOG = "toolkernel.tools.adapter"


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "README.md").write_text("hello\n")
    kernel = make_kernel(workspace, CONFIG)
    yield kernel
    kernel.close()


def raising(error: int) -> Any:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise OSError(error, f"{errno.errorcode[error]} from the host", "/host/only/path")

    return fail


def assert_internal(result: Any, tool: str, *, retryable: bool) -> None:
    assert (result.status, result.error_code) == (Status.FAILED, ErrorCode.INTERNAL_ERROR)
    assert result.retryable is retryable
    assert result.safe_message == safe_message(ErrorCode.INTERNAL_ERROR, tool=tool)


def logged(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(
        r.getMessage() for r in caplog.records if r.name == ADAPTER_LOG and r.levelname == "ERROR"
    )


async def test_running_out_of_descriptors_before_a_command_runs_is_a_retryable_internal_error(
    kernel: Kernel, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(adapter_module, "_rg_files", raising(errno.EMFILE))
    result = await kernel.call(kernel.start_run(), "shell.run", {"argv": ["true"]})
    assert_internal(result, "shell.run", retryable=True)
    assert "EMFILE from the host" in logged(caplog)
    assert "/host/only/path" not in json.dumps(result.to_dict())


async def test_an_artifacts_directory_that_is_a_file_fails_the_call_as_internal(
    kernel: Kernel, caplog: pytest.LogCaptureFixture
) -> None:
    root = kernel.artifacts.root
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    root.write_text("x")
    run = kernel.start_run()
    for name, args in (("repo.search", {"query": "hello"}), ("shell.run", {"argv": ["true"]})):
        result = await kernel.call(run, name, args)
        assert_internal(result, name, retryable=False)  # the state needs the user
        assert str(root) not in json.dumps(result.to_dict())
    assert "Not a directory" in logged(caplog)


@pytest.mark.parametrize(("error", "retryable"), [(errno.EMFILE, True), (errno.ENOSPC, False)])
async def test_output_that_cannot_be_kept_is_an_internal_error_retryable_if_it_may_pass(
    kernel: Kernel,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    error: int,
    retryable: bool,
) -> None:
    monkeypatch.setattr(adapter_module, "_capture", raising(error))
    result = await kernel.call(kernel.start_run(), "shell.run", {"argv": ["echo", "hi"]})
    assert_internal(result, "shell.run", retryable=retryable)
    assert f"{errno.errorcode[error]} from the host" in logged(caplog)
    assert list((kernel.artifacts.root / ".incoming").iterdir()) == []

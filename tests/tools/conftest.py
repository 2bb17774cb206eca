"""Fixtures the workspace-tool tests share."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from toolkernel.functions import FunctionTool
from toolkernel.kernel import Kernel
from toolkernel.testing import make_kernel
from toolkernel.tools import install


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """An empty workspace (a test module may define its own, with files in it)."""
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def tools_kernel() -> Iterator[Callable[..., Kernel]]:
    """Builds a kernel with the workspace tools installed (``first``: tools registered
    before them, in their place); closes them afterwards."""
    kernels: list[Kernel] = []

    def build(workspace: Path, config: str, first: Sequence[FunctionTool] = ()) -> Kernel:
        kernel = make_kernel(workspace, config, workspace_tools=False)
        for tool in first:
            kernel.register(tool)
        assert install(kernel) is not None
        kernels.append(kernel)
        return kernel

    yield build
    for kernel in kernels:
        kernel.close()

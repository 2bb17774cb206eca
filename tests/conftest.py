"""Shared fixtures: a workspace with a small repository, and sample tools."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import anyio
import pytest
from annotated_types import Ge, Le, MaxLen

from toolkernel.context import ToolContext
from toolkernel.definition import Permissions
from toolkernel.errors import ToolFailed
from toolkernel.functions import WorkspacePath, tool
from toolkernel.kernel import Kernel
from toolkernel.testing import make_kernel

CORPORA = Path(__file__).resolve().parents[1].parent / "shared" / "corpora"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('hello')\n")
    (root / "docs").mkdir()
    (root / "docs" / "notes.md").write_text("notes\n")
    (root / ".env").write_text("TOKEN=abc\n")
    return root


class Calls:
    """Counts how often sample tools really ran."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}

    def hit(self, name: str) -> None:
        self.count[name] = self.count.get(name, 0) + 1


@pytest.fixture
def calls() -> Calls:
    return Calls()


def sample_tools(calls: Calls) -> list[Any]:
    """Tools covering the safety profiles the seed's tests talk about."""

    @tool("repo.lookup", idempotent=True, timeout_ms=2_000)
    def lookup(
        query: Annotated[str, MaxLen(50)],
        mode: Annotated[str, MaxLen(10)] = "plain",
        limit: Annotated[int, Ge(1), Le(100)] = 10,
    ) -> dict[str, Any]:
        """Look something up.

        Args:
            query: what to look for.
            mode: how to look.
            limit: how many results.
        """
        calls.hit("repo.lookup")
        return {"query": query, "limit": limit}

    @tool("file.peek", idempotent=True, permissions=Permissions(read_workspace=True))
    def peek(path: WorkspacePath) -> dict[str, Any]:
        """Peek at a file.

        Args:
            path: workspace-relative file.
        """
        calls.hit("file.peek")
        return {"path": path}

    @tool(
        "file.write",
        mutating=True,
        permissions=Permissions(read_workspace=True, write_workspace=True),
    )
    def write(path: WorkspacePath, text: Annotated[str, MaxLen(1000)]) -> dict[str, Any]:
        """Write a file.

        Args:
            path: workspace-relative file.
            text: new content.
        """
        calls.hit("file.write")
        return {"written": path}

    @tool(
        "web.fetch",
        external=True,
        permissions=Permissions(network=True),
        idempotent=True,
    )
    def fetch(url: Annotated[str, MaxLen(200)]) -> str:
        """Fetch a URL.

        Args:
            url: the address.
        """
        calls.hit("web.fetch")
        return "fetched"

    @tool(
        "repo.reset",
        mutating=True,
        destructive=True,
        permissions=Permissions(read_workspace=True, write_workspace=True),
    )
    def reset() -> str:
        """Throw away local changes."""
        calls.hit("repo.reset")
        return "reset"

    @tool("pr.create", mutating=True, external=True, permissions=Permissions(network=True))
    def pr_create(title: Annotated[str, MaxLen(100)]) -> str:
        """Open a pull request.

        Args:
            title: the title.
        """
        calls.hit("pr.create")
        return "opened"

    @tool("slow.wait", idempotent=True, timeout_ms=100)
    async def slow(seconds: float = 10.0) -> str:
        """Wait.

        Args:
            seconds: how long.
        """
        calls.hit("slow.wait")
        await anyio.sleep(seconds)
        return "done"

    @tool("slow.block", timeout_ms=100)
    def block(ctx: ToolContext, seconds: float = 10.0) -> str:
        """Block a worker thread until cancelled.

        Args:
            seconds: how long.
        """
        calls.hit("slow.block")
        ctx.token.wait(seconds)
        ctx.token.raise_if_cancelled()
        return "done"

    @tool("tool.crash")
    def crash() -> str:
        """Raise."""
        calls.hit("tool.crash")
        raise RuntimeError("secret internal detail at /home/alice/project/x.py")

    @tool("tool.fail")
    def fail() -> str:
        """Fail politely."""
        calls.hit("tool.fail")
        raise ToolFailed("The thing is not there.")

    @tool("data.big", idempotent=True, max_output_bytes=1024)
    def big(lines: int = 500) -> list[str]:
        """Return many lines.

        Args:
            lines: how many.
        """
        calls.hit("data.big")
        return [f"line {i} " + "x" * 40 for i in range(lines)]

    return [lookup, peek, write, fetch, reset, pr_create, slow, block, crash, fail, big]


ALL_STATES_EXPOSURE = """
[[exposure]]
tools = ["*"]
"""


@pytest.fixture
def more_samples(calls: Calls) -> Callable[[], list[Any]]:
    """The sample tools again, counting into the same ``calls``: for a second kernel."""
    return lambda: sample_tools(calls)


@pytest.fixture
def kernel_factory(workspace: Path, calls: Calls) -> Iterator[Any]:
    kernels: list[Kernel] = []

    def build(config: str | None = ALL_STATES_EXPOSURE, **kwargs: Any) -> Kernel:
        kernel = make_kernel(workspace, config, **kwargs)
        for sample in sample_tools(calls):
            kernel.register(sample)
        kernels.append(kernel)
        return kernel

    yield build
    for kernel in kernels:
        kernel.close()

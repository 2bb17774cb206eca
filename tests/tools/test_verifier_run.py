"""verifier.run on a real failing pytest run, in a throwaway workspace."""

from __future__ import annotations

import textwrap
from pathlib import Path

import anyio
import pytest

from toolkernel.codes import ErrorCode, Status
from toolkernel.testing import make_kernel
from toolkernel.tools import SandboxSettings, install
from toolkernel.tools.verifier import parse_pytest_text

pytestmark = pytest.mark.anyio

CONFIG = """
[run]
profile = "developer"

[[exposure]]
tools = ["*"]
"""

FAILING = textwrap.dedent(
    """\
    from client import connect


    def test_connects():
        assert connect("a") == "a"


    def test_timeout_is_respected():
        assert connect("slow") == "fast"


    def test_raises():
        raise RuntimeError("boom")
    """
)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "tests").mkdir(parents=True)
    (root / "client.py").write_text("def connect(name):\n    return name\n")
    (root / "tests" / "test_client.py").write_text(FAILING)
    (root / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    return root


def build(ws: Path, settings: SandboxSettings | None = None):
    kernel = make_kernel(ws, CONFIG, workspace_tools=False)
    assert install(kernel, settings) is not None
    return kernel


async def test_a_failing_pytest_run_becomes_an_error_summary(ws):
    kernel = build(ws)
    try:
        result = await kernel.call(kernel.start_run(), "verifier.run", {})
    finally:
        kernel.close()
    assert result.status is Status.FAILED
    assert result.error_code is ErrorCode.PROCESS_EXIT_NONZERO
    assert result.safe_message.startswith("2 tests failed in tests/test_client.py")
    out = result.structured_output
    assert out["reportSource"] == "junit"
    assert (out["tests"], out["failures"]) == (3, 2)
    entries = {e["test"].rsplit("::", 1)[-1]: e for e in out["errorSummary"]}
    assert entries["test_timeout_is_respected"]["file"] == "tests/test_client.py"
    assert entries["test_timeout_is_respected"]["line"] == 9
    assert "fast" in entries["test_timeout_is_respected"]["message"]
    assert entries["test_raises"]["line"] == 13
    assert "boom" in entries["test_raises"]["message"]
    descriptions = {a.description for a in result.artifacts}
    assert {"JUnit report", "verifier.run stdout"} <= descriptions
    assert not (ws / ".toolkernel" / "verifier").exists()  # reports go outside the workspace


async def test_a_passing_run_succeeds(ws):
    (ws / "tests" / "test_client.py").write_text(
        "from client import connect\n\n\ndef test_ok():\n    assert connect('a') == 'a'\n"
    )
    kernel = build(ws)
    try:
        result = await kernel.call(
            kernel.start_run(), "verifier.run", {"paths": ["tests/test_client.py"]}
        )
    finally:
        kernel.close()
    assert result.status is Status.SUCCEEDED
    assert result.safe_message == "All 1 tests passed."
    assert result.structured_output["errorSummary"] == []


async def test_without_junit_the_text_output_is_parsed(ws):
    kernel = build(ws, SandboxSettings(test_command=("python", "-m", "pytest", "-q", "-rf")))
    try:
        result = await kernel.call(kernel.start_run(), "verifier.run", {})
    finally:
        kernel.close()
    out = result.structured_output
    assert out["reportSource"] == "text"
    assert out["failures"] == 2
    files = {e["file"] for e in out["errorSummary"]}
    assert files == {"tests/test_client.py"}


def test_pytest_text_parsing_finds_failures_and_locations(tmp_path):
    text = textwrap.dedent(
        f"""\
        {tmp_path}/tests/test_a.py:12: AssertionError
        FAILED tests/test_a.py::test_one - assert 1 == 2
        ERROR tests/test_b.py - ImportError: nope
        1 failed, 3 passed, 1 error in 0.10s
        """
    )
    report = parse_pytest_text(text, tmp_path)
    assert (report.failures, report.errors, report.tests) == (1, 1, 4)
    first, second = report.entries
    assert (first.file, first.line, first.message) == ("tests/test_a.py", 12, "assert 1 == 2")
    assert (second.kind, second.file) == ("error", "tests/test_b.py")


# A conftest.py the model could write: it swaps the JUnit report for something else as
# pytest ends, after the report was written.
PLANTED_REPORT = textwrap.dedent(
    """\
    import os


    def pytest_unconfigure(config):
        path = getattr(config.option, "xmlpath", None)
        if path:
            os.unlink(path)
            {plant}
    """
)
PLANTS = {
    "fifo": "os.mkfifo(path)",
    "symlink": "os.symlink('/etc/passwd', path)",
    "directory": "os.mkdir(path)",
}


@pytest.mark.timeout(60)  # before the fix, the FIFO blocked the event loop for good
@pytest.mark.parametrize("kind", sorted(PLANTS))
async def test_a_report_replaced_by_a_non_regular_file_is_ignored(ws, kind):
    (ws / "tests" / "test_client.py").write_text("def test_ok():\n    assert True\n")
    (ws / "conftest.py").write_text(PLANTED_REPORT.format(plant=PLANTS[kind]))
    kernel = build(ws)
    try:
        with anyio.fail_after(50):
            result = await kernel.call(kernel.start_run(), "verifier.run", {"timeoutMs": 30_000})
    finally:
        kernel.close()
    assert result.status is Status.SUCCEEDED, result.safe_message
    assert result.structured_output["reportSource"] == "text"
    assert result.structured_output["tests"] == 1
    assert "JUnit report" not in {a.description for a in result.artifacts}

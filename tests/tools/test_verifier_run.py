"""verifier.run on a real failing pytest run, in a throwaway workspace."""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from tool_support import exposing_all

from toolkernel.calls import ToolCallResult
from toolkernel.codes import ErrorCode, Status
from toolkernel.redaction import SECRET_MASK, Redactor
from toolkernel.sandbox import SandboxLimits
from toolkernel.testing import make_kernel
from toolkernel.tools import SandboxSettings, install
from toolkernel.tools.verifier import MAX_REPORT_BYTES, parse_junit, parse_pytest_text

pytestmark = pytest.mark.anyio

CONFIG = exposing_all("developer")

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


async def verify(
    ws: Path, settings: SandboxSettings | None = None, arguments: dict[str, Any] | None = None
) -> ToolCallResult:
    """One verifier.run call, in a kernel of its own."""
    kernel = build(ws, settings)
    try:
        with anyio.fail_after(50):
            return await kernel.call(kernel.start_run(), "verifier.run", arguments or {})
    finally:
        kernel.close()


async def test_a_failing_pytest_run_becomes_an_error_summary(ws):
    result = await verify(ws)
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
    result = await verify(ws, None, {"paths": ["tests/test_client.py"]})
    assert result.status is Status.SUCCEEDED
    assert result.safe_message == "All 1 tests passed."
    assert result.structured_output["errorSummary"] == []


async def test_without_junit_the_text_output_is_parsed(ws):
    result = await verify(ws, SandboxSettings(test_command=("python", "-m", "pytest", "-q", "-rf")))
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


PASSWORD = "S3cr3t-P4ss-2024-Vx9-long"
KNOWN = "injected-known-value-9"


def failing(pad: int) -> tuple[str, bytes]:
    """pytest's text and a JUnit report of a failure whose message holds a password and
    a known secret, the first ``pad`` characters on, around where messages are cut."""
    message = f"bad config: {{'opts': '{'x' * pad}', 'password': '{PASSWORD}', 'k': '{KNOWN}'}}"
    text = f"FAILED tests/test_cfg.py::test_dsn - {message}\n1 failed in 0.1s\n"
    junit = (
        '<testsuite tests="1" failures="1" errors="0" skipped="0">'
        '<testcase classname="tests.test_cfg" name="test_dsn">'
        f'<failure message="{message}">boom</failure></testcase></testsuite>'
    )
    return text, junit.encode()


def messages(text: str, junit: bytes, workspace: Path, **redactor: Redactor) -> list[str]:
    report = parse_junit(junit, workspace, **redactor)
    assert report is not None
    return [
        report.entries[0].message,
        parse_pytest_text(text, workspace, **redactor).entries[0].message,
    ]


def shows_a_piece(shown: str, secret: str) -> bool:
    return any(secret[i : i + 6] in shown for i in range(len(secret) - 5))


@pytest.mark.parametrize("pad", range(230, 300, 3))
def test_a_message_cut_short_shows_nothing_of_a_password_across_the_cut(tmp_path, pad):
    """Messages were cut before the kernel redacted them: 22 of a password's 25
    characters came through once the cut had left its quote unclosed."""
    for message in messages(*failing(pad), tmp_path):
        assert len(message) < 300 + len(SECRET_MASK)
        shown = Redactor(tmp_path).redact_text(message, Counter())
        assert not shows_a_piece(shown, PASSWORD), shown


@pytest.mark.parametrize("pad", range(250, 300, 4))
def test_a_message_cut_short_shows_nothing_of_a_known_secret_across_the_cut(tmp_path, pad):
    redactor = Redactor(tmp_path, secrets=[KNOWN])
    for message in messages(*failing(pad), tmp_path, redactor=redactor):
        shown = redactor.redact_text(message, Counter())
        assert not shows_a_piece(shown, KNOWN), shown


# A conftest.py the model could write: it tries to swap the JUnit report for something
# else as pytest ends, after the report was written. The report path is a FIFO mounted
# into the sandbox: the swap fails, and what pytest wrote has already been read.
PLANTED_REPORT = textwrap.dedent(
    """\
    import os


    def pytest_unconfigure(config):
        path = getattr(config.option, "xmlpath", None)
        if path:
            try:
                os.unlink(path)
                {plant}
            except OSError:
                pass
    """
)
PLANTS = {
    "fifo": "os.mkfifo(path)",
    "symlink": "os.symlink('/etc/passwd', path)",
    "directory": "os.mkdir(path)",
}


@pytest.mark.timeout(60)  # a FIFO once blocked the event loop for good
@pytest.mark.parametrize("kind", sorted(PLANTS))
async def test_a_report_the_suite_tries_to_replace_is_still_the_one_read(ws, kind):
    (ws / "tests" / "test_client.py").write_text("def test_ok():\n    assert True\n")
    (ws / "conftest.py").write_text(PLANTED_REPORT.format(plant=PLANTS[kind]))
    result = await verify(ws, None, {"timeoutMs": 30_000})
    assert result.status is Status.SUCCEEDED, result.safe_message
    assert result.structured_output["reportSource"] == "junit"
    assert result.structured_output["tests"] == 1
    assert "JUnit report" in {a.description for a in result.artifacts}


# A run passes only on positive evidence: with a report asked for, a readable one that
# counts tests that ran and none that failed.
EXITS_EARLY = textwrap.dedent(
    """\
    import os


    def test_fails():
        assert 1 == 2


    def test_zz_ends_the_process():
        os._exit({status})
    """
)


@pytest.mark.parametrize("status", [0, 256])  # 256 wraps to exit status 0
async def test_a_suite_that_exits_zero_before_its_report_does_not_pass(ws, status):
    (ws / "tests" / "test_client.py").write_text(EXITS_EARLY.format(status=status))
    result = await verify(ws)
    assert result.status is Status.FAILED
    assert result.error_code is ErrorCode.TOOL_ERROR
    out = result.structured_output
    assert (out["exitCode"], out["passed"], out["reportSource"]) == (0, False, "text")


# A command that writes the report it is given (argv[1]) and exits 0 whatever it says.
WRITES_REPORT = "import sys\nwith open(sys.argv[1], 'w') as f:\n    f.write({xml!r})\n"
REPORTS = {
    "failures": (
        '<testsuite tests="2" failures="1" errors="0" skipped="0">'
        '<testcase classname="tests.test_client" name="test_ok"/>'
        '<testcase classname="tests.test_client" name="test_bad">'
        '<failure message="assert 1 == 2">tests/test_client.py:5: AssertionError</failure>'
        "</testcase></testsuite>"
    ),
    "no tests": '<testsuite tests="0" failures="0" errors="0" skipped="0"/>',
    "only skipped": (
        '<testsuite tests="1" failures="0" errors="0" skipped="1">'
        '<testcase classname="tests.test_client" name="test_ok"><skipped/></testcase>'
        "</testsuite>"
    ),
}


@pytest.mark.parametrize("kind", sorted(REPORTS))
async def test_exit_zero_does_not_pass_a_report_without_a_test_that_passed(ws, kind):
    script = WRITES_REPORT.format(xml=REPORTS[kind])
    result = await verify(ws, SandboxSettings(test_command=("python", "-c", script, "{junitxml}")))
    assert result.status is Status.FAILED
    assert result.error_code is ErrorCode.TOOL_ERROR
    out = result.structured_output
    assert (out["exitCode"], out["passed"], out["reportSource"]) == (0, False, "junit")


async def test_an_oversize_report_is_not_read_and_does_not_pass(ws):
    # A passing report behind a comment too long to read.
    script = WRITES_REPORT.format(xml=REPORTS["failures"].replace('"1"', '"0"')).replace(
        "f.write(", f"f.write('<!--' + 'x' * {MAX_REPORT_BYTES} + '-->' + "
    )
    result = await verify(ws, SandboxSettings(test_command=("python", "-c", script, "{junitxml}")))
    assert result.status is Status.FAILED
    assert result.structured_output["reportSource"] == "text"


async def test_a_command_without_a_report_passes_on_its_exit_status(ws):
    settings = SandboxSettings(test_command=("python", "-c", "print('all good')"))
    result = await verify(ws, settings)
    assert result.status is Status.SUCCEEDED
    assert result.structured_output["passed"] is True


async def test_a_command_that_fails_on_stderr_alone_shows_its_tail(ws):
    """`python -m pytest` where pytest is missing says so on stderr only: the model sees
    it in the result, without reading the artifact."""
    script = "import sys; print('starting'); sys.exit('No module named pytest')"
    result = await verify(ws, SandboxSettings(test_command=("python", "-c", script)))
    assert result.status is Status.FAILED
    assert result.structured_output["stderrTail"].strip() == "No module named pytest"
    assert result.structured_output["stdoutTail"].strip() == "starting"


async def test_a_command_without_a_report_does_not_pass_when_its_output_names_failures(ws):
    printed = "print('FAILED tests/test_client.py::test_bad - assert 1 == 2')"
    result = await verify(ws, SandboxSettings(test_command=("python", "-c", printed)))
    assert result.status is Status.FAILED
    assert result.error_code is ErrorCode.TOOL_ERROR
    assert result.structured_output["passed"] is False
    assert result.structured_output["failures"] == 1


DTD_REPORT = (
    '<?xml version="1.0" encoding="{encoding}"?>'
    '<!DOCTYPE t [<!ENTITY e "ENTITY-EXPANDED">]>'
    '<testsuite tests="1" failures="1"><testcase name="x">'
    '<failure message="&e;">a</failure></testcase></testsuite>'
)


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_a_report_with_a_dtd_is_refused_whatever_its_encoding(tmp_path, encoding):
    data = DTD_REPORT.format(encoding=encoding.upper()).encode(encoding)
    assert parse_junit(data, tmp_path) is None


def test_a_report_with_counts_that_are_not_numbers_is_refused(tmp_path):
    assert parse_junit(b'<testsuite tests="many"/>', tmp_path) is None


# Files a suite writes beside its report land in the sandbox's own, size-limited /tmp,
# never on the host's disk.
FILLS_REPORT_DIR = textwrap.dedent(
    """\
    import errno
    import os


    def test_beside_the_report_is_bounded(pytestconfig):
        beside = os.path.join(os.path.dirname(pytestconfig.option.xmlpath), "big")
        try:
            with open(beside, "wb") as handle:
                handle.write(bytes(4 << 20))
        except OSError as exc:
            assert exc.errno in (errno.ENOSPC, errno.EROFS, errno.EACCES)
        else:
            raise AssertionError("wrote 4 MiB beside the report")
    """
)


async def test_files_beside_the_report_stay_within_the_sandbox_tmp_limit(ws):
    (ws / "tests" / "test_client.py").write_text(FILLS_REPORT_DIR)
    result = await verify(ws, SandboxSettings(limits=SandboxLimits(tmp_bytes=1 << 20)))
    assert result.status is Status.SUCCEEDED, result.safe_message
    assert result.structured_output["reportSource"] == "junit"


async def test_a_run_past_its_timeout_is_timed_out(ws):
    (ws / "tests" / "test_client.py").write_text(
        "import time\n\n\ndef test_slow():\n    time.sleep(60)\n"
    )
    result = await verify(ws, None, {"timeoutMs": 1000})
    assert result.status is Status.TIMED_OUT
    assert result.error_code is ErrorCode.TIMEOUT

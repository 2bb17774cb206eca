"""``verifier.run``: the project's test command, its failures as ``errorSummary`` entries.

The configured command (default ``python -m pytest -q --junitxml={junitxml}``) runs
like ``shell.run``. The JUnit report is written to a private host directory outside
the workspace, bound writable into the sandbox (whose own /tmp dies with it), read
back, kept as an artifact and removed. The command controls what lies at the report
path when it ends, so only a regular file is read, opened without following a link
and without blocking (a FIFO would otherwise wait for a writer forever), in a worker
thread. Without a report (another runner, a crash before pytest wrote it, anything
but a regular file there) pytest's text output is parsed instead: its
``FAILED``/``ERROR`` lines and ``file.py:LINE:`` locations.

Failing tests make the call FAILED/PROCESS_EXIT_NONZERO with a short safe summary
("2 tests failed in tests/test_client.py") and the entries in the structured output.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Final

import anyio
from annotated_types import Ge, Le, MaxLen

from toolkernel.calls import ArtifactRef
from toolkernel.codes import ErrorCode, safe_message
from toolkernel.context import ToolContext
from toolkernel.definition import ConcurrencyGroup, ExecutionMode, Permissions
from toolkernel.dispatch import ToolOutput
from toolkernel.errors import ToolFailed
from toolkernel.functions import WorkspacePath, tool
from toolkernel.tools.adapter import CommandResult, Sandbox, sandbox_for
from toolkernel.tools.workspace_io import locate

__all__ = ["ErrorEntry", "TestReport", "parse_junit", "parse_pytest_text", "verifier_run"]

MAX_ENTRIES: Final = 20
"""errorSummary entries the model sees; the report artifact has all of them."""

MAX_REPORT_BYTES: Final = 32 * 1024 * 1024
_MESSAGE_CHARS: Final = 300
_NAME: Final = "verifier.run"
_LOCATION: Final = re.compile(r"^(?P<file>[^\s:][^:\n]*\.py):(?P<line>\d+):", re.MULTILINE)
_SUMMARY_LINE: Final = re.compile(
    r"^(?P<kind>FAILED|ERROR) (?P<node>\S+?)(?: - (?P<message>.*))?$", re.MULTILINE
)


@dataclass(frozen=True, slots=True)
class ErrorEntry:
    """One failing test or collection error."""

    file: str | None
    line: int | None
    test: str
    message: str
    kind: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "test": self.test,
            "message": self.message,
            "kind": self.kind,
        }


@dataclass(frozen=True, slots=True)
class TestReport:
    """What a test run says: counts and the failures."""

    __test__ = False  # not a pytest test class, despite the name

    tests: int
    failures: int
    errors: int
    skipped: int
    entries: tuple[ErrorEntry, ...]
    source: str


@tool(
    _NAME,
    execution_mode=ExecutionMode.PROCESS,
    permissions=Permissions(read_workspace=True, write_workspace=True, execute_command=True),
    mutating=True,
    concurrency_group=ConcurrencyGroup.COMMAND_EXECUTION,
    timeout_ms=900_000,
    tags=("workspace", "builtin"),
)
async def verifier_run(
    ctx: ToolContext,
    paths: Annotated[list[WorkspacePath], MaxLen(50)] | None = None,
    timeoutMs: Annotated[int, Ge(1000), Le(880_000)] = 600_000,
) -> ToolOutput:
    """Run the project's tests and summarise the failures (file, line, message).

    Args:
        paths: test files or directories to run; all tests when left out.
        timeoutMs: how long the test run may take, in milliseconds.
    """
    sandbox = sandbox_for(ctx)
    targets = [locate(ctx, p, tool=_NAME, prop="paths") for p in paths or ()]
    # The report goes to a private directory outside the workspace: the runtime's
    # state directory is hidden from commands, and the workspace is the model's.
    report_dir = Path(tempfile.mkdtemp(prefix="toolkernel-junit-"))
    report_path = report_dir / "report.xml"
    argv = [a.replace("{junitxml}", str(report_path)) for a in sandbox.settings.test_command]
    # "./" keeps a file named like an option from being read as one.
    argv += ["./" + "/".join(t.parts) for t in targets]
    try:
        result = await sandbox.run(
            argv, timeout_s=timeoutMs / 1000, label=_NAME, rw_dirs=(report_dir,)
        )
        junit = await anyio.to_thread.run_sync(_take_report, report_path)
    finally:
        # Shielded: whatever the command left there goes, even from a cancelled call.
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(partial(shutil.rmtree, report_dir, ignore_errors=True))
    report_ref = None
    report = None
    if junit is not None:
        report_ref = sandbox.artifacts.put(
            junit,
            media_type="application/xml",
            description="JUnit report",
            producer=ctx.tool_call_id,
        )
        report = parse_junit(junit, ctx.workspace)
    if report is None:
        report = _text_report(sandbox, result)
    artifacts = (*result.artifacts, *([report_ref] if report_ref else []))
    data = _output(result, report, artifacts)
    summary = _summary(report, result)
    data.pop("artifacts")  # they travel as the result's artifact refs
    if result.exit_code != 0:
        raise ToolFailed(
            safe_message(ErrorCode.PROCESS_EXIT_NONZERO, detail=summary),
            code=ErrorCode.PROCESS_EXIT_NONZERO,
            output=data,
            artifacts=artifacts,
        )
    return ToolOutput(data, summary, artifacts)


def parse_junit(data: bytes, workspace: Path) -> TestReport | None:
    """Counts and failures from a JUnit XML report; ``None`` if it is not one."""
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        return None  # no DTDs: entity expansion is the one danger of parsing XML
    try:
        root = ET.fromstring(data)  # noqa: S314 - DTDs refused above, size capped by caller
    except ET.ParseError:
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    if not suites:
        return None
    entries: list[ErrorEntry] = []
    for case in root.iter("testcase"):
        for kind in ("failure", "error"):
            problem = case.find(kind)
            if problem is not None:
                entries.append(_junit_entry(case, problem, kind, workspace))
    return TestReport(
        tests=sum(int(s.get("tests", 0)) for s in suites),
        failures=sum(int(s.get("failures", 0)) for s in suites),
        errors=sum(int(s.get("errors", 0)) for s in suites),
        skipped=sum(int(s.get("skipped", 0)) for s in suites),
        entries=tuple(entries),
        source="junit",
    )


def parse_pytest_text(text: str, workspace: Path) -> TestReport:
    """Failures from pytest's terminal output (its short test summary and tracebacks)."""
    locations: dict[str, int] = {}
    for match in _LOCATION.finditer(text):
        locations[_relative(match["file"], workspace)] = int(match["line"])
    entries = []
    for match in _SUMMARY_LINE.finditer(text):
        node = match["node"]
        file = _relative(node.split("::", 1)[0], workspace)
        entries.append(
            ErrorEntry(
                file=file,
                line=locations.get(file),
                test=node,
                message=_clip(match["message"] or match["kind"].lower()),
                kind="failure" if match["kind"] == "FAILED" else "error",
            )
        )
    counts = {
        word: int(number)
        for number, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", text)
    }
    failures = counts.get("failed", sum(1 for e in entries if e.kind == "failure"))
    errors = counts.get("error", counts.get("errors", sum(1 for e in entries if e.kind == "error")))
    passed = counts.get("passed", 0)
    skipped = counts.get("skipped", 0)
    return TestReport(
        tests=passed + failures + skipped,
        failures=failures,
        errors=errors,
        skipped=skipped,
        entries=tuple(entries),
        source="text",
    )


def _junit_entry(case: ET.Element, problem: ET.Element, kind: str, workspace: Path) -> ErrorEntry:
    classname = case.get("classname", "")
    name = case.get("name", "")
    body = problem.text or ""
    file = case.get("file")
    line: int | None = None
    # The last location in the traceback that lies in the workspace is the test's own
    # frame or the code under test; pytest's "line" attribute is 0-based and optional.
    for match in _LOCATION.finditer(body):
        candidate = _relative(match["file"], workspace)
        if not candidate.startswith("/"):
            file, line = candidate, int(match["line"])
    if file is None and classname:
        file = "/".join(classname.split(".")) + ".py"
    elif file is not None:
        file = _relative(file, workspace)
    message = problem.get("message") or body.strip().splitlines()[-1:] or [kind]
    text = message if isinstance(message, str) else message[0]
    test = f"{file}::{name}" if file else f"{classname}::{name}"
    return ErrorEntry(file, line, test, _clip(text), kind)


def _text_report(sandbox: Sandbox, result: CommandResult) -> TestReport:
    """The text parse over the stdout artifact (its first bytes), when JUnit is missing."""
    ref = result.stdout.artifact
    text = ""
    if ref is not None:
        with sandbox.artifacts.open(ref.id) as handle:
            text = handle.read(MAX_REPORT_BYTES).decode("utf-8", errors="replace")
    return parse_pytest_text(text, sandbox.workspace)


def _output(
    result: CommandResult, report: TestReport, artifacts: tuple[ArtifactRef, ...]
) -> dict[str, Any]:
    return {
        "exitCode": result.exit_code,
        "passed": result.exit_code == 0,
        "tests": report.tests,
        "failures": report.failures,
        "errors": report.errors,
        "skipped": report.skipped,
        "errorSummary": [e.to_dict() for e in report.entries[:MAX_ENTRIES]],
        "moreErrors": max(0, len(report.entries) - MAX_ENTRIES),
        "reportSource": report.source,
        "stdoutTail": result.stdout.tail or result.stdout.head,
        "sandboxed": result.sandboxed,
        "artifacts": [ref.to_dict() for ref in artifacts],
    }


def _summary(report: TestReport, result: CommandResult) -> str:
    if result.exit_code == 0:
        return f"All {report.tests} tests passed." if report.tests else "The test run passed."
    if result.exit_code == 5:
        return "No tests were collected; check the paths and the test configuration."
    failed = [e for e in report.entries if e.kind == "failure"]
    errored = [e for e in report.entries if e.kind == "error"]
    parts = []
    if failed:
        parts.append(_count_in(len(failed), "test failed", "tests failed", failed))
    if errored:
        parts.append(_count_in(len(errored), "error", "errors", errored))
    if not parts:
        return f"The test command exited with status {result.exit_code}; see its output."
    return "; ".join(parts) + "."


def _count_in(count: int, one: str, many: str, entries: list[ErrorEntry]) -> str:
    files = Counter(e.file or "?" for e in entries)
    where = next(iter(files)) if len(files) == 1 else f"{len(files)} files"
    return f"{count} {one if count == 1 else many} in {where}"


def _take_report(path: Path) -> bytes | None:
    """The report, if a regular file is there; ``None`` for anything else.

    Blocking I/O: call it in a worker thread. ``O_NONBLOCK`` keeps the open of a FIFO
    from waiting for a writer, ``O_NOFOLLOW`` refuses a planted link.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(MAX_REPORT_BYTES + 1)
        except OSError:
            return None
    return data if len(data) <= MAX_REPORT_BYTES else None


def _relative(file: str, workspace: Path) -> str:
    prefix = str(workspace).rstrip("/") + "/"
    return file.removeprefix(prefix).removeprefix("./")


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 1] + "…"

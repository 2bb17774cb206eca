"""``verifier.run``: the project's test command, its failures as ``errorSummary`` entries.

The configured command (default ``python -m pytest -q --junitxml={junitxml}``) runs
like ``shell.run``. The JUnit report path is a FIFO the runtime reads as the command
writes it; only the FIFO is bound into the sandbox, so the command can neither replace
it nor put anything on the host's disk beside it (that lands in the sandbox's own
size-limited /tmp), and a report past `MAX_REPORT_BYTES` is drained and dropped. The
report is kept as an artifact. Without one (another runner, a crash before pytest
wrote it) pytest's text output is parsed instead: its ``FAILED``/``ERROR`` lines and
``file.py:LINE:`` locations.

What decides "passed": a command that asks for a report (``{junitxml}`` in its argv)
passes only when it exits 0 *and* its report is readable, counts a test that ran and
no failure or error; exit status 0 alone proves nothing (``os._exit(0)`` in a test
ends pytest before it writes the report). Another command passes on exit status 0,
the only evidence it gives, unless its output names failures.

Failing tests make the call FAILED/PROCESS_EXIT_NONZERO with a short safe summary
("2 tests failed in tests/test_client.py") and the entries in the structured output;
exit status 0 without that evidence makes it FAILED/TOOL_ERROR.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
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
from toolkernel.redaction import Redactor
from toolkernel.tools.adapter import CommandResult, Sandbox, sandbox_for
from toolkernel.tools.workspace_io import Target, locate, open_dir, open_file

__all__ = ["ErrorEntry", "TestReport", "parse_junit", "parse_pytest_text", "verifier_run"]

MAX_ENTRIES: Final = 20
"""errorSummary entries the model sees; the report artifact has all of them."""

MAX_REPORT_BYTES: Final = 32 * 1024 * 1024
_REPORT_PLACEHOLDER: Final = "{junitxml}"
_CHUNK_BYTES: Final = 64 * 1024
# Reads after the command ended: once its writers are gone, what is left is at most a
# pipe buffer (1 MiB at most for an unprivileged process), far less than this many chunks.
_FINAL_READS: Final = 64
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
    command = sandbox.settings.test_command
    wants_report = any(_REPORT_PLACEHOLDER in a for a in command)
    # The report goes to a private directory outside the workspace: the runtime's
    # state directory is hidden from commands, and the workspace is the model's.
    report_dir = Path(tempfile.mkdtemp(prefix="toolkernel-junit-"))
    try:
        with _ReportPipe(report_dir) as pipe:
            argv = [a.replace(_REPORT_PLACEHOLDER, str(pipe.path)) for a in command]
            # "./" keeps a file named like an option from being read as one.
            argv += ["./" + "/".join(t.parts) for t in targets]
            result = await pipe.read_during(
                sandbox.run(argv, timeout_s=timeoutMs / 1000, label=_NAME, rw_dirs=(pipe.path,))
            )
            junit = pipe.finish()
    finally:
        # Shielded: whatever the command left there goes, even from a cancelled call.
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(partial(shutil.rmtree, report_dir, ignore_errors=True))
    report_ref = None
    report = None
    redactor = ctx.kernel.redactor if ctx.kernel else None  # sandbox_for saw to one
    if junit is not None:
        report_ref = sandbox.artifacts.put(
            junit,
            media_type="application/xml",
            description="JUnit report",
            producer=ctx.tool_call_id,
        )
        report = parse_junit(junit, ctx.workspace, redactor=redactor)
    if report is None:
        report = _text_report(sandbox, result, redactor)
    artifacts = (*result.artifacts, *([report_ref] if report_ref else []))
    unproven = _unproven(report, wants_report=wants_report) if result.exit_code == 0 else None
    data = _output(result, report, artifacts, passed=result.exit_code == 0 and not unproven)
    data.pop("artifacts")  # they travel as the result's artifact refs
    if result.exit_code != 0:
        raise ToolFailed(
            safe_message(ErrorCode.PROCESS_EXIT_NONZERO, detail=_summary(report, result)),
            code=ErrorCode.PROCESS_EXIT_NONZERO,
            output=data,
            artifacts=artifacts,
        )
    if unproven is not None:
        raise ToolFailed(
            safe_message(ErrorCode.TOOL_ERROR, tool=_NAME, detail=unproven),
            code=ErrorCode.TOOL_ERROR,
            output=data,
            artifacts=artifacts,
        )
    return ToolOutput(data, _summary(report, result), artifacts)


def _unproven(report: TestReport, *, wants_report: bool) -> str | None:
    """Why a run whose command exited 0 still cannot count as passed; ``None`` if it can."""
    if report.failures or report.errors or report.entries:
        failed = _failures(report) or "the test report counts failures or errors"
        return f"{failed}, although the test command exited 0."
    if not wants_report:
        return None  # another runner: its exit status is all the evidence it gives
    if report.source != "junit":
        return "the test run ended without its report; it cannot count as passed."
    if report.tests <= report.skipped:
        return "no test ran (none was collected, or all were skipped); it cannot count as passed."
    return None


def parse_junit(
    data: bytes, workspace: Path, *, redactor: Redactor | None = None
) -> TestReport | None:
    """Counts and failures from a JUnit XML report; ``None`` if it is not one.

    A failure's message is cut to a few hundred characters with ``redactor``'s
    ``clip`` (by default one with no known secrets), so nothing of a secret it cuts
    through is left.
    """
    # No DTDs: entity expansion is the one danger of parsing XML. Expat reads bytes in
    # whatever encoding a BOM, a declaration or a "<\0" start says, where a byte search
    # for "<!DOCTYPE" finds nothing; so the report must be UTF-8 (as pytest writes it),
    # and the decoded text is both what is searched and what is parsed: for a str, the
    # parser takes UTF-8 and ignores the declaration. No XML text holds a NUL, and without
    # them no UTF-16 or UTF-32 reading remains.
    if b"\0" in data:
        return None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        return None
    try:
        root = ET.fromstring(text)  # noqa: S314 - DTDs refused above, size capped by caller
    except ET.ParseError:
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = [_counts(s) for s in suites]
    if not suites or None in counts:
        return None
    entries: list[ErrorEntry] = []
    clip = partial(_clip, redactor=redactor or Redactor(workspace))
    for case in root.iter("testcase"):
        for kind in ("failure", "error"):
            problem = case.find(kind)
            if problem is not None:
                entries.append(_junit_entry(case, problem, kind, workspace, clip))
    tests, failures, errors, skipped = (sum(column) for column in zip(*counts, strict=True))
    return TestReport(tests, failures, errors, skipped, tuple(entries), source="junit")


def _counts(suite: ET.Element) -> tuple[int, int, int, int] | None:
    """A suite's tests, failures, errors and skips; ``None`` if one is not a count."""
    try:
        found = [int(suite.get(name, 0)) for name in ("tests", "failures", "errors", "skipped")]
    except ValueError:
        return None
    if min(found) < 0:
        return None
    tests, failures, errors, skipped = found
    return tests, failures, errors, skipped


def parse_pytest_text(
    text: str, workspace: Path, *, redactor: Redactor | None = None
) -> TestReport:
    """Failures from pytest's terminal output (its short test summary and tracebacks).

    Messages are cut as ``parse_junit`` cuts them.
    """
    clip = partial(_clip, redactor=redactor or Redactor(workspace))
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
                message=clip(match["message"] or match["kind"].lower()),
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


def _junit_entry(
    case: ET.Element,
    problem: ET.Element,
    kind: str,
    workspace: Path,
    clip: Callable[[str], str],
) -> ErrorEntry:
    classname = case.get("classname", "")
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
    return ErrorEntry(file, line, _test_id(case, workspace), clip(text), kind)


def _test_id(case: ET.Element, workspace: Path) -> str:
    """The test's pytest node id, from the testcase's own ``file`` or ``classname``
    (never from the traceback, whose last frame may be the code under test), so that
    it can be passed back to run the test again.

    pytest's classname is the node id's path with dots for slashes and no ``.py``,
    then the test's classes: the longest dotted prefix that names a file in the
    workspace is the path.
    """
    classname, name = case.get("classname", ""), case.get("name", "")
    parts = classname.split(".") if classname else []
    own = case.get("file")
    if own is not None:
        module = _relative(own, workspace).removesuffix(".py").split("/")
        if parts[: len(module)] == module:
            return "::".join([_relative(own, workspace), *parts[len(module) :], name])
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if _is_workspace_file(workspace, path):
            return "::".join([path, *parts[cut:], name])
    return f"{'/'.join(parts)}.py::{name}" if parts else name


def _is_workspace_file(workspace: Path, path: str) -> bool:
    """Whether ``path`` is a regular file in the workspace, reached without following a
    link: the report comes from the command, and the ids made of it must not tell the
    model what exists outside the workspace."""
    parts = tuple(path.split("/"))
    try:
        with open_dir(Target(path, parts, workspace)) as dir_fd:
            os.close(open_file(dir_fd, parts[-1]))
    except OSError:
        return False
    return True


def _text_report(sandbox: Sandbox, result: CommandResult, redactor: Redactor | None) -> TestReport:
    """The text parse over the stdout artifact (its first bytes), when JUnit is missing."""
    ref = result.stdout.artifact
    text = ""
    if ref is not None:
        with sandbox.artifacts.open(ref.id) as handle:
            text = handle.read(MAX_REPORT_BYTES).decode("utf-8", errors="replace")
    return parse_pytest_text(text, sandbox.workspace, redactor=redactor)


def _output(
    result: CommandResult, report: TestReport, artifacts: tuple[ArtifactRef, ...], *, passed: bool
) -> dict[str, Any]:
    return {
        "exitCode": result.exit_code,
        "passed": passed,
        "tests": report.tests,
        "failures": report.failures,
        "errors": report.errors,
        "skipped": report.skipped,
        "errorSummary": [e.to_dict() for e in report.entries[:MAX_ENTRIES]],
        "moreErrors": max(0, len(report.entries) - MAX_ENTRIES),
        "reportSource": report.source,
        "stdoutTail": result.stdout.tail or result.stdout.head,
        "stderrTail": result.stderr.tail or result.stderr.head,
        "sandboxed": result.sandboxed,
        "artifacts": [ref.to_dict() for ref in artifacts],
    }


def _summary(report: TestReport, result: CommandResult) -> str:
    if result.exit_code == 0:
        return f"All {report.tests} tests passed." if report.tests else "The test run passed."
    if result.exit_code == 5:
        return "No tests were collected; check the paths and the test configuration."
    failed = _failures(report)
    if not failed:
        return f"The test command exited with status {result.exit_code}; see its output."
    return failed + "."


def _failures(report: TestReport) -> str:
    """'2 tests failed in tests/test_a.py; 1 error in 2 files', or '' without entries."""
    failed = [e for e in report.entries if e.kind == "failure"]
    errored = [e for e in report.entries if e.kind == "error"]
    parts = []
    if failed:
        parts.append(_count_in(len(failed), "test failed", "tests failed", failed))
    if errored:
        parts.append(_count_in(len(errored), "error", "errors", errored))
    return "; ".join(parts)


def _count_in(count: int, one: str, many: str, entries: list[ErrorEntry]) -> str:
    files = Counter(e.file or "?" for e in entries)
    where = next(iter(files)) if len(files) == 1 else f"{len(files)} files"
    return f"{count} {one if count == 1 else many} in {where}"


class _ReportPipe:
    """The report path as a FIFO, read while the command writes it.

    Only the FIFO is bound into the sandbox, where it is a mount point: the command
    cannot remove or replace it, and a file it writes beside it lands in the sandbox's
    size-limited /tmp instead of on the host's disk (a bound directory would take
    anything). Past `MAX_REPORT_BYTES` the rest is drained and dropped, so the writer
    never blocks. The runtime's own write end keeps the FIFO from reading as ended
    before the command opens it.
    """

    def __init__(self, directory: Path) -> None:
        self.path = directory / "report.xml"
        os.mkfifo(self.path, 0o600)
        flags = os.O_NONBLOCK | os.O_CLOEXEC
        self._reader: int | None = os.open(self.path, os.O_RDONLY | flags)
        self._writer: int | None = os.open(self.path, os.O_WRONLY | flags)
        self._chunks: list[bytes] = []
        self._size = 0

    def __enter__(self) -> _ReportPipe:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for fd in (self._reader, self._writer):
            if fd is not None:
                os.close(fd)
        self._reader = self._writer = None

    async def read_during(self, run: Awaitable[CommandResult]) -> CommandResult:
        """``run``'s result, the report read meanwhile (``run``'s errors pass unwrapped)."""
        failure: Exception | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(self._drain)
            try:
                result = await run
            except Exception as exc:  # noqa: BLE001 - re-raised below, not in an ExceptionGroup
                failure = exc
            finally:
                group.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return result

    async def _drain(self) -> None:
        assert self._reader is not None
        while True:
            await anyio.wait_readable(self._reader)
            self._read_chunk()

    def finish(self) -> bytes | None:
        """What the command wrote, once it has ended; ``None`` for nothing or too much.

        Reads only what is left in the pipe: a writer the command left behind (possible
        only unsandboxed) is not waited for.
        """
        assert self._writer is not None
        os.close(self._writer)
        self._writer = None
        for _ in range(_FINAL_READS):
            if not self._read_chunk():
                break
        if not 0 < self._size <= MAX_REPORT_BYTES:
            return None
        return b"".join(self._chunks)

    def _read_chunk(self) -> bool:
        """Read what is there, up to a chunk; False at the end or with nothing there."""
        assert self._reader is not None
        try:
            chunk = os.read(self._reader, _CHUNK_BYTES)
        except BlockingIOError:
            return False
        self._size += len(chunk)
        if self._size <= MAX_REPORT_BYTES:
            self._chunks.append(chunk)
        else:
            self._chunks.clear()  # dropped whole: a cut report is no report
        return bool(chunk)


def _relative(file: str, workspace: Path) -> str:
    prefix = str(workspace).rstrip("/") + "/"
    return file.removeprefix(prefix).removeprefix("./")


def _clip(text: str, *, redactor: Redactor) -> str:
    """``text`` on one line, cut to `_MESSAGE_CHARS` with ``redactor.clip``; what that
    masks is not counted (a tool cannot add to its result's redaction notices)."""
    text = " ".join(text.split())
    if len(text) <= _MESSAGE_CHARS:
        return text
    return redactor.clip(text, 0, _MESSAGE_CHARS - 1, Counter()) + "…"

"""shell.run through a real Kernel and real bubblewrap: isolation, policy, timeouts."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from tool_support import exposing_all

from toolkernel.codes import ErrorCode, Status
from toolkernel.context import ToolContext
from toolkernel.definition import ExecutionMode, Permissions
from toolkernel.functions import tool
from toolkernel.ledger import EventType
from toolkernel.policy import Action
from toolkernel.testing import RecordingApprover, make_kernel
from toolkernel.tools import (
    WORKSPACE_TOOLS,
    CommandPolicy,
    CommandRule,
    SandboxAdapter,
    SandboxSettings,
    install,
    sandbox_for,
)
from toolkernel.tools import adapter as adapter_module

pytestmark = pytest.mark.anyio

CONFIG = exposing_all("developer")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "README.md").write_text("hello\n")
    return root


def build(ws: Path, settings: SandboxSettings | None = None, **kwargs: Any):
    kernel = make_kernel(ws, CONFIG, workspace_tools=False, **kwargs)
    # No skip: where bubblewrap cannot start these tests must fail loudly.
    assert install(kernel, settings) is not None
    return kernel


@pytest.fixture
def kernel(ws: Path):
    kernel = build(ws)
    yield kernel
    kernel.close()


def stdout_of(kernel, result) -> str:
    artifact = result.structured_output["stdout"].get("artifact")
    return kernel.artifacts.read(artifact).decode() if artifact else ""


def full_stdout(kernel, result) -> str:
    for ref in result.artifacts:
        if ref.description.endswith("stdout"):
            return kernel.artifacts.read(ref.id).decode()
    return ""


def survivors(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


async def test_a_command_runs_and_its_output_becomes_artifacts(kernel, ws):
    run = kernel.start_run()
    result = await kernel.call(run, "shell.run", {"argv": ["sh", "-c", "echo hi; echo oops >&2"]})
    assert result.status is Status.SUCCEEDED
    out = result.structured_output
    assert out["exitCode"] == 0
    assert out["stdout"]["head"] == "hi\n"
    assert out["stderr"]["head"] == "oops\n"
    assert out["sandboxed"] is True
    assert {kernel.artifacts.read(ref.id) for ref in result.artifacts} == {b"hi\n", b"oops\n"}


async def test_nonzero_exit_is_failed_with_the_output_kept(kernel):
    run = kernel.start_run()
    result = await kernel.call(run, "shell.run", {"argv": ["sh", "-c", "echo bad >&2; exit 3"]})
    assert result.status is Status.FAILED
    assert result.error_code is ErrorCode.PROCESS_EXIT_NONZERO
    assert result.structured_output["exitCode"] == 3
    assert "exited with status 3" in result.safe_message
    (stderr_ref,) = [a for a in result.artifacts if "stderr" in a.description]
    assert kernel.artifacts.read(stderr_ref.id) == b"bad\n"


@pytest.mark.parametrize(
    ("argv", "status", "meaning"),
    [
        (["no-such-program", "--version"], 127, "not found"),
        (["./notes.txt"], 126, "that cannot be executed"),
    ],
)
async def test_a_program_that_cannot_run_says_so(kernel, ws, argv, status, meaning):
    (ws / "notes.txt").write_text("not a program\n")
    run = kernel.start_run()
    result = await kernel.call(run, "shell.run", {"argv": argv})
    assert result.error_code is ErrorCode.PROCESS_EXIT_NONZERO
    assert result.structured_output["exitCode"] == status
    assert f"exited with status {status} (a shell's status for a program {meaning})" in (
        result.safe_message
    )


async def test_connecting_to_any_address_fails_when_network_is_denied(kernel):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    probe = (
        "import socket\n"
        f"for host, port in (('127.0.0.1', {port}), ('1.1.1.1', 53), ('8.8.8.8', 443)):\n"
        "    s = socket.socket(); s.settimeout(2)\n"
        "    try:\n"
        "        s.connect((host, port)); print('CONNECTED', host)\n"
        "    except OSError as e:\n"
        "        print('refused', host, type(e).__name__)\n"
        "try:\n"
        "    socket.getaddrinfo('example.com', 80); print('RESOLVED')\n"
        "except OSError:\n"
        "    print('no dns')\n"
    )
    try:
        run = kernel.start_run()
        result = await kernel.call(run, "shell.run", {"argv": [sys.executable, "-c", probe]})
    finally:
        listener.close()
    assert result.status is Status.SUCCEEDED, result.safe_message
    text = stdout_of(kernel, result)
    assert "CONNECTED" not in text
    assert "RESOLVED" not in text
    assert text.count("refused") == 3


async def test_writing_outside_the_workspace_fails(kernel, ws, tmp_path):
    outside = tmp_path / "outside.txt"
    home_file = Path.home() / f"tk-{uuid.uuid4().hex}"
    script = (
        f"echo x > {outside} || echo denied-outside; "
        f"echo x > {home_file} || echo denied-home; "
        "echo x > /usr/tk-probe || echo denied-usr; "
        "echo x > inside.txt && echo wrote-inside"
    )
    run = kernel.start_run()
    result = await kernel.call(run, "shell.run", {"argv": ["sh", "-c", script]})
    text = stdout_of(kernel, result)
    # The workspace's parent lies under /tmp, which is the sandbox's private tmpfs:
    # the write may succeed in there, but it must never reach the host.
    assert "denied-home" in text
    assert "denied-usr" in text
    assert "wrote-inside" in text
    assert not outside.exists()
    assert not home_file.exists()
    assert (ws / "inside.txt").read_text() == "x\n"


async def test_host_processes_are_invisible(kernel):
    marker = f"tk-host-marker-{uuid.uuid4().hex}"
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        run = kernel.start_run()
        result = await kernel.call(
            run, "shell.run", {"argv": ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"]}
        )
    finally:
        host.kill()
        host.wait()
    assert result.status is Status.SUCCEEDED
    assert marker not in stdout_of(kernel, result)


async def test_variables_not_on_the_allow_list_are_absent(ws, monkeypatch):
    monkeypatch.setenv("TK_CANARY_TOKEN", "canary-4d1f9e")
    monkeypatch.setenv("TK_ALLOWED_NAME", "visible-value")
    kernel = build(ws, SandboxSettings(env_allow=("TK_ALLOWED_NAME",)))
    try:
        run = kernel.start_run()
        result = await kernel.call(run, "shell.run", {"argv": ["env"]})
    finally:
        kernel.close()
    env = dict(line.split("=", 1) for line in full_stdout(kernel, result).splitlines())
    assert "TK_CANARY_TOKEN" not in env
    assert "canary-4d1f9e" not in full_stdout(kernel, result)
    assert env["TK_ALLOWED_NAME"] == "visible-value"
    assert env["HOME"] == "/tmp"
    assert set(env) <= {"PATH", "LANG", "HOME", "TMPDIR", "TK_ALLOWED_NAME", "PWD", "SHLVL", "_"}


async def test_secret_environment_values_are_masked_in_the_projection_and_the_artifact(ws):
    kernel = build(ws, SandboxSettings(secret_env={"DEPLOY_TOKEN": "s3cr3t-deploy-value"}))
    try:
        run = kernel.start_run()
        result = await kernel.call(
            run, "shell.run", {"argv": ["sh", "-c", "echo token=$DEPLOY_TOKEN"]}
        )
    finally:
        kernel.close()
    assert result.status is Status.SUCCEEDED
    assert "s3cr3t-deploy-value" not in str(result.to_dict())
    # The artifact outlives the process that knew the secret: it is stored masked.
    assert kernel.artifacts.read(result.artifacts[0].id) == b"token=[REDACTED]\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["curl", "https://example.com"],
        ["/usr/bin/curl", "-s", "https://example.com"],
        ["env", "A=1", "wget", "x"],
        ["sh", "-c", "echo hi && curl https://example.com"],
    ],
)
async def test_denied_command_prefixes_are_not_run(kernel, argv):
    run = kernel.start_run()
    result = await kernel.call(run, "shell.run", {"argv": argv})
    assert result.status is Status.INVALID_ARGUMENTS
    assert result.error_code is ErrorCode.COMMAND_NOT_ALLOWED
    assert result.structured_output is None


async def test_an_argument_with_a_nul_is_invalid_before_anything_runs(kernel):
    run = kernel.start_run()
    result = await kernel.call(run, "shell.run", {"argv": ["echo", "a\x00b"]})
    assert (result.status, result.error_code) == (
        Status.INVALID_ARGUMENTS,
        ErrorCode.SCHEMA_VIOLATION,
    )
    assert "'argv[1]'" in result.safe_message
    assert "NUL" in result.safe_message
    events = [e.type for e in kernel.ledger.events(run.id) if e.tool_call_id]
    assert EventType.TOOL_CALL_STARTED not in events


ASK_ECHO = SandboxSettings(
    command_policy=CommandPolicy((CommandRule(("echo", "publish"), Action.ASK, "it publishes"),))
)


async def test_asked_command_without_an_approval_is_refused(ws):
    kernel = build(ws, ASK_ECHO)
    try:
        run = kernel.start_run()
        result = await kernel.call(run, "shell.run", {"argv": ["echo", "publish", "now"]})
    finally:
        kernel.close()
    assert result.status is Status.DENIED
    assert result.error_code is ErrorCode.APPROVAL_REQUIRED
    assert "echo publish now" in result.safe_message


async def test_asked_command_runs_once_a_human_approved_the_call(ws):
    approver = RecordingApprover(approve=True)
    kernel = make_kernel(
        ws,
        CONFIG + '\n[[policy.rules]]\ntools = ["shell.run"]\naction = "ask"\n',
        approver=approver,
        workspace_tools=False,
    )
    assert install(kernel, ASK_ECHO) is not None
    try:
        run = kernel.start_run()
        result = await kernel.call(run, "shell.run", {"argv": ["echo", "publish", "now"]})
        events = kernel.ledger.events(run.id)
    finally:
        kernel.close()
    assert result.status is Status.SUCCEEDED
    assert approver.requests[0].arguments["argv"] == ["echo", "publish", "now"]
    assert EventType.APPROVAL_GRANTED in [e.type for e in events]


async def test_a_hanging_tree_that_ignores_sigterm_times_out_with_partial_output(kernel, ws):
    marker = f"tk-hang-{uuid.uuid4().hex}"
    script = (
        "trap '' TERM; "
        f"(trap '' TERM; exec -a {marker}-child sleep 300) & "
        f"setsid sh -c 'trap \"\" TERM; exec -a {marker}-grandchild sleep 300' & "
        "echo started; echo to-stderr >&2; exec sleep 300"
    )
    run = kernel.start_run()
    with anyio.fail_after(30):
        result = await kernel.call(
            run, "shell.run", {"argv": ["bash", "-c", script], "timeoutMs": 1500}
        )
    assert result.status is Status.TIMED_OUT
    assert result.error_code is ErrorCode.TIMEOUT
    assert result.retryable is True
    out = result.structured_output
    assert out["timedOut"] is True
    assert out["stdout"]["head"] == "started\n"
    assert kernel.artifacts.read(out["stdout"]["artifact"]) == b"started\n"
    assert survivors(marker) == []


async def test_cancelling_a_running_command_keeps_its_partial_output(kernel, ws):
    marker = f"tk-cancel-{uuid.uuid4().hex}"
    script = f"echo partial; touch ready; exec -a {marker} sleep 300"
    run = kernel.start_run()
    results = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:

            async def call() -> None:
                results.append(
                    await kernel.call(
                        run, "shell.run", {"argv": ["bash", "-c", script]}, tool_call_id="c1"
                    )
                )

            group.start_soon(call)
            while not (ws / "ready").exists():
                await anyio.sleep(0.01)
            assert run.cancel_call("c1", ErrorCode.USER_CANCELLED)
    (result,) = results
    assert result.status is Status.CANCELLED
    assert result.error_code is ErrorCode.USER_CANCELLED
    artifact = result.structured_output["stdout"]["artifact"]
    assert kernel.artifacts.read(artifact) == b"partial\n"
    assert survivors(marker) == []


async def test_a_cancelled_command_reports_how_long_it_ran(kernel, ws):
    run = kernel.start_run()
    results = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:

            async def call() -> None:
                arguments = {"argv": ["sh", "-c", "touch ready; sleep 300"]}
                results.append(await kernel.call(run, "shell.run", arguments, tool_call_id="c1"))

            group.start_soon(call)
            while not (ws / "ready").exists():
                await anyio.sleep(0.01)
            await anyio.sleep(0.4)
            assert run.cancel_call("c1", ErrorCode.USER_CANCELLED)
    (result,) = results
    assert result.status is Status.CANCELLED
    assert result.structured_output["cancelled"] is True
    assert 400 <= result.structured_output["durationMs"] < 30_000


async def test_a_long_command_reports_progress_until_it_ends(kernel, monkeypatch):
    monkeypatch.setattr(adapter_module, "RUNNING_INTERVAL_S", 0.2)
    run = kernel.start_run()
    heard: list[tuple[str, float, float | None, str | None]] = []
    with anyio.fail_after(30):
        result = await kernel.call(
            run,
            "shell.run",
            {"argv": ["sh", "-c", "printf abc; sleep 1.1"]},
            on_progress=lambda *report: heard.append(report),
            tool_call_id="c1",
        )
    assert result.status is Status.SUCCEEDED
    progress = [
        event.payload
        for event in kernel.ledger.events(run.id)
        if event.type is EventType.TOOL_CALL_PROGRESS
    ]
    assert 3 <= len(progress) <= 6
    seconds = [report["progress"] for report in progress]
    assert all(a < b for a, b in itertools.pairwise(seconds))
    assert all(report["total"] is None for report in progress)
    assert progress[-1]["message"] == (
        f"shell.run: the command has run for {seconds[-1]:.0f} s and written 3 bytes of output"
    )
    assert [(call_id, number) for call_id, number, _, _ in heard] == [("c1", n) for n in seconds]


async def test_a_quick_command_reports_no_progress(kernel):
    run = kernel.start_run()
    result = await kernel.call(run, "shell.run", {"argv": ["true"]})
    assert result.status is Status.SUCCEEDED
    types = [event.type for event in kernel.ledger.events(run.id)]
    assert EventType.TOOL_CALL_PROGRESS not in types


async def test_a_custom_process_tool_gets_the_sandbox_and_the_call_deadline(ws):
    @tool(
        "test.hang",
        execution_mode=ExecutionMode.PROCESS,
        permissions=Permissions(execute_command=True),
        timeout_ms=1_500,
    )
    async def hang(ctx: ToolContext) -> dict[str, Any]:
        """Run a command that never ends, with no timeout of its own."""
        result = await sandbox_for(ctx).run(["sh", "-c", "echo begun; sleep 300"])
        return result.to_dict()

    kernel = build(ws)
    kernel.register(hang)
    try:
        run = kernel.start_run()
        with anyio.fail_after(10):
            result = await kernel.call(run, "test.hang", {})
    finally:
        kernel.close()
    # The command's own timer fires before the kernel's, so the output survives.
    assert result.status is Status.TIMED_OUT
    assert result.structured_output["stdout"]["head"] == "begun\n"


async def test_without_bwrap_the_modes_are_refused_unless_unsandboxed_is_opted_in(ws):
    kernel = make_kernel(ws, CONFIG, workspace_tools=False)
    try:
        for workspace_tool in WORKSPACE_TOOLS:
            kernel.register(workspace_tool)
        run = kernel.start_run()
        refused = await kernel.call(run, "shell.run", {"argv": ["true"]})
        kernel.adapters.update(SandboxAdapter(SandboxSettings(), bwrap=None).adapters())
        marked = await kernel.call(run, "shell.run", {"argv": ["true"]})
    finally:
        kernel.close()
    assert refused.status is Status.DENIED
    assert refused.error_code is ErrorCode.SANDBOX_UNAVAILABLE
    assert marked.status is Status.SUCCEEDED
    assert marked.structured_output["sandboxed"] is False


async def test_too_many_forbidden_files_to_hide_one_by_one_tell_the_model_why(kernel, ws):
    certs = ws / "certs"
    certs.mkdir()
    (certs / "README.md").write_text("test certificates\n")
    for number in range(2_100):
        (certs / f"c{number}.pem").touch()
    result = await kernel.call(kernel.start_run(), "shell.run", {"argv": ["true"]})
    assert result.status is Status.DENIED
    assert result.error_code is ErrorCode.SANDBOX_UNAVAILABLE
    assert result.safe_message.endswith(
        "than the sandbox can hide one by one; tell the user to gather them in "
        "directories of their own."
    )
    assert str(ws) not in result.safe_message


async def test_an_unusable_bwrap_raises_sandbox_unavailable_unless_opted_in():
    from toolkernel.errors import SandboxUnavailable

    with pytest.raises(SandboxUnavailable):
        SandboxAdapter.create(settings=SandboxSettings(bwrap="/nonexistent/bwrap"))
    adapter = SandboxAdapter.create(
        settings=SandboxSettings(bwrap="/nonexistent/bwrap", allow_unsandboxed=True)
    )
    assert adapter.sandboxed is False


def test_the_runtime_env_is_not_inherited(monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_should_not_leak")
    adapter = SandboxAdapter(SandboxSettings(), bwrap=None)
    assert "GITHUB_TOKEN" not in adapter._base_env
    assert os.environ["GITHUB_TOKEN"] == "ghp_should_not_leak"


async def test_a_full_disk_fails_the_call_cleanly_and_leaves_no_staging_behind(kernel, monkeypatch):
    """A command whose output could not be kept (the state disk full) failed with "the
    tool raised ExceptionGroup" and left its staged output there, jamming later calls."""
    import errno

    from toolkernel.artifacts import _STAGING
    from toolkernel.tools import adapter as adapter_module

    real = adapter_module.run_sandboxed

    async def full_disk(*args: Any, **kwargs: Any) -> Any:
        await real(*args, **kwargs)  # the output is staged
        raise ExceptionGroup("errors in a task group", [OSError(errno.ENOSPC, "No space left")])

    monkeypatch.setattr(adapter_module, "run_sandboxed", full_disk)
    run = kernel.start_run()
    result = await kernel.call(run, "shell.run", {"argv": ["sh", "-c", "echo hi"]})
    assert (result.status, result.error_code) == (Status.FAILED, ErrorCode.INTERNAL_ERROR)
    assert list((kernel.artifacts.root / _STAGING).iterdir()) == []
    monkeypatch.setattr(adapter_module, "run_sandboxed", real)
    assert (await kernel.call(run, "shell.run", {"argv": ["true"]})).status is Status.SUCCEEDED

"""Isolation properties of the bubblewrap sandbox, checked against the real binary.

Each test runs a probe command inside the sandbox and asserts on what it could see or
do; where a property could silently pass for the wrong reason, a control run with the
permission granted shows the probe would have detected the breach.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from toolkernel.sandbox import (
    ProcessOutcome,
    SandboxLimits,
    SandboxSpec,
    SandboxUnavailable,
    find_bwrap,
    probe,
    run_sandboxed,
)
from toolkernel.sandbox import bwrap as bwrap_module
from toolkernel.sandbox import pids as pids_module
from toolkernel.sandbox import process as process_module

BASE_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("hello\n")
    return ws


def run(
    bwrap: Path,
    argv: Sequence[str],
    workspace: Path,
    *,
    writable: bool = False,
    network: bool = False,
    env: Mapping[str, str] = BASE_ENV,
    limits: SandboxLimits | None = None,
    timeout_s: float = 30,
) -> tuple[ProcessOutcome, str]:
    spec = SandboxSpec(
        workspace=workspace,
        writable=writable,
        network=network,
        env=env,
        limits=limits or SandboxLimits(),
    )
    output_dir = workspace.parent / f"out-{uuid.uuid4().hex}"

    async def main() -> ProcessOutcome:
        with anyio.fail_after(timeout_s + 10):
            return await run_sandboxed(
                argv, spec, bwrap=bwrap, timeout_s=timeout_s, output_dir=output_dir
            )

    outcome = anyio.run(main)
    return outcome, outcome.stdout_path.read_text()


def run_python(bwrap: Path, code: str, workspace: Path, **options: Any) -> Any:
    outcome, stdout = run(bwrap, ["python3", "-c", textwrap.dedent(code)], workspace, **options)
    assert outcome.exit_code == 0, outcome.stderr_path.read_text()
    return json.loads(stdout)


CONNECT = """
    import json, socket, sys
    results = {}
    for host, port in json.loads(sys.argv[1]):
        try:
            socket.create_connection((host, port), timeout=3).close()
            results[f"{host}:{port}"] = "connected"
        except OSError as exc:
            results[f"{host}:{port}"] = type(exc).__name__
    print(json.dumps(results))
"""


@pytest.fixture
def host_listener() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def _connect_results(bwrap: Path, workspace: Path, targets: list[Any], **options: Any) -> Any:
    argv = ["python3", "-c", textwrap.dedent(CONNECT), json.dumps(targets)]
    outcome, stdout = run(bwrap, argv, workspace, **options)
    assert outcome.exit_code == 0, outcome.stderr_path.read_text()
    return json.loads(stdout)


def test_no_address_is_reachable_when_network_is_denied(
    bwrap: Path, workspace: Path, host_listener: int
) -> None:
    targets = [["127.0.0.1", host_listener], ["1.1.1.1", 53], ["10.0.0.1", 80], ["::1", 22]]
    results = _connect_results(bwrap, workspace, targets)
    assert "connected" not in results.values(), results


def test_host_loopback_is_reachable_when_network_is_allowed(
    bwrap: Path, workspace: Path, host_listener: int
) -> None:
    # The control for the test above: the probe does detect a shared network.
    results = _connect_results(bwrap, workspace, [["127.0.0.1", host_listener]], network=True)
    assert results == {f"127.0.0.1:{host_listener}": "connected"}


WRITE_ATTEMPTS = """
    import json, sys
    written = []
    for target in sys.argv[1:]:
        try:
            with open(target, "w") as handle:
                handle.write("x")
            written.append(target)
        except OSError:
            pass
    print(json.dumps(written))
"""


def _writes(bwrap: Path, workspace: Path, targets: list[str], *, writable: bool) -> Any:
    argv = ["python3", "-c", textwrap.dedent(WRITE_ATTEMPTS), *targets]
    outcome, stdout = run(bwrap, argv, workspace, writable=writable)
    assert outcome.exit_code == 0, outcome.stderr_path.read_text()
    return json.loads(stdout)


@pytest.fixture
def var_tmp() -> Iterator[Path]:
    # Outside /tmp, so nothing around the workspace is shadowed by the private /tmp.
    with tempfile.TemporaryDirectory(dir="/var/tmp") as root:
        yield Path(root)


def test_writing_outside_the_workspace_fails(bwrap: Path, var_tmp: Path) -> None:
    workspace = var_tmp / "ws"
    outside = var_tmp / "outside"
    workspace.mkdir()
    outside.mkdir()
    targets = [
        str(outside / "escaped.txt"),
        str(var_tmp / "sibling.txt"),
        "/etc/escaped.txt",
        "/usr/escaped.txt",
        "/escaped.txt",
        str(Path.home() / "escaped.txt"),
    ]
    assert _writes(bwrap, workspace, targets, writable=True) == []
    assert not (outside / "escaped.txt").exists()
    assert not (var_tmp / "sibling.txt").exists()


def test_writes_beside_a_workspace_under_tmp_stay_in_the_private_tmp(
    bwrap: Path, workspace: Path
) -> None:
    sibling = workspace.parent / "sibling.txt"
    assert _writes(bwrap, workspace, [str(sibling)], writable=True) == [str(sibling)]
    assert not sibling.exists()


def test_read_only_workspace_rejects_writes(bwrap: Path, workspace: Path) -> None:
    targets = [str(workspace / "new.txt"), str(workspace / "README.md")]
    assert _writes(bwrap, workspace, targets, writable=False) == []
    assert (workspace / "README.md").read_text() == "hello\n"


def test_writable_workspace_accepts_writes(bwrap: Path, workspace: Path) -> None:
    target = workspace / "new.txt"
    assert _writes(bwrap, workspace, [str(target)], writable=True) == [str(target)]
    assert target.read_text() == "x"


def test_host_processes_are_invisible(bwrap: Path, workspace: Path) -> None:
    pids = run_python(
        bwrap,
        "import json, os; print(json.dumps([int(p) for p in os.listdir('/proc') if p.isdigit()]))",
        workspace,
    )
    # bubblewrap's init is 1, the command 2; nothing of the host appears.
    assert os.getpid() not in pids
    assert os.getppid() not in pids
    assert set(pids) <= {1, 2, 3}


def test_environment_holds_only_the_allow_list(
    bwrap: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = f"canary-{uuid.uuid4().hex}"
    monkeypatch.setenv("TOOLKERNEL_TEST_CANARY_SECRET", canary)
    outcome, stdout = run(bwrap, ["env"], workspace, env={**BASE_ENV, "ALLOWED": "yes"})
    assert outcome.exit_code == 0
    names = {line.partition("=")[0] for line in stdout.splitlines()}
    assert canary not in stdout
    # bubblewrap sets PWD after --chdir; everything else is exactly what we passed.
    assert names == {*BASE_ENV, "ALLOWED", "PWD"}


def test_tmp_is_private(bwrap: Path, workspace: Path) -> None:
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="toolkernel-host-") as host_file:
        inside_name = f"/tmp/toolkernel-inside-{uuid.uuid4().hex}"
        seen = run_python(
            bwrap,
            f"""
            import json, os
            visible = os.path.exists({host_file.name!r})
            open({inside_name!r}, "w").write("x")
            print(json.dumps(visible))
            """,
            workspace,
        )
        assert seen is False
    assert not Path(inside_name).exists()


def test_the_runtime_virtualenv_interpreter_works_inside(bwrap: Path, workspace: Path) -> None:
    argv = [sys.executable, "-c", "import anyio, sys, json; print(json.dumps(sys.prefix))"]
    outcome, stdout = run(bwrap, argv, workspace, env={"PATH": "/usr/bin:/bin"})
    assert outcome.exit_code == 0, outcome.stderr_path.read_text()
    assert json.loads(stdout) == sys.prefix


def bound(args: Sequence[str]) -> list[Path]:
    """The host paths a bubblewrap command line binds."""
    binds = ("--bind", "--ro-bind", "--ro-bind-try")
    return [Path(args[i + 1]) for i, arg in enumerate(args[:-1]) if arg in binds]


@pytest.fixture
def host_secret(tmp_path: Path) -> Path:
    """A file outside the workspace, under the host's /tmp (private in the sandbox)."""
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("host-only-contents\n")
    return secret


@pytest.mark.parametrize("program", ["/tmp/../bin/sh", "/usr/../bin/sh", "/bin/./sh"])
def test_a_program_path_with_dot_segments_binds_no_more_of_the_host(
    bwrap: Path, workspace: Path, host_secret: Path, program: str
) -> None:
    script = f"cat {host_secret}; ls /root /etc/shadow"
    outcome, stdout = run(bwrap, [program, "-c", script], workspace)
    assert "host-only-contents" not in stdout
    assert outcome.exit_code != 0
    assert "No such file or directory" in outcome.stderr_path.read_text()


def test_a_script_s_interpreter_path_with_dot_segments_binds_no_more_of_the_host(
    bwrap: Path, workspace: Path, host_secret: Path
) -> None:
    script = workspace / "peek"
    script.write_text(f"#!/tmp/../bin/sh\ncat {host_secret}\n")
    script.chmod(0o755)
    outcome, stdout = run(bwrap, ["./peek"], workspace)
    assert "host-only-contents" not in stdout
    assert outcome.exit_code != 0


def test_naming_a_host_file_as_the_program_shows_nothing_of_it(
    bwrap: Path, workspace: Path, host_secret: Path
) -> None:
    """Not bound into the sandbox: running it finds no such file, as for a file that
    does not exist (not "permission denied", which would tell that it does)."""
    outcome, _ = run(bwrap, [str(host_secret)], workspace)
    assert outcome.exit_code != 0
    assert "No such file or directory" in outcome.stderr_path.read_text()
    spec = SandboxSpec(workspace, writable=False, env={})
    args = bwrap_module.bwrap_argv([str(host_secret.parent)], spec, bwrap=bwrap)
    assert not [path for path in bound(args) if host_secret.is_relative_to(path)]


def test_an_interpreter_that_does_not_exist_binds_nothing(
    bwrap: Path, workspace: Path, tmp_path: Path
) -> None:
    """A prefix is bound for a program that exists there, never for a name alone: a
    made-up ``#!/DIR/bin/x`` would otherwise bind any DIR that has a lib/."""
    prefix = tmp_path / "prefix"
    (prefix / "lib").mkdir(parents=True)
    (prefix / "lib" / "private.txt").write_text("not for the sandbox\n")
    script = workspace / "run-me"
    script.write_text(f"#!{prefix}/bin/x\n")
    script.chmod(0o755)
    spec = SandboxSpec(workspace, writable=False, env={"PATH": "/usr/bin:/bin"})
    args = bwrap_module.bwrap_argv(["./run-me"], spec, bwrap=bwrap)
    assert not [path for path in bound(args) if path.is_relative_to(prefix)]


def program_binds(bwrap: Path, workspace: Path, argv0: str) -> list[Path]:
    """What bubblewrap would show for ``argv0`` besides the system and the workspace: the
    binds' sources resolved, as bubblewrap resolves them."""
    spec = SandboxSpec(workspace, writable=False, env={"PATH": "/usr/bin:/bin"})
    system = {Path(d) for d in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")}
    return [
        path.resolve()
        for path in bound(bwrap_module.bwrap_argv([argv0], spec, bwrap=bwrap))
        if path != workspace and path not in system and not path.is_relative_to(Path("/etc"))
    ]


def executable(path: Path, text: str = "#!/bin/sh\necho ran\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def model_venv(workspace: Path, home: str, reads: Path) -> str:
    """A virtual environment the model wrote in the workspace, whose ``pyvenv.cfg``
    names ``home`` and whose program prints ``reads``; the program's path."""
    executable(workspace / "venv" / "bin" / "tool", f"#!/bin/sh\ncat {reads}\n")
    (workspace / "venv" / "pyvenv.cfg").write_text(f"home = {home}\n")
    return "venv/bin/tool"


def binds_and_output(bwrap: Path, workspace: Path, program: str) -> tuple[list[Path], str]:
    """What ``program`` gets bound, and what it prints when run in the sandbox."""
    _, stdout = run(bwrap, [program], workspace)
    return program_binds(bwrap, workspace, program), stdout


def test_a_virtualenv_the_model_wrote_binds_no_host_directory_it_names(
    bwrap: Path, workspace: Path, host_secret: Path
) -> None:
    """``home =`` in a pyvenv.cfg in the workspace counts only where a Python is installed."""
    program = model_venv(workspace, str(host_secret.parent / "x"), host_secret)
    binds, stdout = binds_and_output(bwrap, workspace, program)
    assert binds == []
    assert "host-only-contents" not in stdout


def test_a_virtualenv_home_is_judged_where_it_leads_not_as_it_reads(
    bwrap: Path, workspace: Path, host_secret: Path
) -> None:
    """``home = <ws>/l/../fake`` with ``l`` linking outside reads as the model's own
    ``<ws>/fake`` (which holds a python3), and leads into the host directory."""
    (workspace / "l").symlink_to(host_secret.parent / "inner", target_is_directory=True)
    (host_secret.parent / "inner").mkdir()
    executable(workspace / "fake" / "python3")
    (workspace / "fake" / "lib" / "python3.11").mkdir(parents=True)
    program = model_venv(workspace, f"{workspace}/l/../fake", host_secret)
    binds, stdout = binds_and_output(bwrap, workspace, program)
    assert binds == []
    assert "host-only-contents" not in stdout


def test_a_virtualenv_home_in_the_workspace_does_not_bind_its_parent(
    bwrap: Path, workspace: Path
) -> None:
    """The workspace's parent holds other workspaces and their state."""
    neighbour = workspace.parent / "neighbour" / ".toolkernel"
    neighbour.mkdir(parents=True)
    (neighbour / "ledger.db").write_text("another workspace's ledger\n")
    executable(workspace / "python3")
    (workspace / "lib" / "python3.11").mkdir(parents=True)
    program = model_venv(workspace, str(workspace), neighbour / "ledger.db")
    binds, stdout = binds_and_output(bwrap, workspace, program)
    assert binds == []
    assert "another workspace" not in stdout


def test_no_bind_is_named_through_proc(bwrap: Path, workspace: Path) -> None:
    """``/proc/self/root/…`` leads anywhere, a workspace link included; what the path
    resolves to (the runtime's own interpreter here) is judged and bound by its name."""
    spec = SandboxSpec(workspace, writable=False, env={"PATH": "/usr/bin:/bin"})
    argv0 = f"/proc/self/root{sys.executable}"
    binds = bound(bwrap_module.bwrap_argv([argv0], spec, bwrap=bwrap))
    assert not [path for path in binds if path.is_relative_to("/proc")]


def test_a_real_interpreter_named_by_a_virtualenv_is_bound(bwrap: Path, workspace: Path) -> None:
    interpreter = Path(sys.base_prefix)
    executable(workspace / "venv" / "bin" / "tool")
    (workspace / "venv" / "pyvenv.cfg").write_text(f"home = {interpreter / 'bin'}\n")
    assert interpreter.resolve() in program_binds(bwrap, workspace, "venv/bin/tool")


@pytest.fixture
def fake_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home with pip --user's programs and libraries beside an app's keyring."""
    home = tmp_path / "homes" / "u"
    executable(home / ".local" / "bin" / "pip")
    (home / ".local" / "lib").mkdir(parents=True)
    (home / ".local" / "share" / "keyrings").mkdir(parents=True)
    (home / "lib").mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.mark.parametrize("spelling", ["{}", "/{}", "{}/../bin/pip"])
def test_a_user_s_local_programs_bind_only_their_libraries(
    bwrap: Path, workspace: Path, fake_home: Path, spelling: str
) -> None:
    program = fake_home / ".local" / "bin" / "pip"
    argv0 = spelling.format(program) if "{}/.." not in spelling else f"{program.parent}/../bin/pip"
    binds = program_binds(bwrap, workspace, argv0)
    assert set(binds) == {program.resolve(), (fake_home / ".local" / "lib").resolve()}


def test_a_home_behind_a_symlink_is_not_bound_whole(
    bwrap: Path, workspace: Path, fake_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = fake_home.parent.parent / "linked-homes"
    link.symlink_to(fake_home.parent)
    monkeypatch.setenv("HOME", str(link / "u"))
    binds = program_binds(bwrap, workspace, str(link / "u" / ".local" / "bin" / "pip"))
    assert set(binds) == {
        (fake_home / ".local" / "bin" / "pip").resolve(),
        (fake_home / ".local" / "lib").resolve(),
    }


def test_programs_in_other_users_homes_or_outside_toolchains_bind_nothing(
    bwrap: Path, workspace: Path, fake_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = tmp_path / "homes" / "alice"
    executable(alice / ".local" / "bin" / "tool")
    executable(alice / "bin" / "tool")
    (alice / "lib").mkdir()
    entry = SimpleNamespace(pw_dir=str(alice))
    monkeypatch.setattr(bwrap_module.pwd, "getpwall", lambda: [entry])
    for program in (alice / ".local" / "bin" / "tool", alice / "bin" / "tool"):
        assert program_binds(bwrap, workspace, str(program)) == []
    # In the user's own home, a program outside the toolchain directories neither.
    executable(fake_home / "bin" / "mine")
    assert program_binds(bwrap, workspace, str(fake_home / "bin" / "mine")) == []


def test_a_user_without_a_home_still_gets_a_sandbox(
    bwrap: Path, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container's arbitrary uid: no HOME and no passwd entry, so no home of its own.
    Programs outside the system still bind; every home in the passwd database is still
    refused."""
    other = tmp_path / "homes" / "alice"
    executable(other / ".local" / "bin" / "tool")
    tool = executable(tmp_path / "opt" / "tool" / "bin" / "tool")
    (tool.parent.parent / "lib").mkdir()
    monkeypatch.delenv("HOME")

    def unknown(uid: int) -> Any:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    entry = SimpleNamespace(pw_dir=str(other))
    monkeypatch.setattr(bwrap_module.pwd, "getpwuid", unknown)
    monkeypatch.setattr(bwrap_module.pwd, "getpwall", lambda: [entry])
    assert program_binds(bwrap, workspace, str(tool)) == [tool.parent.parent.resolve()]
    assert program_binds(bwrap, workspace, str(other / ".local" / "bin" / "tool")) == []


def test_a_program_path_that_cannot_be_looked_at_binds_nothing_and_raises_nothing(
    bwrap: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_is_file = Path.is_file

    def is_file(path: Path) -> bool:
        if str(path).startswith("/forbidden"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_is_file(path)

    monkeypatch.setattr(Path, "is_file", is_file)
    assert program_binds(bwrap, workspace, "/forbidden/bin/sh") == []


def test_rlimits_reach_the_command(bwrap: Path, workspace: Path) -> None:
    limits = SandboxLimits(cpu_seconds=7, memory_bytes=512 * 1024**2, file_size_bytes=1024**2)
    got = run_python(
        bwrap,
        """
        import json, resource as r
        kinds = (r.RLIMIT_CPU, r.RLIMIT_AS, r.RLIMIT_NPROC, r.RLIMIT_FSIZE, r.RLIMIT_CORE)
        print(json.dumps([r.getrlimit(k)[0] for k in kinds]))
        """,
        workspace,
        limits=limits,
    )
    assert got == [7, 512 * 1024**2, limits.max_processes, 1024**2, 0]


def test_a_root_command_with_no_pids_cgroup_to_hold_it_is_refused(
    bwrap: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_cgroup() -> Path:
        raise OSError(errno.ENOENT, "no cgroup hierarchy with the pids controller is mounted")

    monkeypatch.setattr(process_module, "needs_pids_cgroup", lambda: True)
    monkeypatch.setattr(pids_module, "_own_pids_cgroup", no_cgroup)
    marker = workspace / "ran"
    with pytest.raises(SandboxUnavailable) as caught:
        run(bwrap, ["touch", str(marker)], workspace, writable=True)
    assert "max_processes = 256 cannot be set" in caught.value.reason
    assert "no cgroup hierarchy with the pids controller is mounted" in caught.value.reason
    assert not marker.exists()


def test_file_size_limit_stops_a_large_write(bwrap: Path, workspace: Path) -> None:
    limits = SandboxLimits(file_size_bytes=1024**2)
    argv = ["sh", "-c", f"head -c 4M /dev/zero > {workspace}/big"]
    outcome, _ = run(bwrap, argv, workspace, writable=True, limits=limits)
    assert outcome.exit_code != 0
    assert (workspace / "big").stat().st_size <= 1024**2


def test_the_private_tmp_is_bounded(bwrap: Path, workspace: Path) -> None:
    """/tmp is a tmpfs in the host's memory, outside RLIMIT_AS: it has its own size."""
    limits = SandboxLimits(tmp_bytes=8 * 1024**2)
    script = "head -c 32M /dev/zero > /tmp/big; stat -c %s /tmp/big; df -k /tmp | tail -1"
    _, stdout = run(bwrap, ["sh", "-c", script], workspace, limits=limits)
    written, df = stdout.splitlines()
    assert int(written) <= 8 * 1024**2
    assert int(df.split()[1]) == 8 * 1024  # size in KiB


def test_missing_bwrap_is_unavailable_with_a_reason() -> None:
    with pytest.raises(SandboxUnavailable) as caught:
        find_bwrap("/nonexistent/bwrap")
    assert "/nonexistent/bwrap" in caught.value.reason


def test_a_bwrap_that_cannot_start_is_unavailable_with_a_reason(tmp_path: Path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(SandboxUnavailable) as caught:
        probe(fake)
    assert caught.value.reason == (
        "user namespaces are not available: bwrap: No permissions to create new namespace"
    )


def test_a_nonexistent_bwrap_path_fails_the_probe() -> None:
    with pytest.raises(SandboxUnavailable) as caught:
        probe(Path("/nonexistent/bwrap"))
    assert caught.value.reason


def test_a_bwrap_that_could_not_be_asked_is_refused_then_asked_again(
    bwrap: Path, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --help that failed for want of a file descriptor says nothing about the
    binary: that run is refused, and the next one gets its sized /tmp."""
    alias = tmp_path / "bwrap"  # a binary not asked about yet in this process
    alias.symlink_to(bwrap)
    limits = SandboxLimits(tmp_bytes=8 * 1024**2)
    df = ["sh", "-c", "df -k /tmp | tail -1"]

    def out_of_descriptors(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    shortage = SimpleNamespace(
        run=out_of_descriptors,
        DEVNULL=subprocess.DEVNULL,
        TimeoutExpired=subprocess.TimeoutExpired,
    )
    with monkeypatch.context() as patched:
        patched.setattr(bwrap_module, "subprocess", shortage)
        with pytest.raises(SandboxUnavailable) as caught:
            run(alias, df, workspace, limits=limits)
    assert os.strerror(errno.EMFILE) in caught.value.reason
    outcome, stdout = run(alias, df, workspace, limits=limits)
    assert outcome.exit_code == 0
    assert int(stdout.split()[1]) == 8 * 1024  # size in KiB


def _fake_bwrap(path: Path, real: Path, script: str) -> Path:
    path.write_text(f'#!/bin/sh\n{script}\nexec {real} "$@"\n')
    path.chmod(0o755)
    return path


def test_a_bwrap_that_cannot_size_tmp_is_refused(
    bwrap: Path, workspace: Path, tmp_path: Path
) -> None:
    old = _fake_bwrap(
        tmp_path / "bwrap",
        bwrap,
        'if [ "$1" = --help ]; then echo "    --tmpfs DEST  Mount new tmpfs on DEST"; exit 0; fi',
    )
    with pytest.raises(SandboxUnavailable) as caught:
        run(old, ["true"], workspace)
    assert "--size" in caught.value.reason
    with pytest.raises(SandboxUnavailable):
        probe(old)


def test_a_probe_that_failed_is_tried_again(bwrap: Path, tmp_path: Path) -> None:
    """A sandbox that could not start once (no memory, too many processes for a
    moment) may start the next time: only success is remembered."""
    failing = tmp_path / "failing"
    failing.touch()
    flaky = _fake_bwrap(
        tmp_path / "bwrap",
        bwrap,
        f"if [ -e {failing} ]; then echo 'bwrap: Creating new namespace failed' >&2; exit 1; fi",
    )
    with pytest.raises(SandboxUnavailable):
        probe(flaky)
    failing.unlink()
    probe(flaky)

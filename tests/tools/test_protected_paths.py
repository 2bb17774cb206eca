"""Commands cannot read what the path guard forbids, nor touch the runtime's state."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from toolkernel.codes import ErrorCode, Status
from toolkernel.definition import ExecutionMode
from toolkernel.testing import EchoAdapter, make_kernel

DEVELOPER = """
[run]
profile = "developer"
state = "EDITING"
[[exposure]]
tools = ["*"]
"""


@pytest.fixture
def kernel(tmp_path: Path):
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (ws / "keys").mkdir()
    (ws / "keys" / "deploy.pem").write_text("-----BEGIN PRIVATE KEY-----\nabc\n")
    (ws / ".env").write_text("DATABASE_PASSWORD=hunter2\n")
    (ws / "app.py").write_text("print('hi')\n")
    built = make_kernel(ws, DEVELOPER)
    yield built
    built.close()


def run_shell(kernel, *argv: str):
    run = kernel.start_run()
    return kernel.call_sync(run, "shell.run", {"argv": list(argv)})


@pytest.mark.parametrize("secret", [".env", "keys/deploy.pem"])
def test_forbidden_files_are_unreadable_to_commands(kernel, secret):
    result = run_shell(kernel, "cat", secret)
    assert result.status is Status.FAILED
    assert "hunter2" not in str(result.structured_output)
    assert "BEGIN PRIVATE KEY" not in str(result.structured_output)


def test_the_ledger_and_artifacts_are_invisible_to_commands(kernel):
    run_shell(kernel, "true")  # the state directory exists and holds the ledger now
    listing = run_shell(kernel, "ls", "-A", ".toolkernel")
    assert listing.status is Status.SUCCEEDED
    assert listing.structured_output["stdout"]["head"] == ""
    wipe = run_shell(kernel, "sh", "-c", "rm -f .toolkernel/ledger.db; echo done")
    assert wipe.status is Status.SUCCEEDED  # it wiped an empty tmpfs, not the ledger
    assert kernel.ledger.verify().ok
    assert (kernel.config.state_dir / "ledger.db").exists()


def test_git_history_is_readable_but_not_writable(kernel):
    assert run_shell(kernel, "cat", ".git/HEAD").status is Status.SUCCEEDED
    rewrite = run_shell(kernel, "sh", "-c", "echo evil > .git/HEAD")
    assert rewrite.status is Status.FAILED
    assert (kernel.config.workspace / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"


def test_ordinary_files_stay_writable(kernel):
    result = run_shell(kernel, "sh", "-c", "echo new > made.txt")
    assert result.status is Status.SUCCEEDED
    assert (kernel.config.workspace / "made.txt").read_text() == "new\n"


@pytest.mark.parametrize("offset", [-20, -5, 0, 3, 17])
def test_a_secret_across_the_preview_edge_does_not_leak_in_part(kernel, offset):
    from toolkernel.tools.adapter import PREVIEW_BYTES

    token = "ghp_" + "Q7r8S9t0U1v2W3x4Y5z6A7b8C9d0E1f2G3h4"
    filler = PREVIEW_BYTES + offset - 4
    script = f"import sys; sys.stdout.write('x' * {filler} + ' {token} ' + 'y' * 300000)"
    result = run_shell(kernel, "python3", "-c", script)
    assert result.status is Status.SUCCEEDED
    shown = str(result.projection())
    for size in range(8, len(token)):  # no fragment long enough to matter
        assert token[-size:] not in shown
        assert token[:size] not in shown


def test_nested_repositories_and_the_policy_file_are_not_writable(kernel):
    ws = kernel.config.workspace
    (ws / "vendor" / "lib" / ".git").mkdir(parents=True)
    (ws / "vendor" / "lib" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    policy = (ws / "toolkernel.toml").read_text()
    hook = run_shell(kernel, "sh", "-c", "echo evil > vendor/lib/.git/hooks-post-checkout")
    loosen = run_shell(kernel, "sh", "-c", "echo '[policy]' >> toolkernel.toml")
    assert hook.status is Status.FAILED
    assert not (ws / "vendor" / "lib" / ".git" / "hooks-post-checkout").exists()
    assert loosen.status is Status.FAILED
    assert (ws / "toolkernel.toml").read_text() == policy


@pytest.fixture
def kernel_configured_elsewhere(tmp_path: Path):
    """No toolkernel.toml in the workspace: the policy comes from another directory."""
    from toolkernel.config import load_config
    from toolkernel.kernel import Kernel

    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "etc" / "toolkernel.toml"
    outside.parent.mkdir()
    outside.write_text(DEVELOPER)
    built = Kernel(load_config(outside, workspace=ws))
    yield built
    built.close()


@pytest.mark.parametrize(
    "script",
    [
        "echo '[policy]' > toolkernel.toml",
        "mkdir toolkernel.toml",
        "ln -s /etc/hostname toolkernel.toml",
    ],
)
def test_a_policy_file_a_command_creates_is_removed(kernel_configured_elsewhere, script):
    """The next runtime started in the workspace would read it as its policy."""
    kernel = kernel_configured_elsewhere
    ws = kernel.config.workspace
    result = run_shell(kernel, "sh", "-c", script)
    assert result.status is Status.CANCELLED
    assert str(result.error_code) == "POLICY_VIOLATION"
    assert "toolkernel.toml" in result.safe_message
    assert str(ws) not in result.safe_message
    assert not (ws / "toolkernel.toml").exists()
    assert not (ws / "toolkernel.toml").is_symlink()
    assert run_shell(kernel, "sh", "-c", "echo ok > other.toml").status is Status.SUCCEEDED


def test_a_policy_file_planted_by_a_command_that_then_times_out_is_still_reported(
    kernel_configured_elsewhere,
):
    kernel = kernel_configured_elsewhere
    ws = kernel.config.workspace
    run = kernel.start_run()
    script = "echo '[policy]' > toolkernel.toml; sleep 30"
    result = kernel.call_sync(run, "shell.run", {"argv": ["sh", "-c", script], "timeoutMs": 1000})
    assert str(result.error_code) == "POLICY_VIOLATION"
    assert not (ws / "toolkernel.toml").exists()


def test_a_planted_tree_without_write_permission_is_removed(tmp_path: Path):
    from toolkernel.tools.planted import PolicySnapshot, _grant_tree_at

    planted = tmp_path / "toolkernel.toml"
    (planted / "a" / "b").mkdir(parents=True)
    (planted / "a" / "b" / "f").write_text("x")
    for directory in (planted / "a" / "b", planted / "a", planted, tmp_path):
        directory.chmod(0o500)
    try:
        parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _grant_tree_at(parent, planted.name)  # what removal does after a permission error
        finally:
            os.close(parent)
        for directory in (planted, planted / "a", planted / "a" / "b"):
            assert directory.stat().st_mode & 0o700 == 0o700
        outcome = PolicySnapshot({planted: None}).restore()
    finally:
        tmp_path.chmod(0o700)
    assert outcome.found == (planted,)
    assert outcome.left == ()
    assert not planted.exists()


def test_a_nested_policy_file_is_not_writable(kernel):
    """A runtime started in sub/ would read sub/toolkernel.toml as its policy."""
    ws = kernel.config.workspace
    (ws / "sub").mkdir()
    (ws / "sub" / "toolkernel.toml").write_text("# sub policy\n")
    loosen = run_shell(kernel, "sh", "-c", "echo '[policy]' >> sub/toolkernel.toml")
    assert loosen.status is Status.FAILED
    assert (ws / "sub" / "toolkernel.toml").read_text() == "# sub policy\n"


STATE_IN_WORKSPACE = (
    DEVELOPER
    + """
[ledger]
path = "audit/ledger.db"
"""
)


@pytest.fixture
def kernel_with_ledger_in_workspace(tmp_path: Path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_text("print('hi')\n")
    built = make_kernel(ws, STATE_IN_WORKSPACE)
    yield built
    built.close()


def test_a_ledger_kept_in_the_workspace_is_out_of_every_tools_reach(
    kernel_with_ledger_in_workspace,
):
    kernel = kernel_with_ledger_in_workspace
    ws = kernel.config.workspace
    assert (ws / "audit" / "ledger.db").exists()
    run = kernel.start_run()
    read = kernel.call_sync(run, "file.read", {"path": "audit/ledger.db"})
    assert (read.status, str(read.error_code)) == (Status.INVALID_ARGUMENTS, "FORBIDDEN_PATH")
    diff = "--- /dev/null\n+++ b/audit/notes.txt\n@@ -0,0 +1 @@\n+x\n"
    written = kernel.call_sync(run, "file.patch", {"path": "audit/notes.txt", "diff": diff})
    assert (written.status, str(written.error_code)) == (
        Status.INVALID_ARGUMENTS,
        "FORBIDDEN_PATH",
    )
    assert not (ws / "audit" / "notes.txt").exists()
    listing = run_shell(kernel, "ls", "-A", "audit")
    assert listing.status is Status.SUCCEEDED
    assert listing.structured_output["stdout"]["head"] == ""
    assert run_shell(kernel, "cat", "app.py").structured_output["stdout"]["head"] == "print('hi')\n"
    assert kernel.ledger.verify().ok


@pytest.mark.parametrize(
    ("setting", "key"),
    [('[ledger]\npath = "ledger.db"\n', "ledger.path"), ('state_dir = "."\n', "state_dir")],
)
def test_state_placed_where_it_cannot_be_protected_is_refused(tmp_path: Path, setting, key):
    """A ledger in the workspace root (a command could plant its -journal) or the
    workspace itself as the state directory (pins, artifacts) is a config error."""
    from toolkernel.errors import ConfigError

    ws = tmp_path / "ws"
    ws.mkdir()
    with pytest.raises(ConfigError, match=key):
        make_kernel(ws, setting + DEVELOPER)
    assert not (ws / "ledger.db").exists()


@pytest.mark.parametrize(
    "script",
    [
        "mkdir -p sub && echo '[policy]' > sub/toolkernel.toml",  # a new nested one
        "mv vendor vendor2 && mkdir vendor && echo '[policy]' > vendor/toolkernel.toml",
    ],
    ids=["created", "replaced"],
)
def test_nested_policy_files_are_put_back_as_they_were(kernel, script):
    """A runtime started in a subdirectory reads the toolkernel.toml there."""
    ws = kernel.config.workspace
    (ws / "vendor").mkdir()
    (ws / "vendor" / "toolkernel.toml").write_text("# vendor policy\n")
    result = run_shell(kernel, "sh", "-c", script)
    assert str(result.error_code) == "POLICY_VIOLATION"
    assert not (ws / "sub" / "toolkernel.toml").exists()
    assert (ws / "vendor" / "toolkernel.toml").read_text() == "# vendor policy\n"
    assert str(ws) not in result.safe_message


def test_a_nested_policy_file_planted_as_a_symlink_is_removed(kernel_configured_elsewhere):
    # ripgrep skips symlinks, but a runtime started in sub/ would follow this one.
    kernel = kernel_configured_elsewhere
    ws = kernel.config.workspace
    (ws / "sub").mkdir()
    script = (
        "printf '[policy]\\nnetwork = \"allow\"\\n' > notes.txt; "
        "ln -s ../notes.txt sub/toolkernel.toml"
    )
    result = run_shell(kernel, "sh", "-c", script)
    assert str(result.error_code) == "POLICY_VIOLATION"
    assert "sub/toolkernel.toml" in result.safe_message
    assert not (ws / "sub" / "toolkernel.toml").is_symlink()
    assert (ws / "notes.txt").exists()  # only the policy file goes


def test_a_policy_file_that_was_a_symlink_before_stays_one(kernel_configured_elsewhere):
    # A team's sub/toolkernel.toml linking to a shared one is theirs: kept as it was,
    # and put back if a command points it elsewhere.
    kernel = kernel_configured_elsewhere
    ws = kernel.config.workspace
    (ws / "shared.toml").write_text("# shared\n")
    (ws / "sub").mkdir()
    (ws / "sub" / "toolkernel.toml").symlink_to("../shared.toml")
    ordinary = run_shell(kernel, "sh", "-c", "echo ok > other.txt")
    assert ordinary.status is Status.SUCCEEDED
    retarget = run_shell(kernel, "sh", "-c", "ln -sfn ../other.txt sub/toolkernel.toml")
    assert str(retarget.error_code) == "POLICY_VIOLATION"
    assert (ws / "sub" / "toolkernel.toml").readlink() == Path("../shared.toml")


def test_a_forbidden_file_cannot_be_moved_out_by_renaming_its_directory(kernel):
    """keys/ is an ordinary directory, but renamed it would carry deploy.pem to a path
    the guard does not forbid (k2/deploy.pem), readable by the next call."""
    ws = kernel.config.workspace
    moved = run_shell(kernel, "mv", "keys", "k2")
    assert moved.status is Status.FAILED
    assert (ws / "keys" / "deploy.pem").is_file()
    assert not (ws / "k2").exists()
    run = kernel.start_run()
    for path in ("k2/deploy.pem", "keys/deploy.pem"):
        read = kernel.call_sync(run, "file.read", {"path": path})
        assert read.status is not Status.SUCCEEDED
        assert "BEGIN PRIVATE KEY" not in str(read.projection())


def test_a_nested_state_directory_cannot_be_moved_out_of_reach(tmp_path: Path):
    ws = tmp_path / "ws"
    ws.mkdir()
    kernel = make_kernel(ws, 'state_dir = "var/tk"\n' + DEVELOPER)
    try:
        moved = run_shell(kernel, "sh", "-c", "mv var var2")
        assert moved.status is Status.FAILED
        assert (ws / "var" / "tk" / "ledger.db").is_file()
        assert not (ws / "var2").exists()
        assert kernel.ledger.verify().ok
        assert kernel.ledger.verify().events_checked > 0
    finally:
        kernel.close()


def test_a_submodules_git_file_is_not_writable(kernel):
    """sub/.git names the git directory git uses in sub/: pointed elsewhere, the user's
    next git command there would run hooks the model wrote."""
    ws = kernel.config.workspace
    (ws / "sub").mkdir()
    (ws / "sub" / ".git").write_text("gitdir: ../.git/modules/sub\n")
    result = run_shell(kernel, "sh", "-c", "printf 'gitdir: ../evil\\n' > sub/.git")
    assert result.status is Status.FAILED
    assert (ws / "sub" / ".git").read_text() == "gitdir: ../.git/modules/sub\n"


def test_a_directory_of_forbidden_files_is_hidden_whole(kernel):
    """Thousands of *.pem fixtures: one mount for their directory, not one per file
    (bubblewrap takes at most 9000 arguments)."""
    ws = kernel.config.workspace
    certs = ws / "tests" / "certs"
    certs.mkdir(parents=True)
    for index in range(3200):
        (certs / f"cert{index:05d}.pem").write_text("-----BEGIN PRIVATE KEY-----\nabc\n")
    (ws / "tests" / "test_tls.py").write_text("visible\n")
    listing = run_shell(kernel, "sh", "-c", "ls tests/certs | wc -l; cat tests/test_tls.py")
    assert listing.status is Status.SUCCEEDED
    assert listing.structured_output["stdout"]["head"] == "0\nvisible\n"
    assert (certs / "cert00000.pem").is_file()  # hidden from the command, not touched


def test_more_protected_paths_than_bubblewrap_takes_is_a_clear_refusal(kernel):
    """Forbidden files mixed with others cannot be hidden whole: past what bubblewrap
    accepts, the call says the sandbox is unavailable, not that `true` failed."""
    ws = kernel.config.workspace
    mixed = ws / "mixed"
    mixed.mkdir()
    (mixed / "README").write_text("visible\n")
    for index in range(2100):
        (mixed / f"k{index:05d}.pem").write_text("-")
    result = run_shell(kernel, "true")
    assert (result.status, str(result.error_code)) == (Status.DENIED, "SANDBOX_UNAVAILABLE")
    incoming = kernel.artifacts.root / ".incoming"  # where a command's output is staged
    assert [p for p in incoming.iterdir() if p.is_dir()] == []  # nothing ran: nothing kept


def test_a_directory_hidden_whole_refuses_writes_and_one_with_more_is_not_hidden_whole(kernel):
    """Hidden whole, a directory is read-only: a write there fails instead of seeming
    to work and vanishing. One that also holds what ripgrep does not list (a symlink)
    keeps it visible, its forbidden files hidden one by one."""
    ws = kernel.config.workspace
    for name in ("only", "more"):
        (ws / name).mkdir()
        (ws / name / "a.pem").write_text("-----BEGIN PRIVATE KEY-----\nabc\n")
    (ws / "more" / "notes").symlink_to("../app.py")
    write_only = run_shell(kernel, "sh", "-c", "echo x > only/serial.txt")
    write_more = run_shell(kernel, "sh", "-c", "echo x > more/serial.txt; cat more/notes")
    assert write_only.status is Status.FAILED
    assert not (ws / "only" / "serial.txt").exists()
    assert write_more.status is Status.SUCCEEDED
    assert (ws / "more" / "serial.txt").read_text() == "x\n"
    assert write_more.structured_output["stdout"]["head"] == "print('hi')\n"
    peek = run_shell(kernel, "cat", "more/a.pem")
    assert "BEGIN PRIVATE KEY" not in str(peek.projection())


def test_the_runtimes_own_environment_in_the_workspace_is_not_writable(kernel, monkeypatch):
    """A project's .venv that holds toolkernel itself: a command that replaced its
    Python or its bubblewrap would run them on the host at the next `toolkernel`."""
    import sys

    ws = kernel.config.workspace
    venv = ws / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "bwrap").write_text("#!/bin/sh\n")
    monkeypatch.setattr(sys, "prefix", str(venv))
    replace = run_shell(kernel, "sh", "-c", "echo 'evil' > .venv/bin/bwrap")
    elsewhere = run_shell(kernel, "sh", "-c", "echo fine > notes.txt")
    assert replace.status is Status.FAILED
    assert (venv / "bin" / "bwrap").read_text() == "#!/bin/sh\n"
    assert elsewhere.status is Status.SUCCEEDED


TOOL_MODULE = '''
from toolkernel import tool


@tool("team.{name}", idempotent=True)
def hello() -> str:
    """Say hello."""
    return "hello"
'''

API_DEFINITION = """
name = "team.build"
version = "1.0"
description = "Start the project's build on the build service."
executionMode = "EXTERNAL_API"
timeoutMs = 1000
idempotent = false
[permissions]
network = true
[inputSchema]
type = "object"
additionalProperties = false
"""


def create(path: str) -> dict[str, object]:
    return {"path": path, "edits": [{"search": "", "replace": "x"}]}


@pytest.fixture
def kernel_with_tool_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Tool code in the workspace: a package, a module and a definitions file."""
    ws = tmp_path / "ws"
    (ws / "tk_pkg_tools").mkdir(parents=True)
    (ws / "tk_pkg_tools" / "__init__.py").write_text(TOOL_MODULE.format(name="package"))
    (ws / "tk_file_tools.py").write_text(TOOL_MODULE.format(name="module"))
    (ws / "defs").mkdir()
    (ws / "defs" / "build.toml").write_text(API_DEFINITION)
    monkeypatch.syspath_prepend(str(ws))
    for name in ("tk_pkg_tools", "tk_file_tools"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    tools = (
        '[tools]\nmodules = ["tk_pkg_tools", "tk_file_tools"]\ndefinitions = ["defs/build.toml"]\n'
    )
    built = make_kernel(ws, DEVELOPER + tools, adapters={ExecutionMode.EXTERNAL_API: EchoAdapter()})
    assert built.registry.find("team.build") is not None
    yield built
    built.close()


@pytest.mark.parametrize(
    ("script", "path"),
    [
        ("echo 'import os' >> tk_file_tools.py", "tk_file_tools.py"),
        ("echo 'import os' > tk_pkg_tools/extra.py", "tk_pkg_tools/extra.py"),
        (
            "echo evil > __pycache__/tk_file_tools.cpython-311.pyc",
            "__pycache__/tk_file_tools.cpython-311.pyc",
        ),
        ("echo 'timeoutMs = 9' >> defs/build.toml", "defs/build.toml"),
    ],
    ids=["module", "package", "bytecode cache", "definitions"],
)
def test_tool_code_the_configuration_loads_is_not_writable(kernel_with_tool_code, script, path):
    # It runs on the host, unsandboxed, when the next runtime starts (or says what may).
    kernel = kernel_with_tool_code
    target = kernel.config.workspace / path
    before = target.read_bytes() if target.exists() else None
    result = run_shell(kernel, "sh", "-c", script)
    assert result.status is Status.FAILED
    assert (target.read_bytes() if target.exists() else None) == before
    written = kernel.call_sync(kernel.start_run(), "file.patch", create(path))
    assert (written.status, written.error_code) == (Status.DENIED, ErrorCode.PATH_DENIED)
    assert (target.read_bytes() if target.exists() else None) == before


def test_other_files_beside_tool_code_stay_writable(kernel_with_tool_code):
    kernel = kernel_with_tool_code
    assert run_shell(kernel, "sh", "-c", "echo x > defs/notes.txt").status is Status.SUCCEEDED
    written = kernel.call_sync(kernel.start_run(), "file.patch", create("notes.md"))
    assert written.status is Status.SUCCEEDED


SCOPED = DEVELOPER + '[policy]\nwrite_scope = ["src/**"]\n'


@pytest.fixture
def scoped_kernel(tmp_path: Path):
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    built = make_kernel(ws, SCOPED)
    yield built
    built.close()


@pytest.mark.parametrize("cwd", [{}, {"cwd": "."}], ids=["left out", "root"])
def test_a_command_at_the_root_writes_only_inside_the_write_scope(scoped_kernel, cwd):
    # Tests run from the root; what they write is held to the scope by the sandbox.
    ws = scoped_kernel.config.workspace
    run = scoped_kernel.start_run()
    script = "echo x > src/made.txt && echo x > top.txt"
    result = scoped_kernel.call_sync(run, "shell.run", {"argv": ["sh", "-c", script], **cwd})
    assert result.status is Status.FAILED
    assert (ws / "src" / "made.txt").read_text() == "x\n"
    assert not (ws / "top.txt").exists()


def test_a_command_writes_only_inside_the_write_scope(scoped_kernel):
    ws = scoped_kernel.config.workspace
    run = scoped_kernel.start_run()

    def shell(script: str):
        return scoped_kernel.call_sync(
            run, "shell.run", {"argv": ["sh", "-c", script], "cwd": "src"}
        )

    assert shell("echo x > inside.txt").status is Status.SUCCEEDED
    assert (ws / "src" / "inside.txt").read_text() == "x\n"
    assert shell("echo x > ../top.txt").status is Status.FAILED
    assert not (ws / "top.txt").exists()
    assert shell("mkdir ../other").status is Status.FAILED
    assert not (ws / "other").exists()


def test_a_left_out_cwd_is_judged_by_path_allow_as_the_root(tmp_path: Path):
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    with make_kernel(ws, DEVELOPER + '[policy]\npath_allow = ["/src"]\n') as kernel:
        run = kernel.start_run()
        root = kernel.call_sync(run, "shell.run", {"argv": ["true"]})
        inside = kernel.call_sync(run, "shell.run", {"argv": ["true"], "cwd": "src"})
    assert (root.status, root.error_code) == (Status.DENIED, ErrorCode.PATH_DENIED)
    assert inside.status is Status.SUCCEEDED

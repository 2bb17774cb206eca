"""Where the state may go, and what the runtime leaves there (toolkernel.state)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from toolkernel.cli import main
from toolkernel.config import CONFIG_FILENAME, Config, load_config
from toolkernel.errors import ConfigError
from toolkernel.kernel import Kernel
from toolkernel.state import check_placement


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home" / "me"
    (home / "project").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.mark.parametrize(
    ("where", "why"),
    [
        (lambda home: Path("/"), "the file system's root"),
        (lambda home: home, "the home directory"),
        (lambda home: home.parent, "it holds the home directory"),
    ],
    ids=["root", "home", "above-home"],
)
def test_a_workspace_that_holds_a_whole_system_or_home_is_refused(home, where, why):
    """Everything in the workspace is the model's to read: the root or a home directory
    would hand it every dotfile the forbidden globs do not happen to name."""
    with pytest.raises(ConfigError, match=rf"'workspace'.*{why}.*project's own directory"):
        check_placement(Config.default(where(home)))


def test_a_project_in_the_home_directory_is_a_workspace(home):
    check_placement(Config.default(home / "project"))


def test_the_cli_refuses_a_home_workspace_as_a_configuration_error(home, capsys, monkeypatch):
    (home / CONFIG_FILENAME).write_text('workspace = "~"\n')
    monkeypatch.chdir(home)
    assert main(["config", "check"]) == 2
    err = capsys.readouterr().err
    assert "'workspace'" in err
    assert "home directory" in err
    assert not (home / ".toolkernel").exists()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    (root / "src" / "stats.py").write_text("MEAN = 1\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def test_a_state_dir_that_already_holds_other_files_is_refused(repo):
    (repo / CONFIG_FILENAME).write_text('state_dir = "src"\n')
    with pytest.raises(ConfigError, match=r"'state_dir'.*'src'.*stats\.py.*directory of its own"):
        check_placement(load_config(repo / CONFIG_FILENAME))


@pytest.mark.parametrize("held", [[], ["ledger.db"], ["artifacts/", "mcp-pins.json"]])
def test_a_state_dir_that_is_empty_or_holds_the_runtimes_files_is_taken(repo, held):
    """An earlier release left no marker: its ledger, artifacts and pins say whose it is."""
    state = repo / "state"
    state.mkdir()
    for name in held:
        if name.endswith("/"):
            (state / name).mkdir()
        else:
            (state / name).write_text("")
    (repo / CONFIG_FILENAME).write_text('state_dir = "state"\n')
    check_placement(load_config(repo / CONFIG_FILENAME))


def test_the_state_is_kept_out_of_git(repo):
    """Artifacts hold unredacted output: `git add -A` must not commit them."""
    with Kernel(load_config(workspace=repo), workspace_tools=False) as kernel:
        run = kernel.start_run()
        kernel.expose(run)
    assert (repo / ".toolkernel" / "ledger.db").exists()
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert ".toolkernel" not in status
    assert "src/stats.py" in status  # the check sees untracked files at all
    # A second kernel on the same state finds its own directory, marker and all.
    check_placement(load_config(workspace=repo))
    Kernel(load_config(workspace=repo), workspace_tools=False).close()

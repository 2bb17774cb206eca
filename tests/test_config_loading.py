"""What ``toolkernel.toml`` names is taken as the file means it, or refused naming the
key: globs spelt with ``./``, the binaries and working directories it points at, ``~``,
profile names, variable names and numbers the system cannot take."""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkernel.codes import ErrorCode, Status
from toolkernel.config import CONFIG_FILENAME, Config, load_config
from toolkernel.errors import ConfigError, UsageError
from toolkernel.globs import compile_globs, workspace_pattern
from toolkernel.kernel import Kernel
from toolkernel.mcp import McpBridge
from toolkernel.pathguard import PathGuard, PathViolation
from toolkernel.state import check_placement
from toolkernel.testing import make_kernel
from toolkernel.tools.search import find_rg

FIXTURE_SERVER = Path(__file__).resolve().parent / "mcp" / "fixtures" / "fixture_server.py"

# key -> the TOML that sets that glob list to {patterns}
GLOB_KEYS = {
    "forbidden_paths": "forbidden_paths = {patterns}\n",
    "extra_forbidden_paths": "extra_forbidden_paths = {patterns}\n",
    "policy.write_scope": "[policy]\nwrite_scope = {patterns}\n",
    "policy.path_allow": "[policy]\npath_allow = {patterns}\n",
    "policy.path_deny": "[policy]\npath_deny = {patterns}\n",
}
WRITER = """
[run]
profile = "workspace-write"
state = "EDITING"
[[exposure]]
tools = ["*"]
"""
SPELLINGS = ["./secrets/**", "././secrets/**", ".//secrets/**", "secrets//**", "./secrets"]


@pytest.fixture
def repo(workspace: Path) -> Path:
    """The workspace, with a secret at the root and a namesake one level down."""
    (workspace / "secrets").mkdir()
    (workspace / "secrets" / "prod.txt").write_text("db_password = 'hunter2-prod'\n")
    (workspace / "vendor" / "secrets").mkdir(parents=True)
    (workspace / "vendor" / "secrets" / "note.txt").write_text("db_password is documented\n")
    return workspace


def write_config(directory: Path, text: str) -> Path:
    path = directory / CONFIG_FILENAME
    path.write_text(text, encoding="utf-8")
    return path


def load(directory: Path, text: str, **kwargs) -> Config:
    return load_config(write_config(directory, text), **kwargs)


def call(kernel, name: str, arguments: dict):
    return kernel.call_sync(kernel.start_run(), name, arguments)


# --- globs: "./", "//", absolute ------------------------------------------------------


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_dot_slash_forbidden_glob_hides_the_file_from_read_and_search(repo, spelling):
    with make_kernel(repo, f"extra_forbidden_paths = [{spelling!r}]\n") as kernel:
        read = call(kernel, "file.read", {"path": "secrets/prod.txt"})
        searched = call(kernel, "repo.search", {"query": "db_password"})
    assert (read.status, read.error_code) == (Status.INVALID_ARGUMENTS, ErrorCode.FORBIDDEN_PATH)
    assert searched.status is Status.SUCCEEDED
    paths = [match["path"] for match in searched.structured_output["matches"]]
    assert paths == ["vendor/secrets/note.txt"]  # anchored at the root, as "./" says


def test_a_dot_slash_pattern_replacing_the_defaults_is_obeyed(repo):
    with make_kernel(repo, "forbidden_paths = ['./secrets/', '.env']\n") as kernel:
        read = call(kernel, "file.read", {"path": "secrets/prod.txt"})
        searched = call(kernel, "repo.search", {"query": "hunter2"})
    assert read.error_code is ErrorCode.FORBIDDEN_PATH
    assert searched.structured_output["totalMatches"] == 0


def test_a_dot_slash_path_deny_refuses_the_read(repo):
    with make_kernel(repo, "[policy]\npath_deny = ['./secrets/**']\n") as kernel:
        denied = call(kernel, "file.read", {"path": "secrets/prod.txt"})
        allowed = call(kernel, "file.read", {"path": "vendor/secrets/note.txt"})
    assert (denied.status, denied.error_code) == (Status.DENIED, ErrorCode.PATH_DENIED)
    assert allowed.status is Status.SUCCEEDED


def test_a_dot_slash_path_allow_admits_what_it_names(repo):
    with make_kernel(repo, "[policy]\npath_allow = ['./src/**']\n") as kernel:
        allowed = call(kernel, "file.read", {"path": "src/app.py"})
        denied = call(kernel, "file.read", {"path": "docs/notes.md"})
    assert allowed.status is Status.SUCCEEDED
    assert denied.error_code is ErrorCode.PATH_DENIED


def test_a_dot_slash_write_scope_admits_writes_inside_it(repo):
    create = [{"search": "", "replace": "x = 1\n"}]
    with make_kernel(repo, WRITER + "[policy]\nwrite_scope = ['./src/**']\n") as kernel:
        inside = call(kernel, "file.patch", {"path": "src/new.py", "edits": create})
        outside = call(kernel, "file.patch", {"path": "docs/new.py", "edits": create})
    assert inside.status is Status.SUCCEEDED
    assert (repo / "src" / "new.py").read_text() == "x = 1\n"
    assert outside.error_code is ErrorCode.WRITE_SCOPE_DENIED


@pytest.mark.parametrize("key", GLOB_KEYS)
@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("../outside/**", "'..'"),
        ("src/../secrets", "'..'"),
        ("./", "the workspace root itself"),
    ],
)
def test_a_pattern_no_workspace_path_can_match_is_refused_naming_key_and_index(
    workspace, key, pattern, why
):
    text = GLOB_KEYS[key].format(patterns=f"['docs/**', '{pattern}']")
    with pytest.raises(ConfigError, match=re.escape(f"key '{key}.1'")) as refused:
        load(workspace, text)
    assert why in str(refused.value)
    assert "not a workspace pattern" in str(refused.value)


def _loaded(config: Config, key: str) -> tuple[str, ...]:
    return tuple(
        {
            "forbidden_paths": config.forbidden_paths,
            "extra_forbidden_paths": config.forbidden_paths,
            "policy.write_scope": config.policy.write_scope,
            "policy.path_allow": config.policy.path_allow,
            "policy.path_deny": config.policy.path_deny,
        }[key]
    )


@pytest.mark.parametrize("key", GLOB_KEYS)
@pytest.mark.parametrize(
    ("pattern", "loaded"),
    [("/build", "/build"), ("/src/**", "src/**"), ("//secrets", "/secrets"), ("/*.md", "/*.md")],
)
def test_a_leading_slash_anchors_as_in_gitignore(workspace, key, pattern, loaded):
    config = load(workspace, GLOB_KEYS[key].format(patterns=f"['{pattern}']"))
    assert loaded in _loaded(config, key)


@pytest.mark.parametrize("key", GLOB_KEYS)
def test_a_host_path_inside_the_workspace_is_read_as_its_workspace_path(workspace, key):
    host = f"{workspace.resolve()}/secrets/**"
    config = load(workspace, GLOB_KEYS[key].format(patterns=f"['{host}']"))
    assert "secrets/**" in _loaded(config, key)


@pytest.mark.parametrize("key", GLOB_KEYS)
def test_every_glob_key_is_loaded_in_the_spelling_that_matches(workspace, key):
    config = load(workspace, GLOB_KEYS[key].format(patterns="['./secrets/**', 'a//b/', '*.pem']"))
    loaded = _loaded(config, key)[-3:]
    assert loaded == ("secrets/**", "a/b", "*.pem")
    assert compile_globs(loaded).matches("secrets/prod.txt")


_SEGMENTS = st.sampled_from(["a", "b", "ab", "*", "a*", "?", "**"])
_SPELT = st.lists(st.one_of(_SEGMENTS, st.just("."), st.just("")), min_size=1, max_size=5).filter(
    lambda parts: parts[0] != "" and any(p not in (".", "") for p in parts)
)


@given(parts=_SPELT, trailing=st.booleans(), path=st.lists(_SEGMENTS, min_size=1, max_size=4))
def test_a_pattern_spelt_with_dots_and_doubled_slashes_matches_as_its_plain_form(
    parts, trailing, path
):
    spelt = "/".join(parts) + ("/" if trailing else "")
    plain = [p for p in parts if p not in (".", "")]
    # As in .gitignore, a "/" before the end anchors the pattern at the root, whatever
    # "." or empty segments it separates.
    anchored = "/" in spelt.rstrip("/")
    expected = compile_globs([("/" if anchored else "") + "/".join(plain)])
    path_text = "/".join(p.replace("*", "x").replace("?", "q") for p in path)
    assert compile_globs([workspace_pattern(spelt)]).matches(path_text) == expected.matches(
        path_text
    )


@given(st.text(alphabet="ab*./", min_size=1, max_size=10))
def test_a_loaded_pattern_has_only_plain_segments(text):
    segments = text.split("/")
    try:
        normalized = workspace_pattern(text)
    except UsageError:
        assert ".." in segments or set(segments) <= {"", "."}
        return
    inner = normalized.removeprefix("/").split("/")
    assert all(segment not in ("", ".", "..") for segment in inner)
    compile_globs([normalized])


# Files of a small tree: no hidden names, which ripgrep would skip on its own.
_TREE = ("a/b", "a/ab", "b/a", "b/b/a", "ab", "ba/a/b", "ba/ab")


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    for name in _TREE:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x\n")
    return root


@settings(max_examples=120, deadline=None)
@given(parts=_SPELT, trailing=st.booleans())
def test_ripgrep_excludes_exactly_what_the_guard_forbids_for_a_loaded_pattern(
    tree, parts, trailing
):
    # repo.search hands the forbidden globs to ripgrep: after loading, both must read a
    # "./"-spelt pattern alike, or a search would show what file.read refuses.
    pattern = workspace_pattern("/".join(parts) + ("/" if trailing else ""))
    listed = subprocess.run(
        [find_rg(), "--files", "--no-config", "--no-require-git", f"--iglob=!{pattern}", "."],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert listed.returncode in (0, 1), listed.stderr
    kept = {line.removeprefix("./") for line in listed.stdout.splitlines()}
    forbidden = compile_globs([pattern])
    assert set(_TREE) - kept == {name for name in _TREE if forbidden.matches(name)}, pattern


# --- [[mcp.servers]] cwd --------------------------------------------------------------

SERVER = '[[mcp.servers]]\nname = "fx"\ncommand = ["{python}", "{server}", "--files"]\n'


def server_table(extra: str = "") -> str:
    return SERVER.format(python=sys.executable, server=FIXTURE_SERVER) + extra


def test_a_server_without_cwd_runs_in_the_workspace_not_our_cwd(workspace, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = load(elsewhere, server_table(), workspace=workspace)
    [server] = config.mcp_servers
    assert server.cwd == workspace.resolve()


def test_a_relative_cwd_is_taken_from_the_workspace(workspace, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load(elsewhere, server_table('cwd = "src"\n'), workspace=workspace)
    [server] = config.mcp_servers
    assert server.cwd == workspace.resolve() / "src"


@pytest.mark.anyio
async def test_a_bridged_server_started_elsewhere_reads_the_workspace(
    workspace, tmp_path, monkeypatch
):
    (workspace / "marker.txt").write_text("WORKSPACE")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "marker.txt").write_text("ELSEWHERE")
    monkeypatch.chdir(elsewhere)
    config = server_table('tools = ["peek"]\n') + (
        '[run]\nprofile = "full"\n[policy]\nnetwork = "allow"\n'
        '[policy.approval]\nexternal = "allow"\ndestructive = "allow"\n'
        '[[exposure]]\ntools = ["*"]\n'
    )
    with make_kernel(workspace, config, workspace_tools=False) as kernel:
        run = kernel.start_run()
        with anyio.fail_after(30):
            async with McpBridge(kernel, kernel.config.mcp_servers) as bridge:
                await bridge.connect_all(run)
                result = await kernel.call(run, "fx.peek", {"path": "marker.txt"})
    assert result.status is Status.SUCCEEDED
    assert "read: WORKSPACE" in str(result.structured_output)


# --- ~ in every path key --------------------------------------------------------------


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    (home / "project").mkdir(parents=True)
    (home / "bin").mkdir()
    shutil.copy(find_rg(), home / "bin" / "rg")
    monkeypatch.setenv("HOME", str(home))
    return home


def test_a_tilde_in_the_workspace_is_the_home_directory(tmp_path, home):
    config = load(tmp_path, 'workspace = "~/project"\n')
    assert config.workspace == home.resolve() / "project"


def test_a_tilde_in_a_servers_cwd_is_the_home_directory(workspace, home):
    [server] = load(workspace, server_table('cwd = "~/project"\n')).mcp_servers
    assert server.cwd == home / "project"


def test_a_tilde_in_a_configured_binary_is_the_home_directory(workspace, home):
    config = load(workspace, '[sandbox]\nrg = "~/bin/rg"\n')
    assert config.sandbox["rg"] == str(home / "bin" / "rg")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('workspace = "~nosuchuser_toolkernel/x"\n', "workspace"),
        (server_table('cwd = "~nosuchuser_toolkernel/x"\n'), "mcp.servers[0].cwd"),
        ('[sandbox]\nbwrap = "~nosuchuser_toolkernel/bwrap"\n', "sandbox.bwrap"),
    ],
)
def test_the_home_of_an_unknown_user_is_refused_naming_the_key(workspace, text, key):
    with pytest.raises(ConfigError, match=re.escape(f"key '{key}'")):
        load(workspace, text)


# --- the workspace key ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "why"), [("notadir.txt", "not a directory"), ("gone", "no such")]
)
def test_a_workspace_that_is_no_directory_is_named_not_the_state_dir(tmp_path, value, why):
    (tmp_path / "notadir.txt").write_text("a file\n")
    with pytest.raises(ConfigError, match=r"key 'workspace': .*" + why) as refused:
        load(tmp_path, f'workspace = "{value}"\n')
    assert "state_dir" not in str(refused.value)


def test_a_workspace_option_that_is_a_file_is_named(tmp_path):
    (tmp_path / "notadir.txt").write_text("a file\n")
    with pytest.raises(ConfigError, match=r"^workspace: .*not a directory"):
        load_config(workspace=tmp_path / "notadir.txt")


# --- [sandbox] bwrap and rg -----------------------------------------------------------


@pytest.fixture
def configured_elsewhere(tmp_path: Path) -> Path:
    """A configuration directory apart from the workspace, with ripgrep in bin/."""
    directory = tmp_path / "conf"
    (directory / "bin").mkdir(parents=True)
    (directory / "bin" / "rg").symlink_to(find_rg())
    return directory


def test_a_relative_binary_is_taken_from_the_files_directory(
    configured_elsewhere, workspace, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # where "bin/rg" is not
    path = write_config(configured_elsewhere, '[sandbox]\nrg = "bin/rg"\n')
    config = load_config(path, workspace=workspace)
    assert config.sandbox["rg"] == str(configured_elsewhere / "bin" / "rg")
    with Kernel(config) as kernel:
        searched = call(kernel, "repo.search", {"query": "hello"})
    assert searched.status is Status.SUCCEEDED
    assert searched.structured_output["totalMatches"] == 1


@pytest.mark.parametrize("name", ["bwrap", "rg"])
@pytest.mark.parametrize("value", ["bin/missing", "bin", "bin/plain.txt", "no-such-binary-tk"])
def test_a_configured_binary_that_is_not_an_executable_file_is_refused(
    configured_elsewhere, workspace, name, value
):
    (configured_elsewhere / "bin" / "plain.txt").write_text("not a program\n")
    path = write_config(configured_elsewhere, f'[sandbox]\n{name} = "{value}"\n')
    with pytest.raises(ConfigError, match=re.escape(f"key 'sandbox.{name}'")) as refused:
        load_config(path, workspace=workspace)
    assert "is not an executable file" in str(refused.value)


@pytest.mark.parametrize("name", ["bwrap", "rg"])
@pytest.mark.parametrize("how", ["relative", "absolute", "linked from outside", "on PATH"])
def test_a_configured_binary_in_the_workspace_is_refused(
    workspace, tmp_path, monkeypatch, name, how
):
    """A sandboxed command may write the workspace: it replaced tools/bwrap with a
    script, which the next start of the runtime ran on the host."""
    (workspace / "tools").mkdir()
    (workspace / "tools" / name).symlink_to(find_rg())
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / name).symlink_to(workspace / "tools" / name)
    monkeypatch.setenv("PATH", str(workspace / "tools"))
    value = {
        "relative": f"tools/{name}",
        "absolute": str(workspace / "tools" / name),
        "linked from outside": str(outside / name),
        "on PATH": name,
    }[how]
    with pytest.raises(ConfigError, match=re.escape(f"key 'sandbox.{name}'")) as refused:
        load(workspace, f'[sandbox]\n{name} = "{value}"\n')
    assert "is in the workspace" in str(refused.value)


def test_a_bare_binary_name_is_looked_up_on_path(workspace, configured_elsewhere, monkeypatch):
    monkeypatch.setenv("PATH", str(configured_elsewhere / "bin"))
    assert load(workspace, '[sandbox]\nrg = "rg"\n').sandbox["rg"] == "rg"


# --- profiles -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (
            '[[policy.rules]]\ntools = ["file.read"]\naction = "deny"\n'
            'profiles = ["read-only", "read-onyl"]\n',
            "policy.rules.0.profiles.1",
        ),
        ('[[exposure]]\ntools = ["*"]\nprofiles = ["developr"]\n', "exposure.0.profiles.0"),
    ],
)
def test_a_misspelt_profile_is_refused_naming_the_key(workspace, text, key):
    with pytest.raises(ConfigError, match=re.escape(f"key '{key}': no profile named")):
        load(workspace, text)


def test_a_defined_profile_may_be_named_in_rules_and_exposure(workspace):
    config = load(
        workspace,
        "[policy.profiles.auditor]\nread_workspace = true\n"
        '[[policy.rules]]\ntools = ["file.read"]\naction = "deny"\nprofiles = ["auditor"]\n'
        '[[exposure]]\ntools = ["*"]\nprofiles = ["auditor"]\n',
    )
    assert config.policy.rules[0].profiles == frozenset({"auditor"})
    assert config.exposure[0].profiles == frozenset({"auditor"})


@pytest.mark.parametrize("section", ["exposure", "policy.rules"])
@pytest.mark.parametrize("field", ["tools", "states", "profiles", "verification"])
def test_an_empty_list_that_no_call_could_match_is_refused(workspace, section, field):
    fields = {"tools": '["*"]', field: "[]"}
    if section == "policy.rules":
        fields["action"] = '"deny"'
    text = f"[[{section}]]\n" + "".join(f"{k} = {v}\n" for k, v in fields.items())
    with pytest.raises(ConfigError, match=re.escape(f"key '{section}.0.{field}'")):
        load(workspace, text)


# --- variable names -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["A=B", "", "1A", "A B", "A\\nB", "Ä"])
@pytest.mark.parametrize(
    ("table", "key"),
    [
        ("[sandbox.env]\n", "sandbox.env"),
        (server_table() + "[mcp.servers.env]\n", "mcp.servers.0.env"),
    ],
)
def test_an_environment_name_no_process_can_have_is_refused(workspace, name, table, key):
    with pytest.raises(ConfigError, match=re.escape(f"key '{key}'")):
        load(workspace, f'{table}"{name}" = "x"\n')


@pytest.mark.parametrize("key", ["env_allow", "secret_env"])
def test_a_passed_variable_name_must_be_one_too(workspace, key):
    with pytest.raises(ConfigError, match=re.escape(f"key 'sandbox.{key}.0'")):
        load(workspace, f'[sandbox]\n{key} = ["A=B"]\n')


def test_ordinary_variable_names_are_accepted(workspace):
    config = load(workspace, '[sandbox.env]\nLANG = "C.UTF-8"\n_private_1 = "x"\n')
    assert config.sandbox["env"] == {"LANG": "C.UTF-8", "_private_1": "x"}


# --- numbers --------------------------------------------------------------------------

RLIM_MAX = 2**63 - 1
SAFE = 2**53 - 1
# key -> (the TOML that sets it to {value}, its largest value)
NUMBERS = {
    "sandbox.limits.cpu_seconds": ("[sandbox.limits]\ncpu_seconds = {value}\n", 86_400),
    "sandbox.limits.memory_bytes": ("[sandbox.limits]\nmemory_bytes = {value}\n", RLIM_MAX),
    "sandbox.limits.max_processes": ("[sandbox.limits]\nmax_processes = {value}\n", 4_194_304),
    "sandbox.limits.max_output_bytes": ("[sandbox.limits]\nmax_output_bytes = {value}\n", RLIM_MAX),
    "sandbox.limits.file_size_bytes": ("[sandbox.limits]\nfile_size_bytes = {value}\n", RLIM_MAX),
    "sandbox.limits.tmp_bytes": ("[sandbox.limits]\ntmp_bytes = {value}\n", RLIM_MAX),
    "budget.max_cost": ("[budget]\nmax_cost = {value}\n", SAFE),
    "budget.max_calls": ("[budget]\nmax_calls = {value}\n", SAFE),
    "budget.default_cost": ("[budget]\ndefault_cost = {value}\n", SAFE),
    "budget.costs.x": ("[budget]\ncosts = {{ x = {value} }}\n", SAFE),
    "rate_limits.x.calls": ("[rate_limits.x]\ncalls = {value}\nper_seconds = 1\n", 1_000_000),
    "rate_limits.x.per_seconds": (
        "[rate_limits.x]\ncalls = 1\nper_seconds = {value}\n",
        31_622_400,
    ),
    "max_argument_bytes": ("max_argument_bytes = {value}\n", 16_777_216),
    "concurrency.max_parallel_reads": ("[concurrency]\nmax_parallel_reads = {value}\n", 64),
    "mcp.servers.0.timeout_ms": (server_table("timeout_ms = {value}\n"), 3_600_000),
    "mcp.servers.0.start_timeout_ms": (server_table("start_timeout_ms = {value}\n"), 3_600_000),
}


@pytest.mark.parametrize("key", NUMBERS)
@pytest.mark.parametrize("past", ["just", "far"])
def test_a_number_past_its_maximum_is_refused_naming_the_key(workspace, key, past):
    text, largest = NUMBERS[key]
    value = largest + 1 if past == "just" else 10**30
    with pytest.raises(ConfigError, match=re.escape(f"key '{key}'")) as refused:
        load(workspace, text.format(value=value))
    assert "maximum" in str(refused.value)


def test_every_number_in_the_schema_has_a_maximum():
    from toolkernel.config import CONFIG_SCHEMA

    def numbers(node, where):
        if isinstance(node, dict):
            if node.get("type") in ("integer", "number"):
                yield where, node
            for key, value in node.items():
                yield from numbers(value, f"{where}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                yield from numbers(value, f"{where}/{index}")

    found = dict(numbers(CONFIG_SCHEMA, ""))
    assert len(found) >= len(NUMBERS)
    assert [where for where, node in found.items() if "maximum" not in node] == []


def test_the_largest_limits_below_the_hard_limits_still_run_a_command(workspace):
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    processes = 4_194_304 if hard == resource.RLIM_INFINITY else min(hard, 4_194_304)
    limits = (
        f"[sandbox.limits]\nmemory_bytes = {RLIM_MAX}\nfile_size_bytes = {RLIM_MAX}\n"
        f"tmp_bytes = {RLIM_MAX}\nmax_output_bytes = {RLIM_MAX}\ncpu_seconds = 86400\n"
        f"max_processes = {processes}\n"
    )
    with make_kernel(workspace, WRITER.replace("workspace-write", "developer") + limits) as kernel:
        result = call(kernel, "shell.run", {"argv": ["true"]})
    assert result.status is Status.SUCCEEDED, result.safe_message


@pytest.mark.skipif(
    resource.getrlimit(resource.RLIMIT_NPROC)[1] in (resource.RLIM_INFINITY, 0)
    or resource.getrlimit(resource.RLIMIT_NPROC)[1] >= 4_194_304,
    reason="no hard process limit below the schema's maximum here",
)
def test_a_limit_above_the_hard_limit_here_is_refused_naming_the_key(workspace):
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    with pytest.raises(ConfigError, match=re.escape("key 'sandbox.limits.max_processes'")) as e:
        load(workspace, f"[sandbox.limits]\nmax_processes = {hard + 1}\n")
    assert str(hard) in str(e.value)


def test_the_guard_of_a_loaded_config_forbids_the_dot_slash_pattern(repo):
    config = load(repo, "extra_forbidden_paths = ['./secrets']\n")
    guard = PathGuard(config.workspace, forbidden=config.forbidden_paths)
    refused = guard.check("secrets/prod.txt")
    assert isinstance(refused, PathViolation)
    assert refused.code is ErrorCode.FORBIDDEN_PATH
    assert not isinstance(guard.check("vendor/secrets/note.txt"), PathViolation)


@pytest.mark.parametrize("path", [".", "/tmp", ".toolkernel"])
def test_a_ledger_path_that_is_a_directory_is_refused_naming_the_key(
    tmp_path: Path, path: str
) -> None:
    (tmp_path / ".toolkernel").mkdir()
    (tmp_path / "toolkernel.toml").write_text(f'[ledger]\npath = "{path}"\n')
    with pytest.raises(ConfigError, match=r"'ledger\.path': .* is a directory"):
        check_placement(load_config(workspace=tmp_path))


def test_a_configuration_saved_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    (tmp_path / CONFIG_FILENAME).write_bytes(b'\xef\xbb\xbf[run]\nstate = "EDITING"\n')
    assert load_config(tmp_path / CONFIG_FILENAME).run_state == "EDITING"


# --- what a refusal names: every allowed value, the keys a table takes ------------------


@pytest.mark.parametrize(
    ("text", "key", "options"),
    [
        ('[run]\nstate = "PLAN"\n', "run.state", ["PLANNING", "EXPLORING", "COMPLETED"]),
        (
            '[[exposure]]\ntools = ["*"]\nstates = ["PLAN"]\n',
            "exposure.0.states.0",
            ["PLANNING", "REVIEWING", "COMPLETED"],
        ),
        ('[policy.approval]\nmutating = "never"\n', "policy.approval.mutating", ["deny", "audit"]),
        ('[ledger]\ncommit = "batch"\n', "ledger.commit", ["each", "group"]),
    ],
)
def test_a_value_outside_its_choices_is_refused_naming_every_choice(workspace, text, key, options):
    with pytest.raises(ConfigError, match=re.escape(f"key '{key}': ")) as refused:
        load(workspace, text)
    message = str(refused.value)
    assert "other candidates" not in message
    for option in options:
        assert f'"{option}"' in message


@pytest.mark.parametrize(
    ("text", "key", "known"),
    [
        ('[sandbox]\nnetwork = "deny"\n', "sandbox.network", ["bwrap", "limits", "secret_env"]),
        ('[ledger]\nfile = "x.db"\n', "ledger.file", ["path", "backend", "commit"]),
        ('stat = "EDITING"\n', "stat", ["workspace", "state_dir", "run"]),
    ],
)
def test_an_unknown_key_is_refused_naming_the_keys_its_table_takes(workspace, text, key, known):
    with pytest.raises(ConfigError, match=re.escape(f"key '{key}': unknown key")) as refused:
        load(workspace, text)
    message = str(refused.value)
    for name in known:
        assert f"'{name}'" in message


@pytest.mark.parametrize(
    ("text", "bound"),
    [
        ("", 2048 * 1024 * 1024),
        ("[artifacts]\nmax_mib = 64\n", 64 * 1024 * 1024),
        ("[artifacts]\nmax_mib = 0\n", None),
    ],
)
def test_the_artifact_store_is_bounded_unless_told_to_keep_everything(workspace, text, bound):
    assert load(workspace, text).artifacts_max_bytes == bound

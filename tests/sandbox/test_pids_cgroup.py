"""Finding where a root command's pids cgroup goes: /proc/self/mountinfo and cgroup."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolkernel.sandbox import SandboxLimits, SandboxSpec, run_sandboxed
from toolkernel.sandbox import process as process_module
from toolkernel.sandbox.pids import (
    PidsCgroup,
    _own_paths,
    _own_pids_cgroup,
    _pids_mounts,
    _unescape,
    needs_pids_cgroup,
)

MOUNTINFO_V1 = """\
22 1 0:21 / / rw,relatime - ext4 /dev/vda rw
30 22 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
38 30 0:34 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 30 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""

MOUNTINFO_V2 = """\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw
29 22 0:25 /ci\\040jobs /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate
"""


def test_v1_s_pids_hierarchy_comes_before_the_unified_one() -> None:
    assert _pids_mounts(MOUNTINFO_V1) == [
        ("/", "/sys/fs/cgroup/pids", "v1"),
        ("/", "/sys/fs/cgroup/unified", "v2"),
    ]


def test_v2_mounts_are_read_with_their_escaped_root_and_optional_fields() -> None:
    assert _pids_mounts(MOUNTINFO_V2) == [("/ci jobs", "/sys/fs/cgroup", "v2")]


def test_the_process_s_own_paths_per_version() -> None:
    text = "9:name=systemd:/\n8:pids:/jobs/a\n4:memory:/x\n0::/user.slice/a.scope\n"
    assert _own_paths(text) == {"v1": "/jobs/a", "v2": "/user.slice/a.scope"}
    assert _own_paths("1:cpu,pids:/p\n") == {"v1": "/p"}
    assert _own_paths("garbage\n\n0::\n") == {"v2": ""}


def _escape(path: str) -> str:
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_an_escaped_mountinfo_path_reads_back_as_it_was(path: str) -> None:
    assert _unescape(_escape(path)) == path


FORK_UNTIL_REFUSED = """
import os, time
started = 0
for _ in range(120):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    started += 1
print(started)
"""


@pytest.mark.parametrize(
    ("unsandboxed", "prlimit"),
    [(False, True), (True, True), (True, False)],
    ids=["sandboxed", "unsandboxed", "unsandboxed-without-prlimit"],
)
def test_max_processes_holds_whoever_runs_the_command(
    bwrap: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unsandboxed: bool, prlimit: bool
) -> None:
    """Root is exempt from RLIMIT_NPROC; a pids cgroup holds the ceiling for it, joined
    before the command runs (unsandboxed: first thing, by a shell or the trampoline)."""
    if not prlimit:
        which = process_module.shutil.which
        monkeypatch.setattr(
            process_module.shutil,
            "which",
            lambda name, *a, **k: None if name == "prlimit" else which(name, *a, **k),
        )
    spec = SandboxSpec(
        workspace=tmp_path,
        writable=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        limits=SandboxLimits(max_processes=24),
    )

    async def main() -> int:
        outcome = await run_sandboxed(
            [sys.executable, "-c", FORK_UNTIL_REFUSED],
            spec,
            bwrap=bwrap,
            timeout_s=30,
            output_dir=tmp_path / f"out-{uuid.uuid4().hex}",
            unsandboxed=unsandboxed,
        )
        assert outcome.exit_code == 0, outcome.stderr_path.read_text()
        return int(outcome.stdout_path.read_text())

    assert 0 < anyio.run(main) < 24
    if os.getuid() == 0:  # the command's cgroup went with it
        parent = _own_pids_cgroup()
        assert not [path for path in parent.iterdir() if path.name.startswith("toolkernel-")]


def test_the_empty_cgroup_of_a_runtime_that_is_gone_is_swept() -> None:
    """A runtime killed mid-command leaves its cgroup; the next command removes it."""
    if not needs_pids_cgroup():
        assert os.getuid() != 0  # RLIMIT_NPROC binds: no cgroups are made
        return
    gone = subprocess.Popen(["true"])
    gone.wait()
    parent = _own_pids_cgroup()
    leftover = parent / f"toolkernel-{gone.pid}-0badc0de"
    leftover.mkdir()
    mine = parent / f"toolkernel-{os.getpid()}-0badc0de"  # a live runtime's: kept
    mine.mkdir()
    try:
        PidsCgroup.create(8).remove()
        assert not leftover.exists()
        assert mine.exists()
    finally:
        for path in (leftover, mine):
            if path.exists():
                path.rmdir()

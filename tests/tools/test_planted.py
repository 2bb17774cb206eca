"""PolicySnapshot.restore puts policy files back without ever acting outside the
workspace, whatever a sandboxed process left in the way (symlinked directories, files
where directories were), and keeps what it takes away in the quarantine folder."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkernel.tools.adapter import config_files
from toolkernel.tools.planted import PolicySnapshot

POLICY = b"# this workspace's sub policy\n"
OTHER = b"# ANOTHER PROJECT'S POLICY\n"


def layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    ws = (tmp_path / "ws").resolve()
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "toolkernel.toml").write_bytes(POLICY)
    outside = tmp_path / "other-project"
    outside.mkdir()
    (outside / "toolkernel.toml").write_bytes(OTHER)
    return ws, outside, tmp_path / "quarantine"


def take(ws: Path, quarantine: Path | None = None) -> PolicySnapshot:
    return PolicySnapshot.take(
        frozenset({ws / "toolkernel.toml"}), ws, config_files(ws), quarantine=quarantine
    )


def tree(root: Path) -> dict[str, bytes | str]:
    """Everything under ``root``, links as their targets, without following them."""
    seen: dict[str, bytes | str] = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(base, name)
            key = path.relative_to(root).as_posix()
            if path.is_symlink():
                seen[key] = f"-> {path.readlink()}"
            elif path.is_file():
                seen[key] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                seen[key] = "dir"
    return seen


def test_a_directory_swapped_for_a_symlink_out_is_not_followed(tmp_path: Path) -> None:
    ws, outside, quarantine = layout(tmp_path)
    snapshot = take(ws, quarantine)
    (ws / "sub").rename(ws / "sub.old")
    (ws / "sub").symlink_to(outside)

    planted = snapshot.restore(config_files(ws))

    assert (outside / "toolkernel.toml").read_bytes() == OTHER
    assert not (ws / "sub").is_symlink()
    assert (ws / "sub" / "toolkernel.toml").read_bytes() == POLICY
    assert ws / "sub" / "toolkernel.toml" in planted.found
    assert planted.left == ()
    assert any(kept.name.endswith("sub") for kept in planted.kept)  # the link, kept


def test_a_directory_named_like_the_policy_outside_is_not_removed(tmp_path: Path) -> None:
    ws, _, _ = layout(tmp_path)
    victim = tmp_path / "victim"
    (victim / "toolkernel.toml").mkdir(parents=True)
    (victim / "toolkernel.toml" / "precious.txt").write_text("data")
    snapshot = take(ws)
    shutil.rmtree(ws / "sub")
    (ws / "sub").symlink_to(victim)

    snapshot.restore(config_files(ws))

    assert (victim / "toolkernel.toml" / "precious.txt").read_text() == "data"
    assert (ws / "sub" / "toolkernel.toml").read_bytes() == POLICY


def test_where_a_policy_file_was_absent_a_symlinked_directory_is_taken_away(
    tmp_path: Path,
) -> None:
    """The top-level policy file was absent; the process points a directory on its
    way elsewhere: the link goes, what it points to stays."""
    ws, outside, _ = layout(tmp_path)
    nested = ws / "deep" / "toolkernel.toml"
    (ws / "deep").mkdir()
    snapshot = PolicySnapshot.take(frozenset({nested}), ws, config_files(ws))
    assert snapshot.files[nested] is None
    (ws / "deep").rmdir()
    (ws / "deep").symlink_to(outside)

    planted = snapshot.restore(config_files(ws))

    assert nested in planted.found
    assert not os.path.lexists(ws / "deep")
    assert (outside / "toolkernel.toml").read_bytes() == OTHER


def test_the_file_a_policy_symlink_points_to_is_restored_too(tmp_path: Path) -> None:
    ws = (tmp_path / "ws").resolve()
    (ws / "conf").mkdir(parents=True)
    (ws / "svc").mkdir()
    (ws / "conf" / "shared.toml").write_text('profile = "read-only"\n')
    (ws / "svc" / "toolkernel.toml").symlink_to("../conf/shared.toml")
    snapshot = take(ws)
    (ws / "conf" / "shared.toml").write_text('profile = "full-access"\n')

    planted = snapshot.restore(config_files(ws))

    assert planted.found == (ws / "conf" / "shared.toml",)
    assert (ws / "svc" / "toolkernel.toml").read_text() == 'profile = "read-only"\n'


def test_what_is_taken_away_is_kept_in_quarantine(tmp_path: Path) -> None:
    """A user's own edit, made while a server runs, is not lost."""
    ws, _, quarantine = layout(tmp_path)
    snapshot = take(ws, quarantine)
    (ws / "sub" / "toolkernel.toml").write_bytes(b"# edited meanwhile\n")
    (ws / "toolkernel.toml").write_bytes(b"# created meanwhile\n")

    planted = snapshot.restore(config_files(ws))

    assert sorted(p.read_bytes() for p in planted.kept) == [
        b"# created meanwhile\n",
        b"# edited meanwhile\n",
    ]
    assert all(p.parent == quarantine for p in planted.kept)
    assert (ws / "sub" / "toolkernel.toml").read_bytes() == POLICY
    assert not (ws / "toolkernel.toml").exists()
    message = planted.violation("The command", ws).safe_message
    assert "quarantine" in message
    assert str(ws) not in message
    assert str(quarantine) not in message


_PARTS = st.sampled_from(["sub", "a", "toolkernel.toml"])
_ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["link-out", "link-in", "file", "dir", "policy", "remove"]),
        st.lists(_PARTS, min_size=1, max_size=3),
    ),
    max_size=6,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(actions=_ACTIONS)
def test_restore_never_touches_anything_outside_and_puts_policies_back(
    tmp_path_factory, actions
) -> None:
    """Whatever a process does inside the workspace, restore leaves the outside as
    it was and every policy file as the snapshot saw it."""
    base = tmp_path_factory.mktemp("prop")
    ws, outside, quarantine = layout(base)
    (outside / "sub").mkdir()
    (outside / "sub" / "toolkernel.toml").write_bytes(OTHER)
    before = tree(outside)
    snapshot = take(ws, quarantine)
    for action, parts in actions:
        path = ws.joinpath(*parts)
        try:
            parent = path.parent.resolve()
        except RuntimeError:  # a symlink loop on the way: nothing can be made there
            continue
        if not parent.is_relative_to(ws):
            continue  # the process sees only the workspace: it cannot write out there
        try:
            if action == "remove":
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            if action == "link-out":
                path.symlink_to(outside)
            elif action == "link-in":
                path.symlink_to(ws / "sub")
            elif action == "file":
                path.write_bytes(b"x")
            elif action == "dir":
                path.mkdir()
            else:
                path.write_bytes(b"[policy]\n")
        except OSError:
            continue  # what the process could not do either

    planted = snapshot.restore(config_files(ws))

    assert tree(outside) == before
    assert planted.left == ()
    assert (ws / "sub" / "toolkernel.toml").read_bytes() == POLICY
    assert not os.path.lexists(ws / "toolkernel.toml")
    assert [p for p in config_files(ws) if p != ws / "sub" / "toolkernel.toml"] == []


def test_giving_back_permissions_never_follows_a_symlink_swapped_in(
    tmp_path: Path, monkeypatch
) -> None:
    """A process still running swaps the directory for a symlink out of the workspace
    just as the runtime gives the directory its owner's rwx back: nothing out there
    changes mode."""
    from toolkernel.tools import planted

    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub").chmod(0o000)
    victim = tmp_path / "outside"
    victim.mkdir()
    victim.chmod(0o700)
    real_open = os.open

    def swapping_open(path, flags, *args, dir_fd=None, **kwargs):  # type: ignore[no-untyped-def]
        if path == "sub" and flags & os.O_PATH and not (ws / "sub").is_symlink():
            (ws / "sub").rename(ws / "sub.old")
            (ws / "sub").symlink_to(victim)
        return real_open(path, flags, *args, dir_fd=dir_fd, **kwargs)

    monkeypatch.setattr(planted.os, "open", swapping_open)
    parent = real_open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        planted._grant_owner_at(parent, "sub")
    finally:
        os.close(parent)
    assert victim.stat().st_mode & 0o777 == 0o700
    assert (ws / "sub.old").stat().st_mode & 0o777 == 0o000


def test_a_directory_without_permissions_gets_its_owners_back(tmp_path: Path) -> None:
    from toolkernel.tools import planted

    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "sub" / "deeper").chmod(0o000)
    (tmp_path / "sub").chmod(0o000)
    parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        planted._grant_tree_at(parent, "sub")
    finally:
        os.close(parent)
    assert (tmp_path / "sub").stat().st_mode & 0o700 == 0o700
    assert (tmp_path / "sub" / "deeper").stat().st_mode & 0o700 == 0o700


def test_a_planted_tree_or_huge_file_is_removed_not_kept(tmp_path: Path) -> None:
    """Quarantine keeps what someone may want back (a policy file someone wrote), not
    what a process dumped there."""
    ws, _, quarantine = layout(tmp_path)
    snapshot = take(ws, quarantine)
    (ws / "toolkernel.toml").write_bytes(b"#" * (2 << 20))
    (ws / "sub" / "toolkernel.toml").unlink()
    (ws / "sub" / "toolkernel.toml").mkdir()
    (ws / "sub" / "toolkernel.toml" / "junk").write_text("x")

    planted = snapshot.restore(config_files(ws))

    assert planted.kept == ()
    assert planted.left == ()
    assert not os.path.lexists(ws / "toolkernel.toml")
    assert (ws / "sub" / "toolkernel.toml").read_bytes() == POLICY


def test_what_stood_at_a_policy_name_before_the_command_is_left_as_it_was(
    tmp_path: Path,
) -> None:
    """A directory or a FIFO named toolkernel.toml that was there before the command
    is the user's, not something the command planted: it is neither reported nor
    removed. One the command put in its place is."""
    ws, _, quarantine = layout(tmp_path)
    (ws / "notes" / "toolkernel.toml").mkdir(parents=True)
    (ws / "notes" / "toolkernel.toml" / "precious.txt").write_text("data")
    os.mkfifo(ws / "sub" / "pipe")
    (ws / "fifo").mkdir()
    os.mkfifo(ws / "fifo" / "toolkernel.toml")
    snapshot = take(ws, quarantine)

    planted = snapshot.restore(config_files(ws))

    assert not planted
    assert (ws / "notes" / "toolkernel.toml" / "precious.txt").read_text() == "data"
    assert (ws / "fifo" / "toolkernel.toml").exists()

    shutil.rmtree(ws / "notes" / "toolkernel.toml")
    (ws / "notes" / "toolkernel.toml").write_text("[run]\nprofile = 'full'\n")
    replaced = snapshot.restore(config_files(ws))
    assert ws / "notes" / "toolkernel.toml" in replaced.found
    assert not (ws / "notes" / "toolkernel.toml").is_file()

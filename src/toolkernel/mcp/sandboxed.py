"""A stdio MCP server inside bubblewrap (``sandbox = "read-only"`` or ``"workspace"``).

A bridged server is third-party code that would otherwise run as you. With
``sandbox`` set, the whole server process lives in the sandbox ``shell.run``'s
commands get: a read-only minimal root, the workspace at its own path (read-only, or
writable with every ``.git`` and the runtime's configuration read-only), the
runtime's state and every forbidden file hidden, a private ``/tmp`` that is also its
``HOME``, no capabilities, and no network unless ``network = true``. Beyond that it
sees only its own install (found from its program, as for commands) and the
``ro_binds`` it is given. A sandbox that cannot start makes the server unavailable
with the reason; it is never started without one.

The view is fixed when the server starts: a forbidden file created in the workspace
later is hidden from it only after its next start. A configuration file that does not
exist cannot be mounted read-only: while a server with the workspace writable runs,
the bridge removes one that appears there (it checks before and after each call of
such a server and when it closes; the call then ends POLICY_VIOLATION).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from toolkernel.config import Config
from toolkernel.errors import ConfigError
from toolkernel.mcp.servers import ServerConfig
from toolkernel.pathguard import PathGuard
from toolkernel.sandbox import SandboxSpec, bwrap_argv, find_bwrap, own_home, probe
from toolkernel.tools.adapter import protected_paths, write_protected

__all__ = ["SANDBOX_ENV", "sandboxed_argv"]

SANDBOX_ENV: Final = {"HOME": "/tmp", "TMPDIR": "/tmp"}  # noqa: S108 - the sandbox's own tmpfs
"""What a sandboxed server gets instead of the host's home and temporary directory."""

# Host directories a bind must not contain: sockets in them (ssh-agent, docker, the
# session bus) connect even without network. A directory below them may be bound.
_NEVER_BOUND: Final = (Path("/tmp"), Path("/run"), Path("/var/run"), Path("/var/tmp"))  # noqa: S108


def sandboxed_argv(
    settings: Config, guard: PathGuard, config: ServerConfig, *, host_code: Iterable[Path] = ()
) -> list[str]:
    """The bubblewrap command line that runs ``config.command`` in its sandbox.

    Runs ripgrep over the workspace (to hide forbidden files): call it off the loop.

    Args:
        settings: the runtime's configuration (``[sandbox] bwrap`` and ``rg``, state).
        guard: the workspace and its forbidden paths.
        config: the server.
        host_code: the tool code the runtime loads from the workspace (read-only).

    Raises:
        SandboxUnavailable: bubblewrap is missing or cannot start here.
        ConfigError: the server's ``cwd`` lies outside the workspace, or a ``ro_binds``
            entry would expose what the sandbox is there to hide.
    """
    workspace = guard.workspace
    bwrap = find_bwrap(settings.sandbox.get("bwrap"))
    probe(bwrap)
    cwd = "."
    if config.cwd is not None:
        where = config.cwd.resolve()
        if not where.is_relative_to(workspace):
            raise ConfigError(
                f"MCP server {config.name}: a sandboxed server's cwd must be in the workspace"
            )
        cwd = where.relative_to(workspace).as_posix() or "."
    rg = settings.sandbox.get("rg")
    writable = config.sandbox == "workspace"
    spec = SandboxSpec(
        workspace=workspace,
        writable=writable,
        network=config.network,
        env={"PATH": os.environ.get("PATH", os.defpath)},  # to find the program's install
        cwd=cwd,
        extra_ro_binds=_checked_binds(settings, config),
        read_only=write_protected(settings, workspace, rg, host_code) if writable else (),
        hidden=protected_paths(settings, guard, with_forbidden_files=True, rg=rg),
    )
    return bwrap_argv(list(config.command), spec, bwrap=bwrap)


def _checked_binds(settings: Config, config: ServerConfig) -> tuple[Path, ...]:
    state = {settings.state_dir.resolve(), settings.ledger_path.parent.resolve()}
    home = own_home()
    homes = [] if home is None else [home.resolve()]
    binds = []
    for raw in config.ro_binds:
        path = Path(raw)
        if not path.is_absolute():
            raise ConfigError(f"MCP server {config.name}: ro_binds entry '{raw}' is not absolute")
        resolved = path.resolve()  # a link must not widen the bind behind the config
        exposes = (
            resolved == Path("/")
            or any(h.is_relative_to(resolved) for h in homes)
            or any(s.is_relative_to(resolved) for s in state)
            or any(d.is_relative_to(resolved) for d in _NEVER_BOUND)
        )
        if exposes:
            raise ConfigError(
                f"MCP server {config.name}: ro_binds entry '{raw}' would expose the home "
                "directory, the runtime's state or host sockets; bind the server's own "
                "install directory instead"
            )
        binds.append(resolved)
    return tuple(binds)

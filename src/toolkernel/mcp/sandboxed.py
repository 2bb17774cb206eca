"""A stdio MCP server inside bubblewrap (``sandbox = "read-only"`` or ``"workspace"``).

A bridged server is third-party code that would otherwise run as you. With
``sandbox`` set, the whole server process lives in the sandbox ``shell.run``'s
commands get: a read-only minimal root, the workspace at its own path (read-only, or
writable with ``.git`` read-only), the runtime's state and every forbidden file
hidden, a private ``/tmp``, no capabilities, and no network unless ``network = true``.
Beyond that it sees only its own install (found from its program, as for commands)
and the ``ro_binds`` it is given. A sandbox that cannot start makes the server
unavailable with the reason; it is never started without one.
"""

from __future__ import annotations

import os
from pathlib import Path

from toolkernel.config import Config
from toolkernel.errors import ConfigError
from toolkernel.mcp.servers import ServerConfig
from toolkernel.pathguard import PathGuard
from toolkernel.sandbox import SandboxSpec, bwrap_argv, find_bwrap, probe
from toolkernel.tools.adapter import protected_paths

__all__ = ["sandboxed_argv"]


def sandboxed_argv(settings: Config, guard: PathGuard, config: ServerConfig) -> list[str]:
    """The bubblewrap command line that runs ``config.command`` in its sandbox.

    Args:
        settings: the runtime's configuration (``[sandbox] bwrap``, the state dir).
        guard: the workspace and its forbidden paths.
        config: the server.

    Raises:
        SandboxUnavailable: bubblewrap is missing or cannot start here.
        ConfigError: the server's ``cwd`` lies outside the workspace.
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
    writable = config.sandbox == "workspace"
    git = workspace / ".git"
    spec = SandboxSpec(
        workspace=workspace,
        writable=writable,
        network=config.network,
        env={"PATH": os.environ.get("PATH", os.defpath)},  # to find the program's install
        cwd=cwd,
        extra_ro_binds=tuple(Path(p) for p in config.ro_binds),
        read_only=(git,) if writable and git.exists() else (),
        hidden=protected_paths(settings, guard, with_forbidden_files=True),
    )
    return bwrap_argv(list(config.command), spec, bwrap=bwrap)

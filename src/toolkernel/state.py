"""Where the runtime keeps its state inside the workspace, if it does.

The state directory (ledger, artifacts, approvals, pins) is ``.toolkernel/`` in the
workspace by default; ``state_dir`` and ``[ledger] path`` can move it. Wherever it is
in the workspace, no tool may read or write it and no sandboxed process may see it:
the path guard forbids it (``state_globs``) and the sandbox hides it
(``state_paths``). Placements that cannot be protected are refused
(``check_placement``).
"""

from __future__ import annotations

import re
from pathlib import Path

from toolkernel.config import Config
from toolkernel.errors import ConfigError

__all__ = ["check_placement", "state_globs", "state_paths"]


def check_placement(config: Config) -> None:
    """Refuse state that cannot be kept from the tools: the workspace itself as the
    state directory, or a ledger file in the workspace root (SQLite's side files, such
    as a ``-journal`` a command creates, would be the ledger's too); and a configured
    ledger path that is a directory, which no call could be recorded in.

    Raises:
        ConfigError: either placement, or a path the system cannot look up (a
            ``Config`` built by hand; ``load_config`` refuses those itself).
    """
    # Named as every configuration error is: the file, then the key.
    where = f"{config.source}: key " if config.source is not None else ""
    workspace = _resolved(config.workspace, "workspace")
    if _resolved(config.state_dir, "state_dir") == workspace:
        raise ConfigError(
            f"{where}'state_dir': the state needs a directory of its own, not the workspace"
        )
    ledger = _resolved(config.ledger_path, "ledger.path")
    # One the file names; a directory found at the default path is the ledger's own
    # error ("not a regular file"), as any other thing there that is not a ledger.
    if config.ledger.backend == "sqlite" and config.ledger.path is not None and ledger.is_dir():
        raise ConfigError(
            f"{where}'ledger.path': '{config.ledger_path}' is a directory; name the "
            "ledger's file (e.g. '.toolkernel/ledger.db')"
        )
    if config.ledger.backend == "sqlite" and ledger.parent == workspace:
        raise ConfigError(
            f"{where}'ledger.path': put the ledger in a directory of its own (e.g. "
            "'.toolkernel/ledger.db'), not in the workspace root"
        )


def _resolved(path: Path, key: str) -> Path:
    try:
        return path.resolve()
    except RuntimeError as exc:
        raise ConfigError(f"{key}: cannot use '{path}' (a symbolic link loop)") from exc
    except ValueError as exc:
        raise ConfigError(f"{key}: a NUL character is not allowed") from exc


def state_paths(config: Config) -> tuple[Path, ...]:
    """The state's directories inside the workspace (see ``check_placement``)."""
    workspace = config.workspace.resolve()
    found: list[Path] = []
    for directory in (config.state_dir, config.ledger_path.parent):
        where = directory.resolve()
        if where != workspace and where.is_relative_to(workspace) and where not in found:
            found.append(where)
    return tuple(found)


def state_globs(config: Config) -> tuple[str, ...]:
    """``state_paths`` as anchored forbidden-path patterns for the path guard."""
    workspace = config.workspace.resolve()
    return tuple(
        "/" + re.sub(r"([*?\[\]\\])", r"\\\1", path.relative_to(workspace).as_posix())
        for path in state_paths(config)
    )

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
from typing import Final

from toolkernel.config import Config
from toolkernel.errors import ConfigError

__all__ = ["check_placement", "mark_state", "state_globs", "state_paths"]

# Written into the state directory when the runtime makes it: git skips the directory
# (artifacts hold unredacted output), and a later start knows the directory is its own.
_MARKER: Final = ".gitignore"
_MARKER_TEXT: Final = (
    "# toolkernel's state (ledger, artifacts of unredacted output, pins): never commit it.\n*\n"
)
# What releases before the marker left in a state directory: it is theirs too.
_OWN_NAMES: Final = frozenset({"ledger.db", "artifacts", "mcp-pins.json"})
_NAMES_SHOWN: Final = 3


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
    too_wide = _too_wide(workspace)
    if too_wide is not None:
        raise ConfigError(
            f"{where}'workspace': cannot use '{workspace}' ({too_wide}): everything in the "
            "workspace is the model's to read and search; use the project's own directory"
        )
    state_dir = _resolved(config.state_dir, "state_dir")
    if state_dir == workspace:
        raise ConfigError(
            f"{where}'state_dir': the state needs a directory of its own, not the workspace"
        )
    foreign = _foreign_entries(state_dir)
    if foreign:
        shown = ", ".join(foreign[:_NAMES_SHOWN]) + (", …" if len(foreign) > _NAMES_SHOWN else "")
        raise ConfigError(
            f"{where}'state_dir': '{config.state_dir.name}' already holds files that are not "
            f"the runtime's ({shown}), and no tool could reach them any more: the state "
            "needs a directory of its own (e.g. '.toolkernel')"
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


def mark_state(config: Config) -> None:
    """Mark the state directory as the runtime's (a ``.gitignore`` of ``*``), once it
    exists (the ledger makes it on opening; a kernel that keeps nothing there, as a dry
    run's, leaves no trace). One that cannot be written is left to what writes there,
    which reports it."""
    try:
        with (config.state_dir / _MARKER).open("x", encoding="utf-8") as marker:
            marker.write(_MARKER_TEXT)
    except OSError:  # marked already, not there, or not writable
        pass


def _too_wide(workspace: Path) -> str | None:
    """Why ``workspace`` is no project's directory: the root, or a home directory or
    above it (every dotfile the forbidden globs do not happen to name would be open)."""
    if workspace == Path(workspace.anchor):
        return "the file system's root"
    try:
        home = Path.home().resolve()
    except (KeyError, OSError, RuntimeError):  # no home to be found: nothing to compare
        return None
    if workspace == home:
        return "the home directory"
    if home.is_relative_to(workspace):
        return "it holds the home directory"
    return None


def _foreign_entries(state_dir: Path) -> list[str]:
    """The names in an existing ``state_dir`` that are not the runtime's, sorted; none
    when it is marked as the runtime's or holds what the runtime keeps there."""
    try:
        names = sorted(entry.name for entry in state_dir.iterdir())
    except OSError:  # not there yet, or not a directory: the ledger says so on opening
        return []
    if not names or _OWN_NAMES.intersection(names) or _is_marked(state_dir):
        return []
    return names


def _is_marked(state_dir: Path) -> bool:
    try:
        return (state_dir / _MARKER).read_text(encoding="utf-8") == _MARKER_TEXT
    except (OSError, UnicodeDecodeError):
        return False


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

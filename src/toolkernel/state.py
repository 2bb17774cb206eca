"""Where the runtime keeps its state inside the workspace, if it does.

The state directory (ledger, artifacts, approvals, pins) is ``.toolkernel/`` in the
workspace by default; ``state_dir`` and ``[ledger] path`` can move it. Wherever it is
in the workspace, no tool may read or write it and no sandboxed process may see it:
the path guard forbids it (``state_globs``) and the sandbox hides it
(``state_paths``).
"""

from __future__ import annotations

import re
from pathlib import Path

from toolkernel.config import Config

__all__ = ["state_globs", "state_paths"]


def state_paths(config: Config) -> tuple[Path, ...]:
    """The state's directories inside the workspace; for a ledger file kept in the
    workspace root itself, that file with its ``-wal``/``-shm``/``-journal`` files."""
    workspace = config.workspace.resolve()
    found: list[Path] = []
    for directory in (config.state_dir, config.ledger_path.parent):
        where = directory.resolve()
        if where != workspace and where.is_relative_to(workspace) and where not in found:
            found.append(where)
    ledger = config.ledger_path.resolve()
    if ledger.parent == workspace:
        found.extend(ledger.with_name(ledger.name + s) for s in ("", "-wal", "-shm", "-journal"))
    return tuple(found)


def state_globs(config: Config) -> tuple[str, ...]:
    """``state_paths`` as anchored forbidden-path patterns for the path guard."""
    workspace = config.workspace.resolve()
    return tuple(
        "/" + re.sub(r"([*?\[\]\\])", r"\\\1", path.relative_to(workspace).as_posix())
        for path in state_paths(config)
    )

"""Content-addressed artifact store: the full output behind a bounded projection.

Artifacts live under ``<state dir>/artifacts/<aa>/<sha256 hex>`` with a JSON sidecar
for metadata (media type, size, producing call). Directories are 0700 and files 0600:
artifacts hold unredacted output, for audit only.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from toolkernel.calls import ArtifactRef, timestamp
from toolkernel.errors import UsageError

__all__ = ["ArtifactStore"]

_PREFIX = "sha256:"


class ArtifactStore:
    """Stores bytes by their sha256 and reads byte ranges back."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def put(
        self,
        data: bytes,
        *,
        media_type: str = "application/octet-stream",
        description: str = "",
        producer: str | None = None,
    ) -> ArtifactRef:
        """Store ``data`` (idempotent: the same bytes give the same ref)."""
        digest = hashlib.sha256(data).hexdigest()
        target = self._path(digest)
        if not target.exists():
            _ensure_private_dir(target.parent)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                Path(tmp).chmod(0o600)
                Path(tmp).replace(target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        ref = ArtifactRef(_PREFIX + digest, media_type, len(data), description)
        meta = {**ref.to_dict(), "producer": producer, "storedAt": timestamp()}
        meta_path = target.with_suffix(".json")
        if not meta_path.exists():
            meta_path.write_text(json.dumps(meta), encoding="utf-8")
            meta_path.chmod(0o600)
        return ref

    def read(self, artifact_id: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of an artifact.

        Raises:
            UsageError: the id is malformed or unknown.
        """
        path = self._path(_digest(artifact_id))
        if not path.is_file():
            raise UsageError(f"unknown artifact {artifact_id}")
        with path.open("rb") as handle:
            handle.seek(start)
            return handle.read(-1 if end is None else max(0, end - start))

    def metadata(self, artifact_id: str) -> dict[str, Any]:
        meta = self._path(_digest(artifact_id)).with_suffix(".json")
        if not meta.is_file():
            raise UsageError(f"unknown artifact {artifact_id}")
        loaded: dict[str, Any] = json.loads(meta.read_text(encoding="utf-8"))
        return loaded

    def _path(self, digest: str) -> Path:
        return self.root / digest[:2] / digest


def _digest(artifact_id: str) -> str:
    digest = artifact_id.removeprefix(_PREFIX)
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise UsageError(f"malformed artifact id {artifact_id[:80]!r}")
    return digest


def _ensure_private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)

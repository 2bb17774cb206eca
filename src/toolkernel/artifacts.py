"""Content-addressed artifact store: the full output behind a bounded projection.

Artifacts live under ``<root>/<aa>/<sha256 hex>`` with a JSON sidecar for metadata
(media type, size, producing call). Directories are 0700 and files 0600 from their
first byte: artifacts hold unredacted output, for audit only.

All but the secrets the runtime knows (``Redactor.add_secret``: a ``[sandbox]
secret_env`` value, say), masked in every form the store's redactor masks them in. An
artifact outlives the process that knew them, and ``artifact.read`` in a later one
(another CLI call, a ``serve`` started from another shell, after the token was
rotated) would mask only what that process knows. Secrets found by their shape are
masked when an artifact is read. With no secret known, storing costs nothing more;
the size and hash of an artifact are always those of the bytes stored.

Three ways in, all with bounded memory except the first:

* ``put(data)`` for output already in memory (a JSON projection that was too big);
* ``put_file(path, move=True)`` for a file written elsewhere, such as a process's
  stdout: hashed in chunks, then renamed into place (same file system) or copied;
* ``writer()`` for output produced piece by piece: bytes are hashed as they are
  written to a staging file, which becomes the artifact on ``commit()``.

Staging files live in ``<root>/.incoming`` so that finishing an artifact is a
rename, never a second copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Final, Self

from toolkernel.calls import ArtifactRef, timestamp
from toolkernel.errors import UsageError
from toolkernel.redaction import SECRET_MASK, Redactor

__all__ = ["ArtifactStore", "ArtifactWriter"]

_PREFIX: Final = "sha256:"
_CHUNK: Final = 1024 * 1024
"""Bytes read per step while hashing or copying: the memory bound of ingestion."""
_STAGING: Final = ".incoming"
_FRESH_S: Final = 60
"""An artifact used this recently is never pruned (the bounded store may exceed its
bound for that long)."""
_MASK: Final = SECRET_MASK.encode()
_MASK_BLOCK: Final = 64 * 1024
"""Bytes gathered before known secrets are masked: small writes cost one append each."""


class ArtifactStore:
    """Stores bytes by their sha256 and reads byte ranges back.

    Args:
        root: the store's directory.
        redactor: whose known secrets are masked in what is stored; ``None`` masks
            nothing (a store for one kernel should have the kernel's).
    """

    def __init__(
        self, root: Path, *, redactor: Redactor | None = None, max_bytes: int | None = None
    ) -> None:
        self.root = root
        self.redactor = redactor
        self.max_bytes = max_bytes

    def put(
        self,
        data: bytes,
        *,
        media_type: str = "application/octet-stream",
        description: str = "",
        producer: str | None = None,
    ) -> ArtifactRef:
        """Store ``data`` (idempotent: the same bytes give the same ref)."""
        with self.writer(media_type=media_type, description=description, producer=producer) as w:
            for start in range(0, len(data), _CHUNK):  # a piece with a secret is copied to mask
                w.write(data[start : start + _CHUNK])
            return w.commit()

    def put_file(
        self,
        path: Path,
        *,
        media_type: str = "application/octet-stream",
        description: str = "",
        producer: str | None = None,
        move: bool = False,
    ) -> ArtifactRef:
        """Store the contents of ``path`` without holding them in memory.

        Args:
            path: a regular file; with ``move`` it is consumed (renamed into the store
                when on the same file system and free of known secrets, else copied,
                masked, and removed).
            media_type: the artifact's media type.
            description: what the artifact is, for the model and the audit.
            producer: the tool call that produced it.
            move: take the file instead of copying it.

        Raises:
            UsageError: ``path`` is not a regular file.
        """
        if not path.is_file() or path.is_symlink():
            raise UsageError("put_file needs a regular file")
        if move:
            hashed = _hash_file(path, self._known_forms())
            if hashed is None:  # it holds a known secret: stored masked, so copied
                ref = self._copy_in(path, media_type, description, producer)
                path.unlink()
                return ref
            digest, size = hashed
            target = self._path(digest)
            _ensure_private_dir(target.parent)
            if target.exists():
                path.unlink()
            else:
                path.chmod(0o600)
                try:
                    path.replace(target)
                except OSError:  # another file system: fall back to copy + unlink
                    ref = self._copy_in(path, media_type, description, producer)
                    path.unlink()
                    return ref
            return self._finish(digest, size, media_type, description, producer)
        return self._copy_in(path, media_type, description, producer)

    @contextmanager
    def writer(
        self,
        *,
        media_type: str = "application/octet-stream",
        description: str = "",
        producer: str | None = None,
    ) -> Iterator[ArtifactWriter]:
        """A streaming writer; ``commit()`` it, or the staged bytes are discarded."""
        staged = ArtifactWriter(self, media_type, description, producer, self._known_forms())
        with staged:
            yield staged

    def staging_dir(self) -> Path:
        """A fresh private directory on the store's file system, for files to ``move`` in."""
        base = self.root / _STAGING
        _ensure_private_dir(base)
        path = base / secrets.token_hex(8)
        path.mkdir(mode=0o700)
        return path

    def read(self, artifact_id: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of an artifact.

        Raises:
            UsageError: the id is malformed or unknown.
        """
        with self.open(artifact_id) as handle:
            handle.seek(max(0, start))
            return handle.read(-1 if end is None else max(0, end - max(0, start)))

    def open(self, artifact_id: str) -> BinaryIO:
        """The artifact's bytes as a file opened for reading, for streaming consumers.

        Raises:
            UsageError: the id is malformed or unknown.
        """
        path = self._path(_digest(artifact_id))
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise UsageError(f"unknown artifact {artifact_id[:80]}{self._pruned()}") from exc
        _used(path)
        return os.fdopen(fd, "rb")

    def metadata(self, artifact_id: str) -> dict[str, Any]:
        """The sidecar: id, type, size, description, producer, storedAt.

        Raises:
            UsageError: the id is malformed or unknown.
        """
        meta = self._path(_digest(artifact_id)).with_suffix(".json")
        if not meta.is_file():
            raise UsageError(f"unknown artifact {artifact_id[:80]}{self._pruned()}")
        loaded: dict[str, Any] = json.loads(meta.read_text(encoding="utf-8"))
        return loaded

    def _copy_in(
        self, path: Path, media_type: str, description: str, producer: str | None
    ) -> ArtifactRef:
        with (
            path.open("rb") as source,
            self.writer(media_type=media_type, description=description, producer=producer) as w,
        ):
            while chunk := source.read(_CHUNK):
                w.write(chunk)
            return w.commit()

    def _finish(
        self, digest: str, size: int, media_type: str, description: str, producer: str | None
    ) -> ArtifactRef:
        ref = ArtifactRef(_PREFIX + digest, media_type, size, description)
        meta_path = self._path(digest).with_suffix(".json")
        if not meta_path.exists():
            # The first producer is kept: the same bytes from a later call are the same
            # artifact, and rewriting the sidecar would race with readers.
            meta = {**ref.to_dict(), "producer": producer, "storedAt": timestamp()}
            _write_private(meta_path, json.dumps(meta).encode())
        _used(self._path(digest))  # stored again: as recently used as a new one
        if self.max_bytes is not None:
            self._prune(keep=digest)
        return ref

    def _prune(self, keep: str) -> None:
        """Remove the least recently used artifacts (stored or read) until the store
        holds at most ``max_bytes``. ``keep``, just stored, stays whatever its size, and
        so does any artifact used in the last ``_FRESH_S``: the other artifacts of the
        result being finished (its message and its output), or of a call running now."""
        assert self.max_bytes is not None
        fresh_since = time.time_ns() - _FRESH_S * 1_000_000_000
        held: list[tuple[int, Path, int]] = []
        total = 0
        for shard in self.root.glob("??"):
            for path in shard.iterdir():
                if path.suffix:  # a sidecar, or a file being written
                    continue
                try:
                    status = path.stat()
                except FileNotFoundError:  # pruned by another process meanwhile
                    continue
                total += status.st_size
                held.append((status.st_mtime_ns, path, status.st_size))
        for used_ns, path, size in sorted(held):
            if total <= self.max_bytes:
                break
            if path.name == keep or used_ns > fresh_since:
                continue
            # A reader that opened it reads on; the next to ask is told it was pruned.
            path.with_suffix(".json").unlink(missing_ok=True)
            path.unlink(missing_ok=True)
            total -= size

    def pruned_note(self) -> str:
        """Why an id a result gave may be unknown now; empty for a store that keeps
        everything."""
        if self.max_bytes is None:
            return ""
        return f"the store keeps the most recently used {self.max_bytes} bytes of output"

    def _pruned(self) -> str:
        note = self.pruned_note()
        return f" (or pruned: {note})" if note else ""

    def _path(self, digest: str) -> Path:
        return self.root / digest[:2] / digest

    def _known_forms(self) -> tuple[bytes, ...]:
        """The forms of the secrets known now, longest first, as bytes."""
        if self.redactor is None:
            return ()
        forms = self.redactor.known_forms
        return tuple(form.encode("utf-8", "surrogateescape") for form in forms)


class ArtifactWriter:
    """Bytes hashed while they are staged; ``commit()`` turns them into an artifact.

    With known secrets (``forms``), what is written is masked first: ``size`` then
    counts the bytes staged so far, which lag behind those written by a block.
    """

    def __init__(
        self,
        store: ArtifactStore,
        media_type: str,
        description: str,
        producer: str | None,
        forms: tuple[bytes, ...] = (),
    ) -> None:
        self._store = store
        self._meta = (media_type, description, producer)
        self._hash = hashlib.sha256()
        self._masking = _KnownSecrets(forms) if forms else None
        self.size = 0
        staging = store.root / _STAGING
        _ensure_private_dir(staging)
        self._path = staging / f"w-{secrets.token_hex(8)}"
        fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self._file: BinaryIO | None = os.fdopen(fd, "wb")

    def write(self, data: bytes) -> None:
        if self._file is None:
            raise UsageError("the artifact writer is closed")
        if self._masking is None:
            self._stage(data)
            return
        for ready in self._masking.feed(data):
            self._stage(ready)

    def commit(self) -> ArtifactRef:
        """Close the staging file and move it into the store under its hash."""
        if self._file is None:
            raise UsageError("the artifact writer is closed")
        if self._masking is not None:
            self._stage(self._masking.close())
        self._file.close()
        self._file = None
        digest = self._hash.hexdigest()
        target = self._store._path(digest)
        _ensure_private_dir(target.parent)
        if target.exists():
            self._path.unlink()
        else:
            self._path.replace(target)
        return self._store._finish(digest, self.size, *self._meta)

    def _stage(self, data: bytes | memoryview) -> None:
        assert self._file is not None
        self._file.write(data)
        self._hash.update(data)
        self.size += len(data)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            self._path.unlink(missing_ok=True)


class _KnownSecrets:
    """Masks the forms of known secrets in bytes that arrive in pieces.

    Small pieces are gathered into blocks; each block is masked whole, less its last
    bytes: as many as the longest form, less one, and back to the start of a form that
    runs over the cut. They go with the next block, so a secret that arrives in two
    pieces is masked as one. A large piece that holds no form, the usual case, is
    passed on as it is, not copied.
    """

    def __init__(self, forms: tuple[bytes, ...]) -> None:
        self._forms = forms  # longest first, as the redactor masks them
        self._keep = len(forms[0]) - 1
        self._pending = bytearray()

    def feed(self, data: bytes) -> list[bytes | memoryview]:
        """Take the next piece; return the masked bytes that are now final, in order."""
        if len(data) >= _MASK_BLOCK and not self._holds_form(data):
            ready: list[bytes | memoryview] = [
                bytes(self._pending),
                memoryview(data)[: len(data) - self._keep],
            ]
            self._pending = bytearray(data[len(data) - self._keep :])
            return ready
        self._pending += data
        if len(self._pending) < _MASK_BLOCK + self._keep:
            return []
        block = bytes(self._pending)
        cut = len(block) - self._keep
        for form in self._forms:  # a form running over the cut lies whole in the block
            at = block.find(form, max(0, cut - len(form) + 1), cut + len(form) - 1)
            if at != -1:
                cut = min(cut, at)
        self._pending = bytearray(block[cut:])
        return [_masked(block[:cut], self._forms)]

    def close(self) -> bytes:
        """The end: the rest, masked."""
        ready = bytes(self._pending)
        self._pending.clear()
        return _masked(ready, self._forms)

    def _holds_form(self, data: bytes) -> bool:
        """Whether a form is in what is held, in ``data`` or across the two."""
        seam = bytes(self._pending[-self._keep :]) + data[: self._keep]
        return any(form in data or form in self._pending or form in seam for form in self._forms)


def _masked(data: bytes, forms: tuple[bytes, ...]) -> bytes:
    for form in forms:
        data = data.replace(form, _MASK)
    return data


def _hash_file(path: Path, forms: tuple[bytes, ...] = ()) -> tuple[str, int] | None:
    """The sha256 and size of the file, or ``None`` once it shows it holds one of
    ``forms`` (also across the chunks it is read in)."""
    digest = hashlib.sha256()
    size = 0
    keep = len(forms[0]) - 1 if forms else 0
    tail = b""
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            if forms:
                seam = tail + chunk[:keep]
                if any(form in chunk or form in seam for form in forms):
                    return None
                tail = chunk[-keep:]  # forms are 4 bytes at least: keep is never 0
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _digest(artifact_id: str) -> str:
    digest = artifact_id.removeprefix(_PREFIX)
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise UsageError(f"malformed artifact id {artifact_id[:80]!r}")
    return digest


def _used(path: Path) -> None:
    """Mark an artifact used now: the bounded store prunes the least recently used."""
    with suppress(OSError):  # pruned meanwhile, or a store we may only read
        os.utime(path)


def _ensure_private_dir(path: Path) -> None:
    # mkdir(parents=True) gives parents the umask's mode, so each level is made
    # private explicitly; existing directories outside the store are left alone.
    if path.is_dir():
        return
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=0o700, exist_ok=True)
        directory.chmod(0o700)


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

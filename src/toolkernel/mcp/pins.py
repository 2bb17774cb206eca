"""Pins: the definition of every remote tool, fixed by a canonical hash.

A pin covers the whole definition as the server states it (``name``, ``title``,
``description``, ``inputSchema``, ``outputSchema``, ``annotations``), not the
description alone, and keeps that definition so a change can be shown as a diff.

Trust on first use: a tool seen for the first time is pinned and exposed when
``check`` is not ``strict``. The bridge makes it strict for a server configured with
``pin = "strict"`` and for a tool a server adds after its first listing. A tool
whose definition no longer matches its pin is held back: the new definition is kept
as *pending* until someone approves it, and the old pin stays in force until then.

The pins live in ``<state_dir>/mcp-pins.json`` (mode 0600), rewritten atomically. Every
change is made under an exclusive lock (``flock`` on ``.mcp-pins.json.lock`` beside it)
to the file as it is then, never to a copy read earlier: a gateway that pins a new tool
keeps an approval that ``toolkernel mcp approve`` wrote while it ran. ``reload`` brings
a store's view up to date when the file changed (a ``stat``, unless it did).
"""

from __future__ import annotations

import difflib
import fcntl
import json
import os
import secrets
import shlex
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from toolkernel.calls import timestamp
from toolkernel.canonical import sha256_of
from toolkernel.errors import ConfigError, UsageError
from toolkernel.lint.poisoning import latin_look_alike
from toolkernel.terminal import json_text

__all__ = [
    "MIN_HASH_PREFIX",
    "PIN_FIELDS",
    "PIN_FILENAME",
    "Pin",
    "PinCheck",
    "PinStore",
    "PinVerdict",
    "approve_pin",
    "command",
    "diff_pins",
    "pinned_view",
]

PIN_FILENAME: Final = "mcp-pins.json"
PIN_FIELDS: Final = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
_FORMAT: Final = 1

MIN_HASH_PREFIX: Final = len("sha256:") + 32
"""The shortest ``--hash`` an approval takes: 128 bits, which no server can match with
another definition by trying (12 hex digits, 48 bits, it could)."""

_Stamp = tuple[int, int, int, int]  # inode, size, mtime and ctime (ns) of the pin file
_Change = Callable[[], None]  # one change to the pins, applied to the file as it is


class PinVerdict(StrEnum):
    """What a definition is, compared with its pin."""

    MATCH = "match"  # pinned and unchanged: exposed
    PINNED = "pinned"  # first sight, pinned now (trust on first use): exposed
    UNAPPROVED = "unapproved"  # first sight under pin="strict": held until approved
    CHANGED = "changed"  # differs from its pin: held until approved


@dataclass(frozen=True, slots=True)
class Pin:
    """An approved definition."""

    server: str
    tool: str
    hash: str
    definition: Mapping[str, Any]
    approved_at: str


@dataclass(frozen=True, slots=True)
class PinCheck:
    """The outcome of checking a definition against the pins."""

    verdict: PinVerdict
    hash: str
    old_hash: str | None = None

    @property
    def exposed(self) -> bool:
        return self.verdict in (PinVerdict.MATCH, PinVerdict.PINNED)


def pinned_view(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The part of an MCP tool definition that is pinned (absent fields left out)."""
    return {key: tool[key] for key in PIN_FIELDS if tool.get(key) is not None}


class PinStore:
    """The pin file of one state directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_name(f".{path.name}.lock")
        self._data: dict[str, dict[str, dict[str, Any]]] = {}
        self._stamp: _Stamp | None = None
        # Counts the pins this store has read or written: a change is a new version
        # whoever made it and whichever method read it first.
        self.version = 0
        self.reload()

    @classmethod
    def in_state_dir(cls, state_dir: Path) -> PinStore:
        return cls(state_dir / PIN_FILENAME)

    def reload(self) -> bool:
        """Read the file again if it changed since this store last read or wrote it
        (another process approved or pinned something); True when it did.

        Raises:
            ConfigError: the file cannot be read or is not a pin file (reported once
                per change of the file).
        """
        stamp = _stamp_of(self.path)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        self._data = _load(self.path)
        self.version += 1
        return True

    def pinned(self, server: str) -> list[str]:
        """The names of the server's tools that have an approved pin."""
        return [tool for tool, entry in self._data.get(server, {}).items() if "hash" in entry]

    def get(self, server: str, tool: str) -> Pin | None:
        """The approved pin of a tool, if any."""
        entry = self._data.get(server, {}).get(tool)
        if entry is None or "hash" not in entry:
            return None
        return Pin(server, tool, entry["hash"], entry["definition"], entry.get("approvedAt", ""))

    def pending(self, server: str, tool: str) -> Mapping[str, Any] | None:
        """The definition waiting for approval (``{"hash", "definition", "seenAt"}``)."""
        entry = self._data.get(server, {}).get(tool, {})
        pending: Mapping[str, Any] | None = entry.get("pending")
        return pending

    def peek(self, server: str, tool: Mapping[str, Any]) -> PinCheck:
        """Compare a definition with its pin without recording anything."""
        view = pinned_view(tool)
        digest = sha256_of(view)
        pin = self.get(server, str(tool.get("name", "")))
        if pin is None:
            return PinCheck(PinVerdict.UNAPPROVED, digest)
        if pin.hash == digest:
            return PinCheck(PinVerdict.MATCH, digest)
        return PinCheck(PinVerdict.CHANGED, digest, pin.hash)

    def check(self, server: str, tool: Mapping[str, Any], *, strict: bool = False) -> PinCheck:
        """Compare a definition with the pins as the file has them now; pin it on first
        sight unless ``strict``.

        A definition that is not exposed is kept as pending, for ``approve`` and
        ``diff_pins``; the file is changed when anything changed.
        """
        self.reload()
        seen, change = self._decide(server, tool, strict=strict)
        if change is None:
            return seen
        with self._locked():  # decided again: the file may have changed meanwhile
            seen, change = self._decide(server, tool, strict=strict)
            if change is not None:
                change()
                self._write()
        return seen

    def approve(self, server: str, tool: str, *, expected: str | None = None) -> Pin:
        """Approve the pending definition of a tool: it becomes the pin.

        ``expected`` (the pending hash ``diff_pins`` showed, or its first
        ``MIN_HASH_PREFIX`` characters or more) makes sure the definition approved is the
        one that was reviewed: another gateway on the same state directory may have
        recorded a different one. A shorter prefix is refused: a server could find
        another definition that shares it.

        Raises:
            UsageError: nothing is pending for that tool, or not the ``expected`` one.
        """
        with self._locked():
            pending = self.pending(server, tool)
            if pending is None:
                raise UsageError(f"no changed or new definition of {server}.{tool} awaits approval")
            now = str(pending["hash"])
            if expected is not None:
                # The hash as another tool prints it: without its algorithm, in capitals.
                expected = expected.strip().lower()
                if ":" not in expected:
                    expected = f"sha256:{expected}"
                if len(expected) < MIN_HASH_PREFIX:
                    raise UsageError(
                        "--hash needs at least 32 hex digits of the hash (after sha256:, which "
                        f"may be left out), as {command('diff', server, tool)} prints it"
                    )
                if not now.startswith(expected):
                    raise UsageError(
                        f"the definition of {server}.{tool} awaiting approval is {now}, not "
                        f"{expected}: run {command('diff', server, tool)} again"
                    )
            self._approve(server, tool, pending["definition"], pending["hash"])
            self._entry(server, tool).pop("pending", None)
            self._write()
        pin = self.get(server, tool)
        assert pin is not None
        return pin

    def awaiting(self) -> list[tuple[str, str]]:
        """(server, tool) of every definition waiting for approval."""
        return [
            (server, tool)
            for server, tools in sorted(self._data.items())
            for tool, entry in sorted(tools.items())
            if "pending" in entry
        ]

    def _decide(
        self, server: str, tool: Mapping[str, Any], *, strict: bool
    ) -> tuple[PinCheck, _Change | None]:
        """What ``check`` answers, and the change to the pins it makes (None: none)."""
        seen = self.peek(server, tool)
        name = str(tool.get("name", ""))
        pending = self.pending(server, name)
        if seen.verdict is PinVerdict.MATCH:
            if pending is None:
                return seen, None
            # The server went back to its pinned definition: nothing to approve.
            return seen, lambda: self._entry(server, name).pop("pending", None)
        view = pinned_view(tool)
        if seen.verdict is PinVerdict.UNAPPROVED and not strict:
            pinned = PinCheck(PinVerdict.PINNED, seen.hash)
            return pinned, lambda: self._approve(server, name, view, seen.hash)
        if pending is not None and pending.get("hash") == seen.hash:
            return seen, None
        record = {"hash": seen.hash, "definition": view, "seenAt": timestamp()}
        return seen, lambda: self._entry(server, name).update(pending=record)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the pin file's lock, with the file read afresh: what is changed and
        written inside is a change to the file as it is, not to an older copy."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            stamp = _stamp_of(self.path)
            if stamp != self._stamp:
                self.version += 1
            self._stamp, self._data = stamp, _load(self.path)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _write(self) -> None:
        """Write the pins; only under ``_locked``."""
        document = {"format": _FORMAT, "servers": self._data}
        _write_private(self.path, json.dumps(document, indent=2, sort_keys=True) + "\n")
        self._stamp = _stamp_of(self.path)
        self.version += 1

    def _approve(self, server: str, tool: str, view: Mapping[str, Any], digest: str) -> None:
        entry = self._entry(server, tool)
        entry.update({"hash": digest, "definition": dict(view), "approvedAt": timestamp()})

    def _entry(self, server: str, tool: str) -> dict[str, Any]:
        return self._data.setdefault(server, {}).setdefault(tool, {})


def diff_pins(store: PinStore, server: str, tool: str) -> str:
    """A unified diff of the pinned definition against the pending one.

    Raises:
        UsageError: nothing is pending for that tool.
    """
    pending = store.pending(server, tool)
    if pending is None:
        raise UsageError(f"no changed or new definition of {server}.{tool} awaits approval")
    pin = store.get(server, tool)
    old = _pretty(pin.definition) if pin else []
    new = _pretty(pending["definition"])
    label = f"{server}.{tool}"
    old_label = f"{label} (pinned {pin.hash[:19]})" if pin else f"{label} (not pinned)"
    lines = difflib.unified_diff(
        old, new, old_label, f"{label} (pending {str(pending['hash'])[:19]})", lineterm=""
    )
    approve = f"{command('approve', server, tool)} --hash {pending['hash']}"
    notes = _look_alikes(old, new)
    return "\n".join([*lines, *notes]) + f"\n\nto approve exactly this definition: {approve}\n"


def command(verb: str, server: str, tool: str) -> str:
    """``toolkernel mcp VERB SERVER TOOL`` as a shell line to copy: the names are the
    server's text, quoted (a tool named ``x;rm -rf ~`` must stay one argument)."""
    return f"toolkernel mcp {verb} {shlex.quote(server)} {shlex.quote(tool)}"


def approve_pin(state_dir: Path, server: str, tool: str, *, expected: str | None = None) -> Pin:
    """Approve a pending definition in the pin file of ``state_dir`` (for the CLI).

    Raises:
        UsageError: nothing is pending for that tool, or not the ``expected`` one.
    """
    return PinStore.in_state_dir(state_dir).approve(server, tool, expected=expected)


def _pretty(definition: Mapping[str, Any]) -> list[str]:
    # One key per line with sorted keys: a changed word shows as one changed line. What
    # a terminal would hide or act on (zero-width, bidi, tag characters) is escaped.
    return json_text(definition, indent=2, sort_keys=True).splitlines()


def _look_alikes(old: list[str], new: list[str]) -> list[str]:
    """A line for each letter in the pending definition's new lines that is made to look
    like a Latin one: the diff shows it as the letter it imitates."""
    kept = set(old)
    notes = []
    for number, line in enumerate(new, start=1):
        if line in kept:
            continue
        for char in dict.fromkeys(line):
            latin = latin_look_alike(char)
            if latin is not None:
                name = unicodedata.name(char, "unnamed")
                notes.append(f"line {number}: U+{ord(char):04X} {name}, which looks like '{latin}'")
    if not notes:
        return []
    return ["", "letters in the pending lines that look like others:", *notes]


def _stamp_of(path: Path) -> _Stamp | None:
    """What tells one version of the pin file from another, without reading it; each
    write is a new file renamed into place, so a new inode as well as new times."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the MCP pins ({exc.strerror})") from exc
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _load(path: Path) -> dict[str, dict[str, dict[str, Any]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the MCP pins ({exc.strerror})") from exc
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: the MCP pin file is not valid JSON ({exc})") from exc
    if not isinstance(document, dict) or document.get("format") != _FORMAT:
        raise ConfigError(f"{path}: not an MCP pin file of format {_FORMAT}")
    servers: dict[str, dict[str, dict[str, Any]]] = document.get("servers", {})
    if not _well_formed(servers):
        raise ConfigError(f"{path}: the MCP pin file's entries are not as toolkernel writes them")
    return servers


def _well_formed(servers: object) -> bool:
    """Each tool's entry holds a pin (``hash``, ``definition``), a pending definition
    (the same two), or both."""
    if not isinstance(servers, dict):
        return False
    for tools in servers.values():
        if not isinstance(tools, dict):
            return False
        for entry in tools.values():
            if not isinstance(entry, dict):
                return False
            pending = entry.get("pending")
            pinned = "hash" in entry or "definition" in entry
            if not (pinned or pending is not None):
                return False
            if (pinned and not _a_pin(entry)) or (pending is not None and not _a_pin(pending)):
                return False
    return True


def _a_pin(value: object) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("hash"), str)
        and isinstance(value.get("definition"), dict)
    )


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

"""Applying a unified diff or exact search/replace edits to one file's text, in memory.

Pure functions on strings, so ``file.patch`` can check every hunk before it writes
anything. Hunks must match exactly (no fuzz); a hunk may sit at another line than its
header says (like ``patch``'s offset), searched nearest-first and never before the
previous hunk. Line endings of the file are kept: lines are compared without their
terminators, and added lines take the file's own ending (``\\r\\n`` or ``\\n``).

Git's extended header lines are read, not skipped: ``diff --git`` contributes its path
to the names, and a header asking for what hunks cannot say (rename, copy, deletion,
mode change, binary patch) refuses the diff, so nothing is silently dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

__all__ = ["Hunk", "PatchError", "apply_edits", "apply_unified_diff", "parse_unified_diff"]

_HEADER: Final = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_EOL: Final = "\\ No newline at end of file"
_GIT_DIFF: Final = "diff --git"
# Extended header lines that describe a plain in-place text change (or a new 100644 file).
_GIT_HARMLESS: Final = re.compile(
    r"index [0-9a-f]{4,64}\.\.[0-9a-f]{4,64}(?: [0-7]{6})?"
    r"|new file mode 100644|dissimilarity index \d{1,3}%"
)
# Every other header git apply acts on, and what is wrong with it; prefixes as git matches them.
_GIT_UNSUPPORTED: Final = {
    "rename from ": "asks for a rename",
    "rename to ": "asks for a rename",
    "rename old ": "asks for a rename",
    "rename new ": "asks for a rename",
    "copy from ": "asks for a copy",
    "copy to ": "asks for a copy",
    "similarity index ": "asks for a rename or copy",
    "deleted file mode ": "asks for a deletion",
    "old mode ": "asks for a mode change",
    "new mode ": "asks for a mode change",
    "new file mode ": "asks for a new file that is not a plain (100644) file",
    "GIT binary patch": "asks for a binary patch",
    "Binary files ": "asks for a binary patch",
    "index ": "has a malformed 'index' line",
    "dissimilarity index ": "has a malformed 'dissimilarity index' line",
}
_ONLY_TEXT: Final = (
    "file.patch changes one file's text in place; renames, copies, deletions, mode "
    "changes and binary patches are not supported, so send a unified diff of that "
    "file's text alone"
)


class PatchError(ValueError):
    """The change does not apply; ``reason`` is safe to show the model."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(slots=True)
class Hunk:
    """One ``@@`` block: where it claims to apply, and its tagged lines."""

    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: list[tuple[str, str]] = field(default_factory=list)
    old_no_eol: bool = False
    new_no_eol: bool = False

    @property
    def old(self) -> list[str]:
        return [text for tag, text in self.lines if tag in " -"]

    @property
    def new(self) -> list[str]:
        return [text for tag, text in self.lines if tag in " +"]


def parse_unified_diff(diff: str) -> tuple[list[Hunk], set[str]]:
    """The hunks of a single-file unified diff, and the file names its headers give.

    Raises:
        PatchError: the text has no hunk, a hunk's line counts do not add up, or a
            header asks for more than a text change (rename, copy, deletion, mode,
            binary).
    """
    hunks: list[Hunk] = []
    names: set[str] = set()
    current: Hunk | None = None
    git_header = False  # between a "diff --git" line and its "---" (or first hunk)
    for raw in diff.splitlines():
        line = raw.rstrip("\r")
        match = _HEADER.match(line)
        if match:
            current = _hunk(match)
            hunks.append(current)
            git_header = False
        elif line.startswith(("--- ", "+++ ")) and (current is None or _complete(current)):
            git_header = False
            name = line[4:].split("\t", 1)[0].strip()
            if name != "/dev/null":
                names.add(_strip_prefix(name))
            elif line.startswith("+"):
                raise PatchError(f"the diff asks for a deletion ('+++ /dev/null'); {_ONLY_TEXT}")
            current = None
        elif current is not None and line == _NO_EOL:
            tag = current.lines[-1][0] if current.lines else " "
            if tag in " -":
                current.old_no_eol = True
            if tag in " +":
                current.new_no_eol = True
        elif current is not None and not _complete(current):
            tag, text = (line[:1] or " "), line[1:]
            if tag not in " +-":
                raise PatchError(f"hunk {len(hunks)} has a line that is not ' ', '+' or '-'")
            current.lines.append((tag, text))
        elif line.startswith(_GIT_DIFF):
            names.add(_git_path(line[len(_GIT_DIFF) :].strip()))
            git_header = True
        elif git_header:
            _check_git_header(line)
    if not hunks:
        raise PatchError("the diff contains no '@@' hunk")
    for number, hunk in enumerate(hunks, start=1):
        if len(hunk.old) != hunk.old_len or len(hunk.new) != hunk.new_len:
            raise PatchError(f"hunk {number}'s line counts do not match its '@@' header")
    return hunks, names


def apply_unified_diff(text: str, diff: str) -> tuple[str, int, int]:
    """``text`` with the diff applied; also the numbers of lines added and removed.

    Raises:
        PatchError: a hunk does not match the text.
    """
    hunks, _ = parse_unified_diff(diff)
    lines = text.splitlines(keepends=True)
    eol = _line_ending(lines)
    out: list[str] = []
    cursor = 0
    offset = 0
    added = removed = 0
    for number, hunk in enumerate(hunks, start=1):
        old = hunk.old
        want = max(hunk.old_start - 1, 0) + offset if hunk.old_len else hunk.old_start + offset
        at = _find(lines, old, want, cursor)
        if at is None:
            raise PatchError(
                f"hunk {number} (at line {hunk.old_start}) does not match the file's content"
            )
        out.extend(lines[cursor:at])
        new = [t + eol for t in hunk.new]
        at_end = at + len(old) == len(lines)
        if hunk.new_no_eol and new and at_end:
            new[-1] = new[-1][: -len(eol)]
        out.extend(new)
        cursor = at + len(old)
        offset = at - (hunk.old_start - 1 if hunk.old_len else hunk.old_start)
        added += sum(1 for tag, _ in hunk.lines if tag == "+")
        removed += sum(1 for tag, _ in hunk.lines if tag == "-")
    out.extend(lines[cursor:])
    return "".join(out), added, removed


def apply_edits(text: str, edits: list[tuple[str, str]]) -> str:
    """``text`` with each (search, replace) applied in order; each must match once.

    Raises:
        PatchError: a search text occurs zero times or more than once.
    """
    for number, (search, replace) in enumerate(edits, start=1):
        if search == "":
            if text:
                raise PatchError(
                    f"edit {number} has an empty search text but the file is not empty"
                )
            text = replace
            continue
        count = text.count(search)
        if count != 1:
            found = "is not in the file" if count == 0 else f"occurs {count} times"
            raise PatchError(f"edit {number}'s search text {found}; it must occur exactly once")
        text = text.replace(search, replace, 1)
    return text


def _hunk(match: re.Match[str]) -> Hunk:
    old_start, old_len, new_start, new_len = match.groups()
    return Hunk(
        int(old_start),
        1 if old_len is None else int(old_len),
        int(new_start),
        1 if new_len is None else int(new_len),
    )


def _check_git_header(line: str) -> None:
    """Refuse an extended header line (after ``diff --git``, before ``---``) that hunks
    cannot carry out. Text elsewhere (a commit message, a signature) is ignored, as
    ``git apply`` ignores it."""
    if not _GIT_HARMLESS.fullmatch(line):
        for prefix, what in _GIT_UNSUPPORTED.items():
            if line.startswith(prefix):
                raise PatchError(f"the diff {what} ('{prefix.strip()}'); {_ONLY_TEXT}")


def _git_path(pair: str) -> str:
    """The one path of ``a/P b/P``; the whole text when its two halves name different paths.

    Like git, split where both halves agree (a path may itself contain spaces): with
    the same path in both, that is the middle, so one comparison decides (trying every
    space would be quadratic in a line of spaces).
    """
    middle = len(pair) // 2
    left, right = pair[:middle], pair[middle + 1 :]
    if pair[middle : middle + 1] == " " and _strip_prefix(left) == _strip_prefix(right):
        return _strip_prefix(left)
    return pair


def _strip_prefix(name: str) -> str:
    return re.sub(r"^[ab]/", "", name)


def _complete(hunk: Hunk) -> bool:
    return len(hunk.old) >= hunk.old_len and len(hunk.new) >= hunk.new_len


def _find(lines: list[str], old: list[str], want: int, floor: int) -> int | None:
    """Where ``old`` matches ``lines``, nearest to ``want`` and not before ``floor``."""
    last = len(lines) - len(old)
    if last < floor:
        return None
    want = min(max(want, floor), last)
    for distance in range(max(want - floor, last - want) + 1):
        for at in (want - distance, want + distance):
            if floor <= at <= last and _matches(lines, old, at):
                return at
    return None


def _matches(lines: list[str], old: list[str], at: int) -> bool:
    return all(lines[at + i].rstrip("\r\n") == expected for i, expected in enumerate(old))


def _line_ending(lines: list[str]) -> str:
    return "\r\n" if lines and lines[0].endswith("\r\n") else "\n"

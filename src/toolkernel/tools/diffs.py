"""Applying a unified diff or exact search/replace edits to one file's text, in memory.

Pure functions on strings, so ``file.patch`` can check every hunk before it writes
anything. Hunks must match exactly (no fuzz); a hunk may sit at another line than its
header says (like ``patch``'s offset): the match nearest to it, never before the
previous hunk, found by one string search over the file's lines (linear, so a hunk
that matches nowhere costs no more than one that matches). Lines break at ``\\n``
alone, as git and ``patch`` break them (``str.splitlines`` also breaks at form feeds,
``\\x1c``-``\\x1e``, ``\\x85``, U+2028…). Line endings of the file are kept: lines are
compared without their terminators, and added lines take the file's own ending
(``\\r\\n`` or ``\\n``), or the diff's where the file has none yet.

Git's extended header lines are read, not skipped: ``diff --git`` contributes its path
to the names (unquoted, where git quoted it C-style), a header asking for what hunks
cannot say (rename, copy, deletion, mode change, binary patch) refuses the diff, so
nothing is silently dropped, and a diff that creates its file (``--- /dev/null``)
does not apply to one that exists, as ``git apply`` refuses it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

__all__ = ["Hunk", "PatchError", "apply_edits", "apply_unified_diff", "parse_unified_diff"]

_HEADER: Final = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_EOL: Final = "\\ No newline at end of file"
# A name git quoted (core.quotepath): C escapes, and octal for each byte outside ASCII.
_QUOTED: Final = re.compile(r'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_C_ESCAPE: Final = re.compile(r"\\(?:([0-7]{3})|(.))", re.DOTALL)
_C_ESCAPES: Final = {
    "a": "\a",
    "b": "\b",
    "t": "\t",
    "n": "\n",
    "v": "\v",
    "f": "\f",
    "r": "\r",
    '"': '"',
    "\\": "\\",
}
_PREFIX: Final = re.compile(r"^(?:[ab]/)?(?:\./)*")
_CODE_POINTS: Final = 0x110000
_HIGH: Final = 0x100000  # the first of a line's two characters; the second is below 0x10000
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


@dataclass(slots=True)
class _Parsed:
    """What a diff says: its hunks, the names its headers give, whether it creates its
    file, and the line ending of its first added line (``None`` without one)."""

    hunks: list[Hunk] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    creates: bool = False
    eol: str | None = None


def parse_unified_diff(diff: str) -> tuple[list[Hunk], set[str]]:
    """The hunks of a single-file unified diff, and the file names its headers give.

    Raises:
        PatchError: the text has no hunk, a hunk's line counts do not add up, or a
            header asks for more than a text change (rename, copy, deletion, mode,
            binary).
    """
    parsed = _parse(diff)
    return parsed.hunks, parsed.names


def apply_unified_diff(text: str, diff: str, *, exists: bool = True) -> tuple[str, int, int]:
    """``text`` with the diff applied; also the numbers of lines added and removed.

    Args:
        text: the file's content.
        diff: a unified diff of that one file.
        exists: whether the file is there (a diff that creates it does not apply then).

    Raises:
        PatchError: a hunk does not match the text, or the diff creates a file that
            exists.
    """
    parsed = _parse(diff)
    if parsed.creates and exists:
        raise PatchError(
            "the diff creates the file, which already exists; make the diff against "
            "its current content"
        )
    lines = _split_lines(text)
    eol = _line_ending(lines) or parsed.eol or "\n"
    index = _LineIndex(lines)
    out: list[str] = []
    cursor = 0
    offset = 0
    added = removed = 0
    for number, hunk in enumerate(parsed.hunks, start=1):
        old = hunk.old
        want = max(hunk.old_start - 1, 0) + offset if hunk.old_len else hunk.old_start + offset
        at = index.find(old, want, cursor)
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


def _split_lines(text: str) -> list[str]:
    """``text``'s lines, each with its ending, broken at ``\\n`` only."""
    lines = text.split("\n")
    last = lines.pop()
    lines = [line + "\n" for line in lines]
    if last:
        lines.append(last)
    return lines


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


def _parse(diff: str) -> _Parsed:
    parsed = _Parsed()
    hunks, names = parsed.hunks, parsed.names
    current: Hunk | None = None
    # The current hunk's old and new lines so far: counted, since recounting them at
    # each line made parsing quadratic in a hunk's length.
    old_seen = new_seen = 0
    git_header = False  # between a "diff --git" line and its "---" (or first hunk)
    for raw in _diff_lines(diff):
        line = raw.rstrip("\r")
        match = _HEADER.match(line)
        complete = current is None or (old_seen >= current.old_len and new_seen >= current.new_len)
        if match:
            current = _hunk(match)
            hunks.append(current)
            old_seen = new_seen = 0
            git_header = False
        elif line.startswith(("--- ", "+++ ")) and complete:
            git_header = False
            name = _file_name(line[4:])
            if name != "/dev/null":
                names.add(_strip_prefix(name))
            elif line.startswith("+"):
                raise PatchError(f"the diff asks for a deletion ('+++ /dev/null'); {_ONLY_TEXT}")
            else:
                parsed.creates = True
            current = None
        elif current is not None and line == _NO_EOL:
            tag = current.lines[-1][0] if current.lines else " "
            if tag in " -":
                current.old_no_eol = True
            if tag in " +":
                current.new_no_eol = True
        elif current is not None and not complete:
            tag, text = (line[:1] or " "), line[1:]
            if tag not in " +-":
                raise PatchError(f"hunk {len(hunks)} has a line that is not ' ', '+' or '-'")
            current.lines.append((tag, text))
            old_seen += tag != "+"
            new_seen += tag != "-"
            if tag == "+" and parsed.eol is None:
                parsed.eol = "\r\n" if raw.endswith("\r") else "\n"
        elif line.startswith(_GIT_DIFF):
            names.add(_git_path(line[len(_GIT_DIFF) :].strip()))
            git_header = True
        elif git_header:
            _check_git_header(line)
            parsed.creates = parsed.creates or line.startswith("new file mode ")
    if not hunks:
        raise PatchError("the diff contains no '@@' hunk")
    for number, hunk in enumerate(hunks, start=1):
        if len(hunk.old) != hunk.old_len or len(hunk.new) != hunk.new_len:
            raise PatchError(f"hunk {number}'s line counts do not match its '@@' header")
    return parsed


def _diff_lines(diff: str) -> list[str]:
    """The diff's lines without their ``\\n``; a ``\\r`` before it is kept (it tells the
    line ending of added lines)."""
    lines = diff.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


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
    space would be quadratic in a line of spaces). Git quotes both halves of a path
    with special characters, and then the quotes delimit them.
    """
    if pair.startswith('"'):
        return _quoted_git_path(pair) or pair
    middle = len(pair) // 2
    left, right = pair[:middle], pair[middle + 1 :]
    if pair[middle : middle + 1] == " " and _strip_prefix(left) == _strip_prefix(right):
        return _strip_prefix(left)
    return pair


def _quoted_git_path(pair: str) -> str | None:
    """The one path of ``"a/P" "b/P"``, or ``None``."""
    first = _unquote(pair)
    if first is None or not first[1].startswith(' "'):
        return None
    second = _unquote(first[1][1:])
    if second is None or second[1] or _strip_prefix(first[0]) != _strip_prefix(second[0]):
        return None
    return _strip_prefix(first[0])


def _file_name(text: str) -> str:
    """The name of a ``---``/``+++`` line (what follows the marker): up to a tab (a
    timestamp may follow), or the quoted name."""
    unquoted = _unquote(text) if text.startswith('"') else None
    return unquoted[0] if unquoted else text.split("\t", 1)[0].strip()


def _unquote(text: str) -> tuple[str, str] | None:
    """The name git quoted C-style (``"caf\\303\\251.txt"``) at the start of ``text``, and
    the text after it; ``None`` if no well-formed quoted name starts it."""
    match = _QUOTED.match(text)
    if match is None:
        return None
    name = bytearray()
    done = 0
    body = match[1]
    for escape in _C_ESCAPE.finditer(body):
        name += body[done : escape.start()].encode("utf-8", "surrogateescape")
        octal, letter = escape.groups()
        if octal is not None and int(octal, 8) <= 0xFF:
            name.append(int(octal, 8))
        elif letter is not None and letter in _C_ESCAPES:
            name += _C_ESCAPES[letter].encode()
        else:
            return None  # an escape git never writes
        done = escape.end()
    name += body[done:].encode("utf-8", "surrogateescape")
    return name.decode("utf-8", "surrogateescape"), text[match.end() :]


def _strip_prefix(name: str) -> str:
    """The path a header names: without git's ``a/``/``b/`` and leading ``./`` (as
    ``diff -u ./f.txt`` writes it)."""
    return _PREFIX.sub("", name)


class _LineIndex:
    """The file's lines spelled as a string, one character per distinct line content,
    so that finding a hunk is ``str.find`` forwards and backwards from where its header
    says: linear in the file, where trying each offset in turn was quadratic for a hunk
    that matches nowhere. (``str.rfind`` is not linear: the search backwards is a
    forward search of the text reversed.)

    With more distinct lines than there are code points (a file of over a million
    different short lines), each line takes two characters from disjoint ranges, so
    a match can only start on a line.
    """

    def __init__(self, lines: list[str]) -> None:
        self._codes: dict[str, int] = {}
        codes = [self._codes.setdefault(line.rstrip("\r\n"), len(self._codes)) for line in lines]
        self._width = 1 if len(self._codes) <= _CODE_POINTS else 2
        self._text = self._spell(codes)
        self._reversed: str | None = None
        self._count = len(lines)

    def find(self, old: list[str], want: int, floor: int) -> int | None:
        """Where ``old`` matches, nearest to ``want`` (the later of two as near, as
        ``git apply`` and ``patch`` choose) and not before ``floor``."""
        last = self._count - len(old)
        if last < floor:
            return None
        want = min(max(want, floor), last)
        codes = [self._codes.get(line) for line in old]
        if None in codes:
            return None  # a line the file does not hold
        needle = self._spell([code for code in codes if code is not None])
        width = self._width
        before = self._find_back(needle, floor * width, want * width)
        after = self._text.find(needle, want * width, last * width + len(needle))
        if before == -1 and after == -1:
            return None
        if after == -1 or (before != -1 and want * width - before < after - want * width):
            return before // width
        return after // width

    def _find_back(self, needle: str, floor: int, want: int) -> int:
        """The last start of ``needle`` from ``floor`` to ``want`` (offsets in the text)."""
        if self._reversed is None:
            self._reversed = self._text[::-1]
        size = len(self._text)
        found = self._reversed.find(needle[::-1], size - want - len(needle), size - floor)
        return -1 if found == -1 else size - found - len(needle)

    def _spell(self, codes: list[int]) -> str:
        if self._width == 1:
            return "".join(map(chr, codes))
        return "".join(chr(_HIGH + (code >> 16)) + chr(code & 0xFFFF) for code in codes)


def _line_ending(lines: list[str]) -> str | None:
    """The file's line ending, as its first line has it; ``None`` if it has none."""
    if not lines or not lines[0].endswith("\n"):
        return None
    return "\r\n" if lines[0].endswith("\r\n") else "\n"

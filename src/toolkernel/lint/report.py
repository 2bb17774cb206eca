"""Rendering findings as text, JSON or SARIF 2.1.0, and the ``toolkernel lint`` command."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import quote_from_bytes

from toolkernel.lint.findings import FILE_TOOL, RULES, Finding, LintInputError, Severity
from toolkernel.lint.linter import lint_document
from toolkernel.lint.loaders import load_path
from toolkernel.terminal import printable

__all__ = [
    "EXIT_CLEAN",
    "EXIT_ERRORS",
    "FILE_TOOL",
    "Format",
    "path_argument",
    "render",
    "run_lint",
]

Format = Literal["text", "json", "sarif"]

EXIT_CLEAN: Final = 0
EXIT_ERRORS: Final = 1

SARIF_SCHEMA: Final = "https://json.schemastore.org/sarif-2.1.0.json"
# The base that relative file paths in SARIF output are relative to: the directory
# ``toolkernel lint`` ran in, recorded in the run's ``originalUriBaseIds``.
SARIF_SRCROOT: Final = "%SRCROOT%"
_DRIVER: Final = "toolkernel-lint"
# The empty pointer (the whole definition) as text shows it: "/" would be the member "".
_ROOT_POINTER: Final = '""'


def path_argument(text: str) -> Path:
    """A ``PATH`` given to ``toolkernel lint``: ``-`` is standard input (``./-`` names a
    file called ``-``)."""
    return Path("/dev/stdin") if text == "-" else Path(text)


def run_lint(paths: Sequence[Path], fmt: Format) -> tuple[str, int]:
    """Lint definition files and render the findings.

    A file that cannot be read, parsed or recognised as tool definitions draws one
    ``F001`` error finding (tool :data:`FILE_TOOL`, pointer ``""``); the other files
    are still linted.

    Args:
        paths: JSON or TOML files, each holding one definition or a list of them.
        fmt: ``"text"``, ``"json"`` or ``"sarif"``.

    Returns:
        The report and the exit code: 1 if any finding is an error, else 0.
    """
    results: list[tuple[Path, Finding]] = []
    for path in paths:
        try:
            findings = lint_document(load_path(path))
        except LintInputError as exc:
            findings = [Finding(FILE_TOOL, "F001", Severity.ERROR, "", str(exc))]
        results.extend((path, finding) for finding in findings)
    has_error = any(finding.severity is Severity.ERROR for _, finding in results)
    return render(results, fmt), EXIT_ERRORS if has_error else EXIT_CLEAN


def render(results: Sequence[tuple[Path, Finding]], fmt: Format) -> str:
    """Render ``(file, finding)`` pairs in the chosen format."""
    if fmt == "json":
        return json.dumps([_as_json(path, finding) for path, finding in results], indent=2) + "\n"
    if fmt == "sarif":
        return json.dumps(_sarif(results), indent=2) + "\n"
    return _text(results)


def _as_json(path: Path, finding: Finding) -> dict[str, str]:
    return {
        "file": _printable_name(path),
        "tool": finding.tool,
        "rule": finding.rule,
        "severity": str(finding.severity),
        "pointer": finding.pointer,
        "message": finding.message,
    }


def _text(results: Sequence[tuple[Path, Finding]]) -> str:
    lines = [
        printable(
            f"{_printable_name(path)}: {f.tool} {f.rule} {f.severity} "
            f"{f.pointer or _ROOT_POINTER} {f.message}",
            one_line=False,
        )
        for path, f in results
    ]
    errors = sum(1 for _, f in results if f.severity is Severity.ERROR)
    warnings = len(results) - errors
    files = len({path for path, _ in results})
    lines.append(f"{errors} error(s), {warnings} warning(s) in {files} file(s) with findings")
    return "\n".join(lines) + "\n"


def _printable_name(path: Path) -> str:
    """The file's name as text: bytes that are not UTF-8 (from the command line) written
    as ``\\xff`` rather than as lone surrogates, which JSON readers reject or replace."""
    return os.fsencode(path.as_posix()).decode("utf-8", "backslashreplace")


def _sarif(results: Sequence[tuple[Path, Finding]]) -> dict[str, Any]:
    # SARIF wants absolute helpUri/informationUri; the project publishes no URL for its
    # docs, so the rules say where to look in plain text instead.
    rules = [
        {
            "id": rule.id,
            "name": rule.name,
            "shortDescription": {"text": rule.summary},
            "help": {"text": f"{rule.summary} See docs/lint-rules.md#{rule.id.lower()}."},
        }
        for rule in RULES.values()
    ]
    index = {rule_id: position for position, rule_id in enumerate(RULES)}
    run: dict[str, Any] = {
        "tool": {"driver": {"name": _DRIVER, "rules": rules}},
        "results": [_sarif_result(path, f, index[f.rule]) for path, f in results],
    }
    root = _working_directory_uri()
    if root is not None and any(not path.is_absolute() for path, _ in results):
        run["originalUriBaseIds"] = {SARIF_SRCROOT: {"uri": root}}
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def _working_directory_uri() -> str | None:
    try:
        cwd = Path.cwd()
    except OSError:
        return None  # the directory was removed under us; relative URIs stay relative
    return cwd.as_uri().rstrip("/") + "/"


def _artifact_location(path: Path) -> dict[str, str]:
    """A SARIF artifactLocation: a percent-encoded URI, relative ones against %SRCROOT%.

    ``os.fsencode`` keeps file names that are not valid UTF-8 (surrogate escapes from
    the command line) as their original bytes instead of failing to encode them.
    """
    encoded = quote_from_bytes(os.fsencode(path.as_posix()), safe="/")
    if path.is_absolute():
        return {"uri": "file://" + encoded}
    return {"uri": encoded, "uriBaseId": SARIF_SRCROOT}


def _sarif_result(path: Path, finding: Finding, rule_index: int) -> dict[str, Any]:
    location: dict[str, Any] = {"physicalLocation": {"artifactLocation": _artifact_location(path)}}
    message = finding.message
    if finding.tool != FILE_TOOL:
        message = f"{finding.tool}: {message}"
        location["logicalLocations"] = [
            {
                "name": finding.tool,
                "fullyQualifiedName": f"{finding.tool}{finding.pointer}",
                "kind": "member",
            }
        ]
    return {
        "ruleId": finding.rule,
        "ruleIndex": rule_index,
        "level": str(finding.severity),
        "message": {"text": message},
        "locations": [location],
        "properties": {"pointer": finding.pointer},
    }

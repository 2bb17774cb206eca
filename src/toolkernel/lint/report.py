"""Rendering findings as text, JSON or SARIF 2.1.0, and the ``toolkernel lint`` command."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal

from toolkernel.lint.findings import RULES, Finding, LintInputError, Severity
from toolkernel.lint.linter import lint_document
from toolkernel.lint.loaders import load_path

__all__ = ["EXIT_CLEAN", "EXIT_ERRORS", "EXIT_UNREADABLE", "Format", "render", "run_lint"]

Format = Literal["text", "json", "sarif"]

EXIT_CLEAN: Final = 0
EXIT_ERRORS: Final = 1
EXIT_UNREADABLE: Final = 2

SARIF_SCHEMA: Final = "https://json.schemastore.org/sarif-2.1.0.json"
_DRIVER: Final = "toolkernel-lint"


def run_lint(paths: Sequence[Path], fmt: Format) -> tuple[str, int]:
    """Lint definition files and render the findings.

    Args:
        paths: JSON or TOML files, each holding one definition or a list of them.
        fmt: ``"text"``, ``"json"`` or ``"sarif"``.

    Returns:
        The report and the exit code: 1 if any finding is an error, 2 if a file
        cannot be read or holds no tool definitions (the report is then one line
        naming the file and the problem), else 0.
    """
    results: list[tuple[Path, Finding]] = []
    for path in paths:
        try:
            findings = lint_document(load_path(path))
        except LintInputError as exc:
            message = str(exc) if str(exc).startswith(str(path)) else f"{path}: {exc}"
            return f"LintInputError: {message}\n", EXIT_UNREADABLE
        results.extend((path, finding) for finding in findings)
    has_error = any(finding.severity is Severity.ERROR for _, finding in results)
    return render(results, fmt), EXIT_ERRORS if has_error else EXIT_CLEAN


def render(results: Sequence[tuple[Path, Finding]], fmt: Format) -> str:
    """Render ``(file, finding)`` pairs in the chosen format."""
    if fmt == "json":
        return json.dumps([_as_json(finding) for _, finding in results], indent=2) + "\n"
    if fmt == "sarif":
        return json.dumps(_sarif(results), indent=2) + "\n"
    return _text(results)


def _as_json(finding: Finding) -> dict[str, str]:
    return {
        "tool": finding.tool,
        "rule": finding.rule,
        "severity": str(finding.severity),
        "pointer": finding.pointer,
        "message": finding.message,
    }


def _text(results: Sequence[tuple[Path, Finding]]) -> str:
    lines = [
        f"{path}: {f.tool} {f.rule} {f.severity} {f.pointer or '/'} {f.message}"
        for path, f in results
    ]
    errors = sum(1 for _, f in results if f.severity is Severity.ERROR)
    warnings = len(results) - errors
    files = len({path for path, _ in results})
    lines.append(f"{errors} error(s), {warnings} warning(s) in {files} file(s) with findings")
    return "\n".join(lines) + "\n"


def _sarif(results: Sequence[tuple[Path, Finding]]) -> dict[str, Any]:
    rules = [
        {
            "id": rule.id,
            "name": rule.name,
            "shortDescription": {"text": rule.summary},
            "helpUri": f"docs/lint-rules.md#{rule.id.lower()}",
        }
        for rule in RULES.values()
    ]
    index = {rule_id: position for position, rule_id in enumerate(RULES)}
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": _DRIVER,
                        "informationUri": "docs/lint-rules.md",
                        "rules": rules,
                    }
                },
                "results": [_sarif_result(path, f, index[f.rule]) for path, f in results],
            }
        ],
    }


def _sarif_result(path: Path, finding: Finding, rule_index: int) -> dict[str, Any]:
    return {
        "ruleId": finding.rule,
        "ruleIndex": rule_index,
        "level": str(finding.severity),
        "message": {"text": f"{finding.tool}: {finding.message}"},
        "locations": [
            {
                "physicalLocation": {"artifactLocation": {"uri": path.as_posix()}},
                "logicalLocations": [
                    {
                        "name": finding.tool,
                        "fullyQualifiedName": f"{finding.tool}{finding.pointer}",
                        "kind": "member",
                    }
                ],
            }
        ],
        "properties": {"pointer": finding.pointer},
    }

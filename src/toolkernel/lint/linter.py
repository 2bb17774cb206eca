"""Linting one definition or one document of definitions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from toolkernel.lint.findings import Finding, LintInputError, Severity
from toolkernel.lint.hygiene import check_hygiene
from toolkernel.lint.loaders import ToolKind, iter_definitions, view_of
from toolkernel.lint.poisoning import check_poisoning
from toolkernel.lint.schemas import deeper_than

__all__ = ["MAX_DEPTH", "lint_definition", "lint_document"]

# Real tool definitions nest about a dozen levels; the rules walk schemas recursively,
# so anything deeper is refused before they start.
MAX_DEPTH: Final = 64


def lint_definition(
    defn: Mapping[str, Any], *, kind: ToolKind | str | None = None
) -> list[Finding]:
    """Lint one tool definition.

    Args:
        defn: A native ToolDefinition, an MCP Tool, an OpenAI function tool or an
            Anthropic tool, as parsed from JSON or TOML.
        kind: ``"native"``, ``"mcp"``, ``"openai"`` or ``"anthropic"``; detected from
            the keys when None.

    Returns:
        Poisoning findings first, then hygiene findings, each in document order. A
        definition nested more than :data:`MAX_DEPTH` levels deep draws one ``D010``
        error and is not linted further.

    Raises:
        LintInputError: the format cannot be detected or ``kind`` is unknown.
    """
    view = view_of(defn, kind)
    if deeper_than(defn, MAX_DEPTH):
        message = f"too deeply nested (more than {MAX_DEPTH} levels); not linted further"
        return [Finding(view.name, "D010", Severity.ERROR, "", message)]
    return check_poisoning(view) + check_hygiene(view)


def lint_document(data: Any) -> list[Finding]:
    """Lint every definition in a parsed document of any accepted shape.

    Raises:
        LintInputError: the document, or a definition in it, has no accepted shape.
    """
    definitions = iter_definitions(data)
    findings: list[Finding] = []
    for index, defn in enumerate(definitions):
        try:
            findings.extend(lint_definition(defn))
        except LintInputError as exc:
            if defn is data:
                raise  # the document is this one definition: no item to name
            raise LintInputError(f"item {index}: {exc}") from exc
    return findings

"""Linting one definition or one document of definitions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolkernel.lint.findings import Finding
from toolkernel.lint.hygiene import check_hygiene
from toolkernel.lint.loaders import ToolKind, iter_definitions, view_of
from toolkernel.lint.poisoning import check_poisoning

__all__ = ["lint_definition", "lint_document"]


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
        Poisoning findings first, then hygiene findings, each in document order.

    Raises:
        LintInputError: the format cannot be detected or ``kind`` is unknown.
    """
    view = view_of(defn, kind)
    return check_poisoning(view) + check_hygiene(view)


def lint_document(data: Any) -> list[Finding]:
    """Lint every definition in a parsed document of any accepted shape.

    Raises:
        LintInputError: the document, or a definition in it, has no accepted shape.
    """
    return [finding for defn in iter_definitions(data) for finding in lint_definition(defn)]

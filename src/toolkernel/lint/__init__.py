"""``toolkernel lint``: definition hygiene (``D`` rules) and tool-poisoning checks (``P``).

Accepts toolkernel native ToolDefinitions, MCP ``tools/list`` results, OpenAI and
Anthropic tool arrays, as JSON or TOML. See ``docs/lint-rules.md`` for every rule.
"""

from __future__ import annotations

from toolkernel.lint.findings import RULES, Finding, LintInputError, Rule, Severity
from toolkernel.lint.linter import document_budget, lint_definition, lint_document
from toolkernel.lint.loaders import ToolKind
from toolkernel.lint.poisoning import TextBudget
from toolkernel.lint.report import Format, render, run_lint

__all__ = [
    "RULES",
    "Finding",
    "Format",
    "LintInputError",
    "Rule",
    "Severity",
    "TextBudget",
    "ToolKind",
    "document_budget",
    "lint_definition",
    "lint_document",
    "render",
    "run_lint",
]

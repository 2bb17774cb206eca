"""Linting one definition or one document of definitions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

from toolkernel.lint.findings import FILE_TOOL, SERVER_TOOL, Finding, LintInputError, Severity
from toolkernel.lint.hygiene import check_hygiene
from toolkernel.lint.loaders import (
    ToolKind,
    ToolView,
    iter_definitions,
    not_an_object,
    server_text,
    view_of,
)
from toolkernel.lint.poisoning import (
    MAX_DEFINITION_CHARS,
    MAX_DOCUMENT_CHARS,
    TextBudget,
    check_poisoning,
)
from toolkernel.lint.schemas import deeper_than

__all__ = ["MAX_DEPTH", "document_budget", "lint_definition", "lint_document"]

# Real tool definitions nest about a dozen levels; the rules walk schemas recursively,
# so anything deeper is refused before they start.
MAX_DEPTH: Final = 64


def lint_definition(
    defn: Mapping[str, Any],
    *,
    kind: ToolKind | str | None = None,
    within: TextBudget | None = None,
) -> list[Finding]:
    """Lint one tool definition.

    Args:
        defn: A native ToolDefinition, an MCP Tool, an OpenAI function tool or an
            Anthropic tool, as parsed from JSON or TOML.
        kind: ``"native"``, ``"mcp"``, ``"openai"`` or ``"anthropic"``; detected from
            the keys when None.
        within: The budget of the document the definition is part of (a server's
            whole ``tools/list``), charged too: :func:`document_budget`.

    Returns:
        Poisoning findings first, then hygiene findings, each in document order. A
        definition nested more than :data:`MAX_DEPTH` levels deep draws one ``D010``
        error and is not linted further; one holding more than
        :data:`~toolkernel.lint.poisoning.MAX_DEFINITION_CHARS` characters of text
        draws a ``P114`` error where the rules stopped reading.

    Raises:
        LintInputError: the format cannot be detected or ``kind`` is unknown.
    """
    return _lint(defn, kind, TextBudget(MAX_DEFINITION_CHARS, scope="definition", within=within))


def document_budget(scope: str = "document") -> TextBudget:
    """A fresh budget of :data:`~toolkernel.lint.poisoning.MAX_DOCUMENT_CHARS`
    characters, for the definitions of one document linted one by one; ``scope`` names
    the document in a ``P114`` message."""
    return TextBudget(MAX_DOCUMENT_CHARS, scope=scope)


def lint_document(data: Any) -> list[Finding]:
    """Lint every definition in a parsed document of any accepted shape.

    An item of a list that is not a tool definition draws an ``F001`` error naming it
    (tool ``"<file>"``); the other items are still linted. A second tool with a name
    already used draws a ``D013`` error. What a ``{"tools": [...]}`` document holds
    beside its tools (a server's instructions, prompts, resources) is read by the ``P``
    rules as tool ``"<server>"``, with pointers into the document. The rules read at
    most :data:`~toolkernel.lint.poisoning.MAX_DOCUMENT_CHARS` characters of text in
    the whole document: each definition past that draws a ``P114`` error instead.

    Raises:
        LintInputError: the document has no accepted shape, or is one definition whose
            format cannot be detected.
    """
    document = document_budget()
    findings: list[Finding] = []
    named: dict[str, int] = {}
    for index, defn in enumerate(iter_definitions(data)):
        problem = not_an_object(defn)
        if problem is not None:
            findings.append(_unlintable(f"item {index} {problem}"))
            continue
        try:
            findings.extend(lint_definition(defn, within=document))
        except LintInputError as exc:
            if defn is data:
                raise  # the document is this one definition: no item to name
            findings.append(_unlintable(f"item {index}: {exc}"))
            continue
        view = view_of(defn)
        first = named.setdefault(view.name, index)
        if first != index and view.name != "<unnamed>":
            message = (
                f"item {index} has the same name as item {first}: a client keeps one of them, "
                "and the pointers of both tools' findings look alike"
            )
            findings.append(
                Finding(view.name, "D013", Severity.ERROR, view.pointer("name"), message)
            )
    beside = server_text(data)
    if beside is not None:
        rest, base = beside
        server = ToolView(ToolKind.MCP, rest, {"name": SERVER_TOOL}, "", "inputSchema", None)
        budget = TextBudget(MAX_DEFINITION_CHARS, scope="server text", within=document)
        found = check_poisoning(server, budget)
        findings.extend(replace(f, pointer=base + f.pointer) for f in found)
    return findings


def _unlintable(message: str) -> Finding:
    return Finding(FILE_TOOL, "F001", Severity.ERROR, "", message)


def _lint(
    defn: Mapping[str, Any], kind: ToolKind | str | None, budget: TextBudget
) -> list[Finding]:
    view = view_of(defn, kind)
    if deeper_than(defn, MAX_DEPTH):
        message = f"too deeply nested (more than {MAX_DEPTH} levels); not linted further"
        return [Finding(view.name, "D010", Severity.ERROR, "", message)]
    if view.kind is ToolKind.BUILTIN:
        return check_poisoning(view, budget)  # the provider defines its schema
    return check_poisoning(view, budget) + check_hygiene(view)

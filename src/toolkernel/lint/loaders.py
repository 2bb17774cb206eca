"""Reading definition files and normalising the four tool formats into one view.

Accepted shapes, detected per definition: toolkernel native ToolDefinitions
(camelCase), MCP ``Tool`` objects (alone, in a ``tools/list`` result, or inside a
JSON-RPC response), OpenAI function tools (Chat Completions nested form and the
Responses-API flat form) and Anthropic tools. Rules read a :class:`ToolView`, so each
rule is written once and reports pointers into the definition exactly as given.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from toolkernel.lint.findings import LintInputError

__all__ = ["ToolKind", "ToolView", "detect_kind", "iter_definitions", "load_path", "view_of"]

# Keys only a native ToolDefinition carries; any one of them beside inputSchema means
# "native" rather than "MCP" (MCP tools have inputSchema too).
_NATIVE_KEYS: Final = frozenset(
    {
        "executionMode",
        "permissions",
        "safety",
        "timeoutMs",
        "outputContract",
        "retry",
        "idempotent",
        "concurrencyGroup",
        "version",
    }
)


class ToolKind(StrEnum):
    """The format a definition was written in."""

    NATIVE = "native"
    MCP = "mcp"
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


@dataclass(frozen=True, slots=True)
class ToolView:
    """One definition, format-neutral.

    ``fields`` is the mapping that holds name/description/schema (for the OpenAI Chat
    form that is the nested ``function`` object) and ``base`` is its JSON pointer, so
    ``base + "/description"`` points into the definition as given.

    Attributes:
        kind: The detected or stated format.
        raw: The definition as given.
        fields: The mapping holding the tool's own fields.
        base: JSON pointer of ``fields`` inside ``raw`` (``""`` or ``"/function"``).
        input_key: The key of the input schema in ``fields`` for this format.
        output_key: The key of the output contract, or None if the format has none.
    """

    kind: ToolKind
    raw: Mapping[str, Any]
    fields: Mapping[str, Any]
    base: str
    input_key: str
    output_key: str | None

    @property
    def name(self) -> str:
        """The tool's name, or ``"<unnamed>"`` when it has no string name."""
        name = self.fields.get("name")
        return name if isinstance(name, str) and name else "<unnamed>"

    @property
    def input_schema(self) -> Any:
        """The input schema as given (None when absent)."""
        return self.fields.get(self.input_key)

    @property
    def output_contract(self) -> Any:
        """The output contract or schema as given (None when absent or inexpressible)."""
        return None if self.output_key is None else self.fields.get(self.output_key)

    @property
    def annotations(self) -> Mapping[str, Any]:
        """MCP behaviour hints (readOnlyHint, destructiveHint, …); empty if none."""
        annotations = self.fields.get("annotations")
        return annotations if isinstance(annotations, Mapping) else {}

    def pointer(self, *keys: str | int) -> str:
        """JSON pointer to ``keys`` below this tool's fields, escaped per RFC 6901."""
        return self.base + "".join("/" + escape_token(key) for key in keys)


def escape_token(key: str | int) -> str:
    """Escape one JSON-pointer reference token."""
    return str(key).replace("~", "~0").replace("/", "~1")


def detect_kind(defn: Mapping[str, Any]) -> ToolKind | None:
    """Guess the format of one definition from its keys; None if none fits."""
    if defn.get("type") == "function":
        return ToolKind.OPENAI
    if "input_schema" in defn:
        return ToolKind.ANTHROPIC
    if "inputSchema" in defn:
        return ToolKind.NATIVE if _NATIVE_KEYS & defn.keys() else ToolKind.MCP
    if "parameters" in defn and "name" in defn:
        return ToolKind.OPENAI  # the legacy ``functions=[…]`` shape
    if _NATIVE_KEYS & defn.keys() and "name" in defn:
        return ToolKind.NATIVE
    return None


def view_of(defn: Mapping[str, Any], kind: ToolKind | str | None = None) -> ToolView:
    """Normalise one definition.

    Args:
        defn: The definition as given.
        kind: Its format; detected from the keys when None.

    Raises:
        LintInputError: the format cannot be detected or ``kind`` is unknown.
    """
    if kind is None:
        detected = detect_kind(defn)
        if detected is None:
            keys = ", ".join(sorted(map(str, defn.keys()))[:8]) or "no keys"
            raise LintInputError(f"not a recognised tool definition (keys: {keys})")
        kind = detected
    try:
        kind = ToolKind(kind)
    except ValueError:
        raise LintInputError(f"unknown definition kind {kind!r}") from None
    if kind is ToolKind.OPENAI:
        nested = defn.get("function")
        if isinstance(nested, Mapping):
            return ToolView(kind, defn, nested, "/function", "parameters", None)
        return ToolView(kind, defn, defn, "", "parameters", None)
    if kind is ToolKind.ANTHROPIC:
        return ToolView(kind, defn, defn, "", "input_schema", None)
    if kind is ToolKind.MCP:
        return ToolView(kind, defn, defn, "", "inputSchema", "outputSchema")
    return ToolView(kind, defn, defn, "", "inputSchema", "outputContract")


def iter_definitions(data: Any) -> list[Mapping[str, Any]]:
    """The definitions held by a document of any accepted shape.

    A document is one definition, a list of definitions, a ``{"tools": [...]}``
    container (MCP ``tools/list`` result, a server snapshot, a TOML file with
    ``[[tools]]``) or a JSON-RPC response whose ``result`` is such a container.

    Raises:
        LintInputError: the document has none of these shapes.
    """
    if isinstance(data, Mapping) and isinstance(data.get("result"), Mapping):
        data = data["result"]
    if isinstance(data, Mapping) and isinstance(data.get("tools"), list):
        data = data["tools"]
    if isinstance(data, Mapping):
        return [data]
    if isinstance(data, list):
        for index, item in enumerate(data):
            if not isinstance(item, Mapping):
                raise LintInputError(f"item {index} is a {type(item).__name__}, not an object")
        return list(data)
    raise LintInputError(f"expected an object or a list of tools, got {type(data).__name__}")


def load_path(path: Path) -> Any:
    """Parse a definition file as JSON or TOML (by suffix, else by trying both).

    Raises:
        LintInputError: the file cannot be read or parsed.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LintInputError(f"{path}: cannot read: {exc}") from exc
    parsers: tuple[Callable[[str], Any], ...] = (_parse_json, _parse_toml)
    if path.suffix == ".toml":
        parsers = (_parse_toml,)
    elif path.suffix == ".json":
        parsers = (_parse_json,)
    problems: list[str] = []
    for parse in parsers:
        try:
            return parse(text)
        except ValueError as exc:  # JSONDecodeError and TOMLDecodeError are ValueErrors
            problems.append(str(exc))
    raise LintInputError(f"{path}: not valid JSON or TOML: {problems[0]}")


def _parse_json(text: str) -> Any:
    return json.loads(text)


def _parse_toml(text: str) -> Any:
    return tomllib.loads(text)

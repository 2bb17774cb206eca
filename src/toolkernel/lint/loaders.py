"""Reading definition files and normalising the four tool formats into one view.

Accepted shapes, detected per definition: toolkernel native ToolDefinitions
(camelCase), MCP ``Tool`` objects (alone, in a ``tools/list`` result, or inside a
JSON-RPC response), OpenAI function tools (Chat Completions nested form and the
Responses-API flat form) and Anthropic tools. Rules read a :class:`ToolView`, so each
rule is written once and reports pointers into the definition exactly as given.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from toolkernel.definition import parse_definition_json
from toolkernel.lint.findings import LintInputError

__all__ = [
    "MAX_FILE_BYTES",
    "ToolKind",
    "ToolView",
    "detect_kind",
    "iter_definitions",
    "load_path",
    "not_an_object",
    "server_text",
    "view_of",
]

# Far above any real tool list; stops ``lint /dev/zero`` from reading forever.
MAX_FILE_BYTES: Final = 16 * 2**20

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
    # A tool the provider defines (Anthropic's bash_20250124, OpenAI's web_search) or an
    # OpenAI custom tool: no input schema to check, but its text reaches the model.
    BUILTIN = "builtin"


# OpenAI Responses tools that are not functions; Anthropic's carry a date (bash_20250124).
_OPENAI_BUILTINS: Final = frozenset(
    {
        "custom",
        "web_search",
        "web_search_preview",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer_use_preview",
        "local_shell",
        "shell",
        "apply_patch",
        "mcp",
    }
)
_DATED_BUILTIN: Final = re.compile(r"[a-z][a-z0-9_]*_\d{8}")


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
        if isinstance(name, str) and name:
            return name
        kind = self.fields.get("type")  # a provider's own tool may have only its type
        if self.kind is ToolKind.BUILTIN and isinstance(kind, str):
            return kind
        return "<unnamed>"

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
    """Guess the format of one definition from its keys; None if none fits.

    ``inputSchema`` decides first: an MCP tool with a stray ``type: function`` or
    ``input_schema`` beside it is still linted as the bridge lints it.
    """
    if "inputSchema" in defn:
        return ToolKind.NATIVE if _NATIVE_KEYS & defn.keys() else ToolKind.MCP
    if defn.get("type") == "function":
        return ToolKind.OPENAI
    if "input_schema" in defn:
        return ToolKind.ANTHROPIC
    if "parameters" in defn and "name" in defn:
        return ToolKind.OPENAI  # the legacy ``functions=[…]`` shape
    if _NATIVE_KEYS & defn.keys() and "name" in defn:
        return ToolKind.NATIVE
    kind = defn.get("type")
    if isinstance(kind, str) and (kind in _OPENAI_BUILTINS or _DATED_BUILTIN.fullmatch(kind)):
        return ToolKind.BUILTIN
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
            keys = ", ".join(sorted(map(repr, defn.keys()))[:8]) or "none"
            raise LintInputError(
                "not a recognised tool definition: an object with none of inputSchema, "
                "input_schema, parameters, type: function or the type of a provider's own "
                f"tool (keys: {keys})"
            )
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
    if kind is ToolKind.BUILTIN:
        return ToolView(kind, defn, defn, "", "input_schema", None)
    if kind is ToolKind.MCP:
        return ToolView(kind, defn, defn, "", "inputSchema", "outputSchema")
    return ToolView(kind, defn, defn, "", "inputSchema", "outputContract")


def iter_definitions(data: Any) -> list[Any]:
    """The items of a document of any accepted shape, each meant to be a definition.

    A document is one definition, a list of definitions, a ``{"tools": [...]}``
    container (MCP ``tools/list`` result, a server snapshot, a TOML file with
    ``[[tools]]``) or a JSON-RPC response whose ``result`` is such a container. The
    items of a list are not checked here (see :func:`not_an_object`): one stray item
    should not hide the findings of the others.

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
        return list(data)
    raise LintInputError(
        f'holds {_json_type(data)}, not a tool definition, a list of them or {{"tools": [...]}}'
    )


def server_text(data: Any) -> tuple[dict[str, Any], str] | None:
    """What a document holds beside its tools, and its JSON pointer: a server snapshot's
    ``server_info``, an initialize result's ``instructions``, prompts and resources,
    which MCP clients show the model too. None when the document is no container."""
    base = ""
    if isinstance(data, Mapping) and isinstance(data.get("result"), Mapping):
        data, base = data["result"], "/result"
    if not (isinstance(data, Mapping) and isinstance(data.get("tools"), list)):
        return None
    rest = {key: value for key, value in data.items() if key != "tools"}
    return (rest, base) if rest else None


def not_an_object(item: Any) -> str | None:
    """Why an item of a list cannot be a definition, or None if it is an object."""
    if isinstance(item, Mapping):
        return None
    return f"is {_json_type(item)}, not a tool definition object"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else f"a {type(value).__name__}"


def load_path(path: Path) -> Any:
    """Parse a definition file as JSON or TOML (by suffix, else by trying both).

    Raises:
        LintInputError: the file cannot be read or parsed; the message says why
            without repeating the path.
    """
    data = _read(path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LintInputError(
            f"not UTF-8 text (a binary file or another encoding): byte 0x{data[exc.start]:02x} "
            f"at offset {exc.start}"
        ) from exc
    if "\0" in text:
        raise LintInputError("holds NUL bytes: a binary file, not JSON or TOML")
    if not text.strip():
        raise LintInputError("empty file")
    parsers: dict[str, Callable[[str], Any]] = {
        "JSON": parse_definition_json,
        "TOML": tomllib.loads,
    }
    if path.suffix in {".json", ".toml"}:
        only = path.suffix[1:].upper()
        parsers = {only: parsers[only]}
    problems: list[str] = []
    for parse in parsers.values():
        try:
            return parse(text)
        except RecursionError as exc:
            # Both parsers recurse once per level; hostile nesting must not crash the run.
            raise LintInputError("too deeply nested to parse") from exc
        except ValueError as exc:  # JSONDecodeError and TOMLDecodeError are ValueErrors
            problems.append(str(exc))
    raise LintInputError(f"not valid {' or '.join(parsers)}: {problems[0]}")


def _open_nonblocking(path: str, flags: int) -> int:
    # Opening a named pipe waits for a writer, possibly forever; O_NONBLOCK opens it at
    # once. Reads block again afterwards, so a pipe with a writer (`<(…)`) is read to
    # its end, and one with no writer reads as empty.
    return os.open(path, flags | os.O_NONBLOCK)


def _read(path: Path) -> bytes:
    try:
        with open(path, "rb", opener=_open_nonblocking) as file:
            os.set_blocking(file.fileno(), True)
            data = file.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError as exc:
        raise LintInputError("no such file") from exc
    except IsADirectoryError as exc:
        raise LintInputError("is a directory; name the definition files in it") from exc
    except PermissionError as exc:
        raise LintInputError("permission denied") from exc
    except OSError as exc:
        raise LintInputError(f"cannot read: {exc.strerror or exc}") from exc
    if len(data) > MAX_FILE_BYTES:
        raise LintInputError(f"larger than {MAX_FILE_BYTES // 2**20} MiB")
    return data

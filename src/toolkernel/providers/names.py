"""Provider-safe tool names, mapped reversibly, and what every provider module shares.

Tool names are namespaced with dots (``repo.search``); OpenAI and Anthropic accept only
``^[a-zA-Z0-9_-]{1,64}$``. A ``NameMap`` is built once from the tool set shown to the
model: it spells each name the provider's way (``repo.search`` → ``repo__search``) and
reads the model's spelling back. Reading back is a table lookup, never a string
transform, so a name the model invents stays as it is and the kernel refuses it as
UNKNOWN_TOOL.

The rest is shared by the provider modules: ``ProviderFormatError``, reading fields
from SDK objects and plain mappings alike, the JSON text of a model projection, and
results put back under the ids the model gave its calls.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from toolkernel.calls import ToolCallResult
from toolkernel.definition import ToolDefinition
from toolkernel.errors import DefinitionError, ToolkernelError, UsageError
from toolkernel.run import ToolCall

__all__ = [
    "NameMap",
    "ProviderFormatError",
    "ProviderNameError",
    "answering",
    "as_json_text",
    "is_record",
    "load_document",
    "projection_json",
    "provider_name",
    "read_field",
]

MAX_NAME_LENGTH: Final = 64
_UNSAFE_CHAR: Final = re.compile(r"[^a-zA-Z0-9_-]")
_HASH_CHARS: Final = 8


class ProviderFormatError(ToolkernelError):
    """A provider response is not that provider's shape at all (no ``choices``, …).

    Malformed *tool calls* inside a well-shaped response never raise: they become
    ToolCalls that the kernel refuses with a specific code.
    """


class ProviderNameError(DefinitionError):
    """Two tools would share one provider name, so calls could not be told apart."""

    def __init__(self, tool: str, other: str, provider: str) -> None:
        self.other = other
        self.provider = provider
        super().__init__(
            tool, "name", f"maps to provider name {provider!r}, as does tool {other!r}"
        )


def provider_name(tool_name: str) -> str:
    """Spell ``tool_name`` the way OpenAI and Anthropic accept.

    Dots become ``__`` (``repo.search`` → ``repo__search``); any other character
    outside ``[a-zA-Z0-9_-]`` becomes ``_``. A result longer than 64 characters is cut
    to 55 and suffixed with ``_`` and 8 hex digits of the full name's sha256, so that
    long names stay distinct and deterministic.

    Args:
        tool_name: the tool's namespaced name.

    Returns:
        A name matching ``^[a-zA-Z0-9_-]{1,64}$``.
    """
    safe = _UNSAFE_CHAR.sub("_", tool_name.replace(".", "__")) or "_"
    if len(safe) <= MAX_NAME_LENGTH:
        return safe
    # toolkernel allows 128-character names; cutting alone would make siblings such as
    # `api.Client.get_website_a` / `…_b` collide, so the hash of the whole name decides.
    digest = hashlib.sha256(tool_name.encode("utf-8")).hexdigest()[:_HASH_CHARS]
    return f"{safe[: MAX_NAME_LENGTH - _HASH_CHARS - 1]}_{digest}"


@dataclass(frozen=True, slots=True)
class NameMap:
    """Tool names ↔ provider names for one tool set, plus the tools' input schemas.

    Build it with ``NameMap.build`` from the definitions the model is shown; parsers
    use it to read names back, and the OpenAI parsers use the schemas to undo the
    nullability strict mode adds (see ``toolkernel.providers.schemas``).

    Attributes:
        to_provider: tool name → provider name.
        to_tool: provider name → tool name.
        schemas: tool name → input schema.
    """

    to_provider: Mapping[str, str] = field(default_factory=dict)
    to_tool: Mapping[str, str] = field(default_factory=dict)
    schemas: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def build(cls, definitions: Iterable[ToolDefinition]) -> NameMap:
        """Map every definition's name, refusing two tools that share a provider name.

        Args:
            definitions: the tool set shown to the model (several versions of one
                tool share a name and are fine).

        Returns:
            The map.

        Raises:
            ProviderNameError: two different tools map to the same provider name; the
                error names both.
        """
        to_provider: dict[str, str] = {}
        to_tool: dict[str, str] = {}
        schemas: dict[str, Mapping[str, Any]] = {}
        for definition in definitions:
            name = definition.name
            mapped = provider_name(name)
            other = to_tool.setdefault(mapped, name)
            if other != name:
                raise ProviderNameError(name, other, mapped)
            to_provider[name] = mapped
            schemas[name] = definition.input_schema
        return cls(
            MappingProxyType(to_provider), MappingProxyType(to_tool), MappingProxyType(schemas)
        )

    def provider_name(self, tool_name: str) -> str:
        """The provider's spelling of a tool in this set (computed for others)."""
        return self.to_provider.get(tool_name) or provider_name(tool_name)

    def respell(self, text: str) -> str:
        """``text`` with the tool names of this set spelled the provider's way: a safe
        message names tools as the kernel does (``file.read``), the model knows them as
        it was shown them (``file__read``)."""
        renamed = {n: p for n, p in self.to_provider.items() if n != p and n in text}
        if not renamed:
            return text
        names = "|".join(re.escape(n) for n in sorted(renamed, key=len, reverse=True))
        # A whole name: not part of a longer one (``file.read`` in ``file.read_all``),
        # nor of a path (``notes/file.read``, ``~/shell.run``).
        whole = re.compile(rf"(?<![\w./~-])(?:{names})(?![\w/-]|\.[\w-])")
        return whole.sub(lambda match: renamed[match.group()], text)

    def tool_name(self, provider_name: str) -> str:
        """The tool a provider name stands for; an unknown name is returned unchanged."""
        return self.to_tool.get(provider_name, provider_name)


# -- reading provider payloads ---------------------------------------------------------


def load_document(response: Any, what: str) -> Any:
    """A response as given, or decoded when it is JSON text.

    Raises:
        ProviderFormatError: the text is not JSON.
    """
    if not isinstance(response, str | bytes | bytearray):
        return response
    try:
        return json.loads(response)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, huge ints
        raise ProviderFormatError(f"{what}: the response is not JSON") from exc


def is_record(value: Any) -> bool:
    """Whether ``value`` is a JSON object or an SDK object standing for one."""
    if isinstance(value, Mapping):
        return True
    return not isinstance(value, str | bytes | bytearray | int | float | list | tuple | None)


def read_field(record: Any, key: str) -> Any:
    """``record[key]`` of a mapping, ``record.key`` of an SDK object, else None."""
    if isinstance(record, Mapping):
        return record.get(key)
    return getattr(record, key, None) if is_record(record) else None


def as_json_text(value: Any) -> str:
    """JSON text for a value that should have been arguments text or an object.

    The kernel's argument parser then refuses it with the specific code (a number or a
    list is ARGUMENTS_NOT_OBJECT, NaN is NON_FINITE_NUMBER); a value JSON cannot carry
    becomes text that is not JSON (ARGUMENTS_NOT_JSON).
    """
    try:
        return json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return f"<{type(value).__name__}>"


def projection_json(result: ToolCallResult, names: NameMap | None = None) -> str:
    """The model projection of ``result`` as compact JSON text: all a model may see;
    with ``names``, its safe message names tools as the model was shown them."""
    projection = result.projection()
    if names is not None:
        projection["safeMessage"] = names.respell(projection["safeMessage"])
    return json.dumps(projection, ensure_ascii=False, separators=(",", ":"))


def answering(
    calls: Sequence[ToolCall] | None, results: Sequence[ToolCallResult]
) -> Sequence[ToolCallResult]:
    """``results`` under the ids the model gave their ``calls`` (as they are without calls).

    The ledger keeps the kernel's own id for a call: one made up for a call without an
    id (some OpenAI-compatible servers send ``""``), and NUL or a lone surrogate written
    as an escape. A provider expects every call of the turn answered under the id it
    sent.

    Raises:
        UsageError: ``calls`` and ``results`` differ in number.
    """
    if calls is None:
        return results
    if len(calls) != len(results):
        raise UsageError(
            f"{len(results)} results for {len(calls)} calls: pass the calls the results "
            "answer, in the order they were run"
        )
    return [_answering(call, result) for call, result in zip(calls, results, strict=True)]


def _answering(call: ToolCall, result: ToolCallResult) -> ToolCallResult:
    if call.tool_call_id is None or call.tool_call_id == result.tool_call_id:
        return result
    return result.with_(tool_call_id=call.tool_call_id)

"""The registry: tools by name and version, each schema compiled once at registration."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from toolkernel.definition import ExecutionMode, ToolDefinition
from toolkernel.errors import DefinitionError
from toolkernel.functions import FunctionTool
from toolkernel.schema import CompiledSchema, compile_schema

__all__ = ["RegisteredTool", "Registry", "version_key"]

PATH_FORMAT = "workspace-path"


@dataclass(frozen=True, slots=True)
class RegisteredTool:
    """A definition ready to be called: compiled validators and its implementation."""

    definition: ToolDefinition
    validator: CompiledSchema
    output_validator: CompiledSchema | None
    handler: Callable[..., Any] | None
    context_parameter: str | None
    takes_paths: bool
    is_async: bool = field(init=False, compare=False)
    """Whether the handler is a coroutine function (found once, not per call)."""
    integer_parameters: tuple[str, ...] = field(init=False, compare=False)
    """Top-level ``"type": "integer"`` properties: JSON Schema counts ``1.0`` as an
    integer, so such a value reaches the handler as ``int`` (``1``), not ``1.0``."""

    def __post_init__(self) -> None:
        is_async = self.handler is not None and inspect.iscoroutinefunction(self.handler)
        object.__setattr__(self, "is_async", is_async)
        properties = self.definition.input_schema.get("properties", {})
        integers = tuple(
            name
            for name, schema in properties.items()
            if isinstance(schema, Mapping) and _is_integer(schema)
        )
        object.__setattr__(self, "integer_parameters", integers)

    @property
    def name(self) -> str:
        return self.definition.name


def _is_integer(schema: Mapping[str, Any]) -> bool:
    """Only whole numbers are allowed: ``"type": "integer"``, alone or with ``null``
    (``int | None``, also as ``anyOf``), and no ``number`` anywhere beside it."""
    kind = schema.get("type")
    if kind == "integer":
        return True
    if isinstance(kind, list):
        return "integer" in kind and "number" not in kind
    options = [o for o in schema.get("anyOf", ()) if isinstance(o, Mapping)]
    kinds = [option.get("type") for option in options]
    return "integer" in kinds and all(k in ("integer", "null") for k in kinds)


def version_key(version: str) -> tuple[Any, ...]:
    """Order versions as semantic versions do, numerically where they are numbers:
    1.10 > 1.9 > 1.9-rc.10 > 1.9-rc.9 > 1.9-rc. A pre-release (after the first ``-``)
    comes before its release; build metadata (after ``+``) does not rank, it only keeps
    the order of two builds of one version stable."""
    core, _, build = version.partition("+")
    release, dash, pre = core.partition("-")
    stage = (0, _parts(pre)) if dash else (1, ())
    return (_parts(release), stage, build)


def _parts(text: str) -> tuple[tuple[int, int | str], ...]:
    """``v1.10rc2`` → v, 1, 10, rc, 2: numbers rank by value, and above words."""
    tokens = re.findall(r"\d+|[^\d._-]+", text)
    return tuple((1, int(t)) if t.isdigit() else (0, t) for t in tokens)


class Registry:
    """Tools by name; several versions side by side; no version means the newest."""

    def __init__(self) -> None:
        self._tools: dict[str, dict[str, RegisteredTool]] = {}
        self._newest: dict[str, RegisteredTool] = {}

    def register(
        self,
        tool: FunctionTool | ToolDefinition | Mapping[str, Any],
        handler: Callable[..., Any] | None = None,
        *,
        context_parameter: str | None = None,
        replace: bool = False,
    ) -> RegisteredTool:
        """Register a tool.

        Args:
            tool: a ``@tool`` function, a definition, or a definition's camelCase mapping.
            handler: the implementation of a NATIVE definition given as data.
            context_parameter: the handler's parameter that receives the ToolContext.
            replace: allow replacing an existing (name, version).

        Raises:
            DefinitionError: the definition is invalid, already registered, or a NATIVE
                tool has no implementation.
        """
        if isinstance(tool, FunctionTool):
            definition, handler = tool.definition, tool.function
            context_parameter = tool.context_parameter
        elif isinstance(tool, ToolDefinition):
            # Built in Python, it skipped the contract's checks that from_dict makes.
            ToolDefinition.from_dict(tool.to_dict())
            definition = tool
        else:
            definition = ToolDefinition.from_dict(tool)
        if definition.execution_mode is ExecutionMode.NATIVE and handler is None:
            raise DefinitionError(
                definition.name, "executionMode", "a NATIVE tool needs a Python implementation"
            )
        versions = self._tools.setdefault(definition.name, {})
        if definition.version in versions and not replace:
            raise DefinitionError(
                definition.name,
                "version",
                f"version {definition.version} is already registered",
            )
        schema = definition.output_contract.schema
        registered = RegisteredTool(
            definition=definition,
            validator=compile_schema(definition.input_schema, check_schema=False),
            output_validator=compile_schema(schema) if schema is not None else None,
            handler=handler,
            context_parameter=context_parameter,
            takes_paths=_mentions_path_format(definition.input_schema),
        )
        versions[definition.version] = registered
        self._newest[definition.name] = versions[max(versions, key=version_key)]
        return registered

    def unregister(self, name: str, version: str | None = None) -> None:
        """Remove one version, or every version when ``version`` is None."""
        versions = self._tools.get(name, {})
        if version is None:
            versions.clear()
        else:
            versions.pop(version, None)
        if versions:
            self._newest[name] = versions[max(versions, key=version_key)]
        else:
            self._tools.pop(name, None)
            self._newest.pop(name, None)

    def find(self, name: str, version: str | None = None) -> RegisteredTool | None:
        """The named version, or the newest one when ``version`` is None."""
        if version is None:
            return self._newest.get(name)
        versions = self._tools.get(name)
        return versions.get(version) if versions else None

    def versions(self, name: str) -> list[str]:
        return sorted(self._tools.get(name, {}), key=version_key)

    def latest(self) -> list[RegisteredTool]:
        """The newest version of every tool, sorted by name."""
        return [tool for name in sorted(self._tools) if (tool := self.find(name)) is not None]

    def __iter__(self) -> Iterator[RegisteredTool]:
        for name in sorted(self._tools):
            yield from self._tools[name].values()

    def __len__(self) -> int:
        return sum(len(v) for v in self._tools.values())


def _mentions_path_format(schema: Any) -> bool:
    if isinstance(schema, Mapping):
        if schema.get("format") == PATH_FORMAT:
            return True
        return any(_mentions_path_format(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_mentions_path_format(v) for v in schema)
    return False

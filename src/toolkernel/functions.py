"""Python functions as tools: ``@tool`` derives a strict input schema from type hints.

::

    @tool("notes.append", mutating=True, idempotent=False)
    def append(key: Annotated[str, MaxLen(64)], text: Annotated[str, MaxLen(2000)]) -> dict:
        '''Append text to a note.

        Args:
            key: the note's name.
            text: what to append.
        '''

The schema is 2020-12 with ``additionalProperties: false`` at every object level;
bounds come from ``annotated_types`` metadata (``MaxLen``, ``Ge``, ``Interval`` …);
parameter descriptions come from the Google/NumPy/reST docstring. A parameter
annotated ``ToolContext`` is injected by the runtime and stays out of the schema.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, get_args, get_origin, get_type_hints

import annotated_types as at
import docstring_parser

from toolkernel.context import ToolContext
from toolkernel.definition import (
    ConcurrencyGroup,
    ExecutionMode,
    Permissions,
    RetryPolicy,
    ToolDefinition,
)
from toolkernel.errors import DefinitionError

__all__ = [
    "NO_NUL",
    "NO_NUL_PATTERN",
    "WORKSPACE_PATH",
    "Format",
    "FunctionTool",
    "Pattern",
    "WorkspacePath",
    "schema_from_function",
    "tool",
]


@dataclass(frozen=True, slots=True)
class Format:
    """``Annotated`` metadata that sets a string's JSON Schema ``format``."""

    name: str


@dataclass(frozen=True, slots=True)
class Pattern:
    """``Annotated`` metadata that sets a string's JSON Schema ``pattern`` (ECMA-262)."""

    regex: str


WORKSPACE_PATH: Final = Format("workspace-path")
NO_NUL_PATTERN: Final = "^[^\\u0000]*$"
NO_NUL: Final = Pattern(NO_NUL_PATTERN)
"""Text that becomes a process argument or a search pattern: a NUL cannot be passed."""
WorkspacePath = Annotated[str, WORKSPACE_PATH, at.MaxLen(4096)]
"""A workspace-relative path; the runtime's path guard checks every such argument."""


@dataclass(frozen=True, slots=True)
class FunctionTool:
    """A definition bound to the Python callable that implements it."""

    definition: ToolDefinition
    function: Callable[..., Any]
    context_parameter: str | None = None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.function)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)


def tool(
    name: str,
    *,
    version: str = "1.0",
    title: str | None = None,
    description: str | None = None,
    execution_mode: ExecutionMode = ExecutionMode.NATIVE,
    permissions: Permissions | None = None,
    mutating: bool = False,
    destructive: bool = False,
    external: bool = False,
    timeout_ms: int = 30_000,
    idempotent: bool = False,
    retry: RetryPolicy | None = None,
    tags: Sequence[str] = (),
    concurrency_group: ConcurrencyGroup | None = None,
    output_schema: Mapping[str, Any] | None = None,
    max_output_bytes: int = 16_384,
) -> Callable[[Callable[..., Any]], FunctionTool]:
    """Turn a function into a tool with a strict schema derived from its signature.

    Raises:
        DefinitionError: a parameter's type cannot be expressed as a strict schema, or
            the resulting definition breaks the contract.
    """

    def decorate(function: Callable[..., Any]) -> FunctionTool:
        schema, context_parameter, summary = schema_from_function(function, tool_name=name)
        retry_policy = retry or RetryPolicy()
        data: dict[str, Any] = {
            "name": name,
            "version": version,
            "title": title or name,
            "description": description or summary or name,
            "inputSchema": schema,
            "outputContract": {"maxBytes": max_output_bytes},
            "executionMode": str(execution_mode),
            "permissions": (permissions or Permissions()).to_dict(),
            "safety": {
                "mutating": mutating,
                "destructive": destructive,
                "external": external,
                "trust": "builtin" if function.__module__.startswith("toolkernel.") else "trusted",
                "source": f"python:{function.__module__}.{function.__qualname__}",
            },
            "timeoutMs": timeout_ms,
            "retry": retry_policy.to_dict(),
            "idempotent": idempotent,
            "tags": list(tags),
        }
        if output_schema is not None:
            data["outputContract"]["schema"] = output_schema
        if concurrency_group is not None:
            data["concurrencyGroup"] = str(concurrency_group)
        definition = ToolDefinition.from_dict(data)
        return FunctionTool(definition, function, context_parameter)

    return decorate


def schema_from_function(
    function: Callable[..., Any], *, tool_name: str = ""
) -> tuple[dict[str, Any], str | None, str]:
    """The input schema, the ToolContext parameter (if any) and the docstring summary."""
    doc = docstring_parser.parse(inspect.getdoc(function) or "")
    param_docs = {p.arg_name: p.description for p in doc.params if p.description}
    hints = get_type_hints(function, include_extras=True)
    properties: dict[str, Any] = {}
    required: list[str] = []
    context_parameter: str | None = None
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise DefinitionError(
                tool_name,
                f"inputSchema.properties.{parameter.name}",
                "*args and **kwargs cannot be described by a strict schema",
            )
        annotation = hints.get(parameter.name)
        if annotation is None:
            raise DefinitionError(
                tool_name, f"inputSchema.properties.{parameter.name}", "needs a type annotation"
            )
        if annotation is ToolContext:
            context_parameter = parameter.name
            continue
        where = f"inputSchema.properties.{parameter.name}"
        prop = _schema_for(annotation, tool_name=tool_name, where=where)
        if parameter.name in param_docs:
            prop = {"description": param_docs[parameter.name], **prop}
        if parameter.default is parameter.empty:
            required.append(parameter.name)
        elif parameter.default is not None or _allows_null(prop):
            prop["default"] = _json_default(parameter.default, tool_name, where)
        properties[parameter.name] = prop
    schema: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }
    if required:
        schema["required"] = required
    summary = "\n\n".join(p for p in (doc.short_description, doc.long_description) if p)
    return schema, context_parameter, summary


def _allows_null(prop: Mapping[str, Any]) -> bool:
    kinds = prop.get("type")
    if kinds == "null" or (isinstance(kinds, list) and "null" in kinds):
        return True
    return any(_allows_null(option) for option in prop.get("anyOf", ()))


def _json_default(value: Any, tool_name: str, where: str) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, tuple | list):
        return [_json_default(v, tool_name, where) for v in value]
    raise DefinitionError(tool_name, f"{where}.default", "default must be JSON-representable")


_SCALARS: Final[dict[Any, str]] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def _schema_for(annotation: Any, *, tool_name: str, where: str) -> dict[str, Any]:
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *metadata = get_args(annotation)
        annotated = _schema_for(base, tool_name=tool_name, where=where)
        for item in metadata:
            _apply_metadata(annotated, item)
        return annotated
    if annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    if origin is Literal:
        values = [v.value if isinstance(v, enum.Enum) else v for v in get_args(annotation)]
        return {"enum": values}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"enum": [member.value for member in annotation]}
    if origin in (typing.Union, types.UnionType):
        return _union(annotation, tool_name=tool_name, where=where)
    if origin in (list, Sequence, set, frozenset) or annotation in (list, tuple):
        (item,) = get_args(annotation) or (Any,)
        schema: dict[str, Any] = {"type": "array", "items": _item(item, tool_name, where)}
        if origin in (set, frozenset):
            schema["uniqueItems"] = True
        return schema
    if origin is tuple:
        args = get_args(annotation)
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _item(args[0], tool_name, where)}
        return {
            "type": "array",
            "prefixItems": [_item(a, tool_name, where) for a in args],
            "items": False,
            "minItems": len(args),
            "maxItems": len(args),
        }
    if origin in (dict, Mapping):
        key, value = get_args(annotation) or (str, Any)
        if key is not str:
            raise DefinitionError(tool_name, where, "mapping keys must be str")
        return {"type": "object", "additionalProperties": _item(value, tool_name, where)}
    if typing.is_typeddict(annotation) or dataclasses.is_dataclass(annotation):
        return _record(annotation, tool_name=tool_name, where=where)
    if annotation is Any:
        return {}
    raise DefinitionError(tool_name, where, f"type {annotation!r} has no strict JSON Schema")


def _item(annotation: Any, tool_name: str, where: str) -> dict[str, Any]:
    return _schema_for(annotation, tool_name=tool_name, where=f"{where}.items")


def _union(annotation: Any, *, tool_name: str, where: str) -> dict[str, Any]:
    options = [_schema_for(a, tool_name=tool_name, where=where) for a in get_args(annotation)]
    if all(set(o) == {"type"} and isinstance(o["type"], str) for o in options):
        return {"type": [o["type"] for o in options]}
    return {"anyOf": options}


def _record(annotation: Any, *, tool_name: str, where: str) -> dict[str, Any]:
    hints = get_type_hints(annotation, include_extras=True)
    if dataclasses.is_dataclass(annotation):
        required = [
            f.name
            for f in dataclasses.fields(annotation)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
    else:
        required = sorted(getattr(annotation, "__required_keys__", ()))
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            key: _schema_for(hint, tool_name=tool_name, where=f"{where}.{key}")
            for key, hint in hints.items()
        },
        "required": required,
    }


_BOUNDS: Final = {
    at.Gt: ("exclusiveMinimum", "gt"),
    at.Ge: ("minimum", "ge"),
    at.Lt: ("exclusiveMaximum", "lt"),
    at.Le: ("maximum", "le"),
    at.MultipleOf: ("multipleOf", "multiple_of"),
}


def _apply_metadata(schema: dict[str, Any], item: Any) -> None:
    is_array = schema.get("type") == "array"
    if isinstance(item, Format):
        schema["format"] = item.name
    elif isinstance(item, Pattern):
        schema["pattern"] = item.regex
    elif isinstance(item, str):
        schema["description"] = item
    elif isinstance(item, at.Interval):
        bounds = zip(
            ("exclusiveMinimum", "minimum", "exclusiveMaximum", "maximum"),
            (item.gt, item.ge, item.lt, item.le),
            strict=True,
        )
        schema.update({keyword: value for keyword, value in bounds if value is not None})
    elif type(item) in _BOUNDS:
        keyword, attr = _BOUNDS[type(item)]
        schema[keyword] = getattr(item, attr)
    elif isinstance(item, at.MinLen):
        schema["minItems" if is_array else "minLength"] = item.min_length
    elif isinstance(item, at.MaxLen):
        schema["maxItems" if is_array else "maxLength"] = item.max_length
    elif isinstance(item, at.Len):
        schema["minItems" if is_array else "minLength"] = item.min_length
        if item.max_length is not None:
            schema["maxItems" if is_array else "maxLength"] = item.max_length
    elif isinstance(item, at.Predicate | at.Timezone):
        pass  # no JSON Schema equivalent; enforced by the function itself if at all

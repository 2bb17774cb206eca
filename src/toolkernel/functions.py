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
bounds come from ``annotated_types`` metadata (``MaxLen``, ``Ge``, ``Interval`` …) or
pydantic's (``Field``, ``conint``, ``constr``), each on the part of the type it fits
(``MaxLen`` on ``list[str] | None`` bounds the list); parameter descriptions come from
the Google/NumPy/reST docstring. A parameter annotated ``ToolContext`` is injected by
the runtime and stays out of the schema. A ``functools.partial`` is described by its
function less the arguments it binds, a callable instance by its ``__call__``.

The runtime calls the tool with the validated JSON arguments converted into the
annotated types: Enum members, dataclass instances (their defaults filling what was
left out), tuples, sets and frozensets, through ``Optional``/unions, lists and maps; a
TypedDict stays a dict. A parameter left out gets its default; a mutable one (a list, a
dict, a dataclass …) as a fresh copy per call. The converters are built once, at
decoration, and only for the parameters that need one: a tool whose parameters are all
plain JSON types, with immutable defaults, is called as it is.

What the schema cannot say, or would say wrongly, is a ``DefinitionError`` at
decoration naming the parameter: a bound that fits no part of the type, a non-finite
or non-JSON default, a recursive type, set items that cannot be hashed, a generator.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import (
    Annotated,
    Any,
    ClassVar,
    Final,
    Literal,
    NotRequired,
    Required,
    TypeGuard,
    get_args,
    get_origin,
    get_type_hints,
)

import annotated_types as at
import docstring_parser

from toolkernel.canonical import canonical_json
from toolkernel.context import ToolContext
from toolkernel.definition import (
    ConcurrencyGroup,
    ExecutionMode,
    Permissions,
    RetryPolicy,
    ToolDefinition,
)
from toolkernel.errors import DefinitionError, ToolSignal
from toolkernel.schema import CompiledSchema, compile_schema

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
    """A definition bound to the Python callable that implements it.

    ``function`` is what the runtime calls with the validated JSON arguments: the
    decorated function itself, or, when a parameter's type needs it, a wrapper that
    converts those arguments into the annotated types first. ``wrapped`` is then the
    decorated function. Calling the ``FunctionTool`` calls the decorated function,
    without conversion.
    """

    definition: ToolDefinition
    function: Callable[..., Any]
    context_parameter: str | None = None
    wrapped: Callable[..., Any] | None = None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.function)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return (self.wrapped or self.function)(*args, **kwargs)


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
    if isinstance(tags, str):  # a str is a Sequence[str]: each letter would be a tag
        raise DefinitionError(name, "tags", f"tags must be a list of strings, not {tags!r}")

    def decorate(function: Callable[..., Any]) -> FunctionTool:
        described = _described(function)
        _refuse_generator(described, tool_name=name)
        try:
            schema, context_parameter, summary = schema_from_function(function, tool_name=name)
            converters = _argument_converters(function, tool_name=name)
        except NameError as exc:  # a hint names what only type checkers import
            raise DefinitionError(
                name, "inputSchema", f"a type hint cannot be resolved at run time ({exc})"
            ) from exc
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
                "trust": "builtin"
                if (function.__module__ or "").startswith("toolkernel.")
                else "trusted",
                "source": f"python:{described.__module__}.{described.__qualname__}",
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
        handler = _handler(function, converters, _fresh_defaults(function), tool_name=name)
        if handler is function:
            return FunctionTool(definition, function, context_parameter)
        return FunctionTool(definition, handler, context_parameter, wrapped=function)

    return decorate


def schema_from_function(
    function: Callable[..., Any], *, tool_name: str = ""
) -> tuple[dict[str, Any], str | None, str]:
    """The input schema, the ToolContext parameter (if any) and the docstring summary."""
    described = _described(function)
    doc = docstring_parser.parse(_docstring(function))
    param_docs = {p.arg_name: p.description for p in doc.params if p.description}
    hints = get_type_hints(described, include_extras=True)
    properties: dict[str, Any] = {}
    required: list[str] = []
    context_parameter: str | None = None
    for parameter in _parameters(function):
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise DefinitionError(
                tool_name,
                f"inputSchema.properties.{parameter.name}",
                "*args and **kwargs cannot be described by a strict schema",
            )
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise DefinitionError(
                tool_name,
                f"inputSchema.properties.{parameter.name}",
                "a positional-only parameter cannot be passed by name; drop the '/'",
            )
        annotation = hints.get(parameter.name)
        if annotation is None:
            raise DefinitionError(
                tool_name, f"inputSchema.properties.{parameter.name}", "needs a type annotation"
            )
        if _is_context(annotation):
            if context_parameter is not None:
                raise DefinitionError(
                    tool_name,
                    f"inputSchema.properties.{parameter.name}",
                    f"only one parameter can take the ToolContext ({context_parameter} does)",
                )
            context_parameter = parameter.name
            continue
        where = f"inputSchema.properties.{parameter.name}"
        prop = _schema_for(annotation, tool_name=tool_name, where=where)
        default = _declared_default(parameter, prop, tool_name=tool_name, where=where)
        if parameter.name in param_docs:
            prop = {"description": param_docs[parameter.name], **prop}
        if default is parameter.empty:
            required.append(parameter.name)
        elif default is not None or _allows_null(prop):
            prop["default"] = _json_default(default, prop, tool_name=tool_name, where=where)
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


def _described(function: Callable[..., Any]) -> Callable[..., Any]:
    """What holds ``function``'s type hints, docstring and name: the function itself,
    a partial's function, or a callable instance's ``__call__``."""
    target = _unbound(function)
    if inspect.isroutine(target) or inspect.isclass(target):
        return target
    call: Callable[..., Any] = type(target).__call__
    return call


def _unbound(function: Callable[..., Any]) -> Callable[..., Any]:
    while isinstance(function, functools.partial):
        function = function.func
    return function


def _docstring(function: Callable[..., Any]) -> str:
    """The docstring of what ``_described`` finds; for a callable instance, its
    ``__call__``'s own or else its class's (``inspect.getdoc`` would inherit "Call self
    as a function." from ``type``)."""
    target = _unbound(function)
    if inspect.isroutine(target) or inspect.isclass(target):
        return inspect.getdoc(target) or ""
    doc = type(target).__call__.__doc__ or type(target).__doc__
    return inspect.cleandoc(doc) if doc else ""


def _parameters(function: Callable[..., Any]) -> list[inspect.Parameter]:
    """The parameters the runtime passes: a partial's, less the keywords it binds."""
    bound = function.keywords if isinstance(function, functools.partial) else {}
    return [p for p in inspect.signature(function).parameters.values() if p.name not in bound]


def _refuse_generator(described: Callable[..., Any], *, tool_name: str) -> None:
    """The runtime calls a tool for its result; a generator's body would never run. (A
    decorator around one may collect what it yields, so only the function itself is
    looked at.)"""
    if inspect.isgeneratorfunction(described) or inspect.isasyncgenfunction(described):
        raise DefinitionError(
            tool_name,
            "outputContract",
            "a tool must return a value, not a generator: collect the items and return "
            "them as a list",
        )


def _is_async(function: Callable[..., Any]) -> bool:
    """Whether ``function`` runs as a coroutine to await: an ``async def``, also
    behind a partial, as a callable instance's ``__call__``, or behind a sync
    ``functools.wraps`` decorator."""
    described = _described(function)
    return inspect.iscoroutinefunction(described) or inspect.iscoroutinefunction(
        inspect.unwrap(described)
    )


def _is_context(annotation: Any) -> bool:
    """``ToolContext``, or ``ToolContext | None`` (the kernel always passes one), also
    ``Annotated``."""
    annotation = _bare(annotation)
    if annotation is ToolContext:
        return True
    if get_origin(annotation) in (typing.Union, types.UnionType):
        return {_bare(a) for a in get_args(annotation)} == {ToolContext, type(None)}
    return False


def _allows_null(prop: Mapping[str, Any]) -> bool:
    kinds = prop.get("type")
    if kinds == "null" or (isinstance(kinds, list) and "null" in kinds):
        return True
    return any(_allows_null(option) for option in prop.get("anyOf", ()))


def _declared_default(
    parameter: inspect.Parameter, schema: dict[str, Any], *, tool_name: str, where: str
) -> Any:
    """The parameter's default, ``Parameter.empty`` if it has none. A
    ``pydantic.Field(...)`` default adds its constraints to ``schema`` and gives its own
    default (``_fresh_defaults`` passes that one, not the ``FieldInfo``)."""
    default = parameter.default
    if not _is_pydantic_field(default):
        return default
    _apply_metadata(schema, default, tool_name=tool_name, where=where)
    if default.default_factory is not None:
        raise DefinitionError(
            tool_name,
            f"{where}.default",
            "pydantic.Field(default_factory=...) is not supported for a parameter: give "
            "a default value",
        )
    return parameter.empty if default.is_required() else default.default


def _json_default(value: Any, schema: Mapping[str, Any], *, tool_name: str, where: str) -> Any:
    """``value`` as the JSON the schema advertises, refused unless the schema accepts
    it: the model is told it, and the function gets it when the argument is left out."""
    where = f"{where}.default"
    json_value = _json_value(value, tool_name=tool_name, where=where)
    if not compile_schema(schema).is_valid(json_value):
        what = f"default {json_value!r} does not fit the parameter's type and bounds"
        raise DefinitionError(tool_name, where, what)
    return json_value


def _json_value(value: Any, *, tool_name: str, where: str) -> Any:
    """A default as JSON: an Enum as its value, a tuple or set as an array (a set's
    items sorted, so that the definition hashes the same in every process), a mapping
    or dataclass as an object."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, float) and not math.isfinite(value):
        what = f"default must be JSON-representable: a finite number, not {value!r}"
        raise DefinitionError(tool_name, where, what)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, tuple | list):
        return [_json_value(v, tool_name=tool_name, where=where) for v in value]
    if isinstance(value, set | frozenset):
        items = [_json_value(v, tool_name=tool_name, where=where) for v in value]
        return sorted(items, key=canonical_json)
    if isinstance(value, Mapping) and all(isinstance(key, str) for key in value):
        return {k: _json_value(v, tool_name=tool_name, where=where) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _json_value(getattr(value, f.name), tool_name=tool_name, where=where)
            for f in dataclasses.fields(value)
            if f.init
        }
    what = f"default must be JSON-representable; {type(value).__name__} {value!r} is not"
    raise DefinitionError(tool_name, where, what)


def _fresh_defaults(function: Callable[..., Any]) -> tuple[tuple[str, Any], ...]:
    """The defaults the runtime passes itself, copied for each call: a mutable one,
    which a call that changed it would change for every later call, and a
    ``pydantic.Field``'s, which Python would pass as the ``FieldInfo``."""
    fresh: list[tuple[str, Any]] = []
    for parameter in _parameters(function):
        default = parameter.default
        if _is_pydantic_field(default):
            if not default.is_required():
                fresh.append((parameter.name, default.default))
        elif default is not parameter.empty and copy.deepcopy(default) is not default:
            fresh.append((parameter.name, default))  # deepcopy returns immutables as they are
    return tuple(fresh)


_SCALARS: Final[dict[Any, str]] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def _schema_for(
    annotation: Any, *, tool_name: str, where: str, within: tuple[Any, ...] = ()
) -> dict[str, Any]:
    """``annotation``'s schema; ``within`` holds the records being described around it,
    so that one that contains itself is refused instead of recursing forever."""
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *metadata = get_args(annotation)
        annotated = _schema_for(base, tool_name=tool_name, where=where, within=within)
        for item in metadata:
            _apply_metadata(annotated, item, tool_name=tool_name, where=where)
        return annotated
    if annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    if origin is Literal:
        return {
            "enum": [_choice(v, tool_name=tool_name, where=where) for v in get_args(annotation)]
        }
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {
            "enum": [_choice(member, tool_name=tool_name, where=where) for member in annotation]
        }
    if origin in (typing.Union, types.UnionType):
        return _union(annotation, tool_name=tool_name, where=where, within=within)
    if origin in (list, Sequence, set, frozenset) or annotation in (list, tuple):
        (item,) = get_args(annotation) or (Any,)
        schema: dict[str, Any] = {"type": "array", "items": _item(item, tool_name, where, within)}
        if origin in (set, frozenset):
            schema["uniqueItems"] = True
        return schema
    if origin is tuple:
        args = get_args(annotation)
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _item(args[0], tool_name, where, within)}
        return {
            "type": "array",
            "prefixItems": [_item(a, tool_name, where, within) for a in args],
            "items": False,
            "minItems": len(args),
            "maxItems": len(args),
        }
    if origin in (dict, Mapping) or annotation in (dict, Mapping):
        key, value = get_args(annotation) or (str, Any)  # a bare dict: dict[str, Any]
        if key is not str:
            raise DefinitionError(tool_name, where, "mapping keys must be str")
        return {"type": "object", "additionalProperties": _item(value, tool_name, where, within)}
    if annotation is ToolContext:
        what = (
            "the ToolContext is passed by the runtime, not by the model: it can only be a "
            "parameter's whole type (ToolContext or ToolContext | None)"
        )
        raise DefinitionError(tool_name, where, what)
    if typing.is_typeddict(annotation) or dataclasses.is_dataclass(annotation):
        return _record(annotation, tool_name=tool_name, where=where, within=within)
    if annotation is Any:
        return {}
    raise DefinitionError(tool_name, where, f"type {annotation!r} has no strict JSON Schema")


def _item(annotation: Any, tool_name: str, where: str, within: tuple[Any, ...]) -> dict[str, Any]:
    return _schema_for(annotation, tool_name=tool_name, where=f"{where}.items", within=within)


def _choice(value: Any, *, tool_name: str, where: str) -> Any:
    """An Enum or Literal value as JSON: a scalar, or a tuple (of them) as an array,
    which ``_enum_converter`` turns back into the tuple."""
    if isinstance(value, enum.Enum):
        value = value.value
    return _choice_item(value, tool_name=tool_name, where=where)


def _choice_item(value: Any, *, tool_name: str, where: str) -> Any:
    if isinstance(value, tuple):
        return [_choice_item(v, tool_name=tool_name, where=where) for v in value]
    finite = not isinstance(value, float) or math.isfinite(value)
    if finite and (value is None or isinstance(value, str | int | float | bool)):
        return value
    what = f"an Enum or Literal value must be a JSON scalar or a tuple of them, not {value!r}"
    raise DefinitionError(tool_name, where, what)


def _union(
    annotation: Any, *, tool_name: str, where: str, within: tuple[Any, ...] = ()
) -> dict[str, Any]:
    options = [
        _schema_for(a, tool_name=tool_name, where=where, within=within)
        for a in get_args(annotation)
    ]
    if all(set(o) == {"type"} and isinstance(o["type"], str) for o in options):
        return {"type": [o["type"] for o in options]}
    return {"anyOf": options}


def _record(
    annotation: Any, *, tool_name: str, where: str, within: tuple[Any, ...]
) -> dict[str, Any]:
    if annotation in within:
        what = f"{_type_name(annotation)} contains itself: recursive types are not supported"
        raise DefinitionError(tool_name, where, what)
    within = (*within, annotation)
    hints = _record_fields(annotation)
    properties = {
        key: _schema_for(hint, tool_name=tool_name, where=f"{where}.{key}", within=within)
        for key, hint in hints.items()
    }
    if dataclasses.is_dataclass(annotation):
        required = _dataclass_required(annotation, properties, tool_name=tool_name, where=where)
    else:
        required = _required_keys(annotation)
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        "required": required,
    }


def _dataclass_required(
    annotation: Any, properties: dict[str, Any], *, tool_name: str, where: str
) -> list[str]:
    """The fields without a default. A pydantic dataclass's ``Field(...)`` default is
    no default: its constraints go into the field's schema, and it is required unless
    it gives a default itself."""
    required: list[str] = []
    for field in dataclasses.fields(annotation):
        if field.name not in properties:
            continue
        default = field.default
        if _is_pydantic_field(default):
            if not hasattr(annotation, "__pydantic_validator__"):
                what = "pydantic.Field(...) as a default needs a pydantic dataclass"
                raise DefinitionError(tool_name, f"{where}.{field.name}", what)
            at_field = f"{where}.{field.name}"
            _apply_metadata(properties[field.name], default, tool_name=tool_name, where=at_field)
            if default.is_required():
                required.append(field.name)
        elif default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            required.append(field.name)
    return required


def _required_keys(typed_dict: Any) -> list[str]:
    """The TypedDict's required keys. ``__required_keys__`` follows ``total=`` but, on
    Python 3.11, misses ``Required``/``NotRequired`` written as strings (``from
    __future__ import annotations``), so a qualifier on the key decides first."""
    hints = get_type_hints(typed_dict, include_extras=True)
    default: frozenset[str] = getattr(typed_dict, "__required_keys__", frozenset())
    return sorted(
        key
        for key, hint in hints.items()
        if _qualifier(hint) is Required or (_qualifier(hint) is None and key in default)
    )


def _qualifier(hint: Any) -> Any:
    origin = get_origin(hint)
    if origin in _QUALIFIERS:
        return origin
    if origin is Annotated:
        return _qualifier(get_args(hint)[0])
    return None


def _record_fields(annotation: Any) -> dict[str, Any]:
    """The keys of a TypedDict or the constructor fields of a dataclass, with their
    types, without the ``Required``/``NotRequired`` that only say which keys are
    required (``_required_keys``)."""
    hints = get_type_hints(annotation, include_extras=True)
    if dataclasses.is_dataclass(annotation):
        skipped = {f.name for f in dataclasses.fields(annotation) if not f.init}
        return {
            key: hint
            for key, hint in hints.items()
            if key not in skipped and hint is not ClassVar and get_origin(hint) is not ClassVar
        }
    return {key: _unqualified(hint) for key, hint in hints.items()}


_QUALIFIERS: Final = frozenset({Required, NotRequired})


def _unqualified(hint: Any) -> Any:
    """``hint`` without a TypedDict key qualifier, also inside ``Annotated``."""
    if get_origin(hint) in _QUALIFIERS:
        return _unqualified(get_args(hint)[0])
    if get_origin(hint) is Annotated:
        base, *metadata = get_args(hint)
        if get_origin(base) in _QUALIFIERS:
            return Annotated[(_unqualified(base), *metadata)]
    return hint


_BOUNDS: Final = {
    at.Gt: ("exclusiveMinimum", "gt"),
    at.Ge: ("minimum", "ge"),
    at.Lt: ("exclusiveMaximum", "lt"),
    at.Le: ("maximum", "le"),
    at.MultipleOf: ("multipleOf", "multiple_of"),
}
_NUMBERS: Final = ("integer", "number")
_SIZES: Final = {"string": "Length", "array": "Items", "object": "Properties"}
_LOWER: Final = frozenset({"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"})
_UPPER: Final = frozenset({"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"})


def _apply_metadata(schema: dict[str, Any], item: Any, *, tool_name: str, where: str) -> None:
    """Add what ``Annotated`` metadata says to ``schema``.

    Raises:
        DefinitionError: metadata that would constrain the argument in a way the schema
            cannot say: left out, the function would get what its annotation refuses.
    """

    def constrain(kinds: Sequence[str], keywords: Mapping[str, Any]) -> None:
        _constrain(schema, dict.fromkeys(kinds, keywords), item, tool_name=tool_name, where=where)

    if item is None or _is_pydantic_strict(item):
        pass  # conint() leaves None for a bound not given; the schema is strict anyway
    elif _is_pydantic_field(item):
        if item.description is not None:
            schema["description"] = item.description
        for constraint in item.metadata:
            _apply_metadata(schema, constraint, tool_name=tool_name, where=where)
    elif _is_pydantic_general(item):
        for name, value in vars(item).items():
            if name == "pattern":
                constrain(("string",), {"pattern": value})
            elif name != "strict" and value is not None:
                # The schema is strict anyway; StringConstraints(pattern=...) also carries
                # strip_whitespace, to_upper and to_lower, None when not asked for.
                what = f"pydantic's {name}=... has no JSON Schema form here"
                raise DefinitionError(tool_name, where, what)
    elif isinstance(item, Format):
        constrain(("string",), {"format": item.name})
    elif isinstance(item, Pattern):
        constrain(("string",), {"pattern": item.regex})
    elif isinstance(item, str):
        schema["description"] = item
    elif type(item) in _BOUNDS:
        keyword, attr = _BOUNDS[type(item)]
        constrain(_NUMBERS, {keyword: getattr(item, attr)})
    elif isinstance(item, at.MinLen):
        _constrain(schema, _sizes("min", item.min_length), item, tool_name=tool_name, where=where)
    elif isinstance(item, at.MaxLen):
        _constrain(schema, _sizes("max", item.max_length), item, tool_name=tool_name, where=where)
    elif isinstance(item, at.GroupedMetadata):  # Interval, Len, pydantic's StringConstraints
        for part in item:
            _apply_metadata(schema, part, tool_name=tool_name, where=where)
    elif isinstance(item, at.Predicate | at.Timezone):
        pass  # no JSON Schema equivalent; enforced by the function itself if at all
    else:
        what = (
            f"the annotation's metadata {type(item).__name__} is not understood: use "
            "annotated_types (MaxLen, Ge, Interval, …), Format, Pattern, a description "
            "string or pydantic.Field"
        )
        raise DefinitionError(tool_name, where, what)


def _constrain(
    schema: dict[str, Any],
    by_kind: Mapping[str, Mapping[str, Any]],
    item: Any,
    *,
    tool_name: str,
    where: str,
) -> None:
    """Add to each part of ``schema`` (each of a union's options but ``null``) the
    keywords ``by_kind`` gives for its JSON type: ``MaxLen`` is ``maxItems`` on an array
    and ``maxLength`` on a string, also inside ``Optional``. Of two bounds the tighter
    holds, as both do in the annotation.

    Raises:
        DefinitionError: a part takes none of them (a bound on a string, a length on an
            enum), where the keyword would be silently ignored.
    """
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            if option.get("type") != "null":
                _constrain(option, by_kind, item, tool_name=tool_name, where=where)
        return
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or ())
    kinds = [kind for kind in kinds if kind != "null"]
    misfit = next((kind for kind in kinds if kind not in by_kind), None)
    if misfit is not None or not kinds:
        fits = " or ".join(by_kind)
        what = f"{misfit} values" if misfit else "an enum, a Literal or Any"
        raise DefinitionError(tool_name, where, f"{item!r} applies to {fits} values, not {what}")
    for kind in kinds:
        for keyword, value in by_kind[kind].items():
            if keyword in schema and keyword in _LOWER:
                value = max(schema[keyword], value)
            elif keyword in schema and keyword in _UPPER:
                value = min(schema[keyword], value)
            schema[keyword] = value


def _sizes(prefix: str, size: int) -> dict[str, dict[str, int]]:
    """A length bound's keyword for each JSON type it fits: ``maxLength``, ``maxItems``…"""
    return {kind: {f"{prefix}{noun}": size} for kind, noun in _SIZES.items()}


def _is_pydantic_field(item: object) -> TypeGuard[Any]:
    """Whether ``item`` is ``pydantic.Field(...)`` (pydantic is not imported for it)."""
    kind = type(item)
    return kind.__name__ == "FieldInfo" and kind.__module__ == "pydantic.fields"


def _is_pydantic_strict(item: object) -> bool:
    kind = type(item)
    return kind.__name__ == "Strict" and kind.__module__.startswith("pydantic")


def _is_pydantic_general(item: object) -> bool:
    """Whether ``item`` is what ``pydantic.Field`` keeps its ``pattern`` in."""
    return type(item).__name__ == "_PydanticGeneralMetadata"


# Arguments into the annotated types. Each converter takes a JSON value that already
# passed validation; None stands for "no conversion needed", so that plain parameters
# cost nothing per call.

_Convert = Callable[[Any], Any]


def _argument_converters(
    function: Callable[..., Any], *, tool_name: str
) -> tuple[tuple[str, _Convert], ...]:
    """The parameters whose JSON value needs converting, each with its converter."""
    hints = get_type_hints(_described(function), include_extras=True)
    converters: list[tuple[str, _Convert]] = []
    for name in (parameter.name for parameter in _parameters(function)):
        annotation = hints[name]
        if _is_context(annotation) or _is_whole_number(annotation):
            continue  # dispatch already turns a top-level 1.0 into 1
        where = f"inputSchema.properties.{name}"
        convert = _converter(annotation, tool_name=tool_name, where=where)
        if convert is not None:
            converters.append((name, convert))
    return tuple(converters)


def _is_whole_number(annotation: Any) -> bool:
    """``int``, ``int | None``, bare or ``Annotated``: what dispatch's
    ``integer_parameters`` converts at the top level."""
    annotation = _bare(annotation)
    if get_origin(annotation) in (typing.Union, types.UnionType):
        options = {_bare(a) for a in get_args(annotation)}
        return int in options and options <= {int, type(None)}
    return annotation is int


def _bare(annotation: Any) -> Any:
    return get_args(annotation)[0] if get_origin(annotation) is Annotated else annotation


def _handler(
    function: Callable[..., Any],
    converters: tuple[tuple[str, _Convert], ...],
    defaults: tuple[tuple[str, Any], ...],
    *,
    tool_name: str,
) -> Callable[..., Any]:
    """What the runtime calls: ``function`` itself when it can, else a wrapper that
    converts the arguments, passes a fresh copy of each default in ``defaults`` for an
    argument left out, and is ``async`` when ``function`` runs as a coroutine: the
    runtime tells sync from async by the ``async def`` it calls, which a sync
    decorator or a callable instance hides."""
    asynchronous = _is_async(function)
    if not converters and not defaults and asynchronous == inspect.iscoroutinefunction(function):
        return function
    hints = get_type_hints(_described(function), include_extras=True)

    def prepare(arguments: dict[str, Any]) -> None:
        for name, converter in converters:
            if name in arguments:
                try:
                    arguments[name] = converter(arguments[name])
                except ToolSignal:
                    raise  # raised on purpose, e.g. by a dataclass's __post_init__
                except Exception as exc:
                    raise TypeError(
                        f"{tool_name}: argument '{name}' could not be converted to "
                        f"{_type_name(hints[name])}"
                    ) from exc
        for name, default in defaults:
            if name not in arguments:
                arguments[name] = copy.deepcopy(default)

    if asynchronous:

        @functools.wraps(function)
        async def call_async(**arguments: Any) -> Any:
            prepare(arguments)
            result = function(**arguments)
            return (await result) if inspect.isawaitable(result) else result

        return call_async

    @functools.wraps(function)
    def call(**arguments: Any) -> Any:
        prepare(arguments)
        return function(**arguments)

    return call


def _type_name(annotation: Any) -> str:
    return annotation.__name__ if isinstance(annotation, type) else repr(annotation)


def _converter(annotation: Any, *, tool_name: str, where: str) -> _Convert | None:
    origin = get_origin(annotation)
    if origin is Annotated:
        return _converter(get_args(annotation)[0], tool_name=tool_name, where=where)
    if annotation is int:
        return _whole
    if annotation in _SCALARS or annotation is Any:
        return None
    if origin is Literal:
        return _literal(get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return _enum_converter(annotation)
    if origin in (typing.Union, types.UnionType):
        return _union_converter(get_args(annotation), tool_name=tool_name, where=where)
    if origin in (list, Sequence, set, frozenset) or annotation in (list, tuple):
        (item,) = get_args(annotation) or (Any,)
        convert = _converter(item, tool_name=tool_name, where=f"{where}.items")
        if origin in (set, frozenset):
            _check_hashable(item, tool_name=tool_name, where=f"{where}.items")
            return _collection(origin, convert)
        if annotation is tuple:
            return tuple
        return None if convert is None else _collection(list, convert)
    if origin is tuple:
        return _tuple_converter(get_args(annotation), tool_name=tool_name, where=where)
    if origin in (dict, Mapping):
        (_, value) = get_args(annotation) or (str, Any)
        convert = _converter(value, tool_name=tool_name, where=f"{where}.items")
        return None if convert is None else functools.partial(_map, convert)
    if typing.is_typeddict(annotation) or dataclasses.is_dataclass(annotation):
        return _record_converter(annotation, tool_name=tool_name, where=where)
    return None


def _whole(value: Any) -> Any:
    """JSON Schema counts ``1.0`` as an integer; an ``int`` parameter gets ``1``."""
    return int(value) if type(value) is float and value.is_integer() else value


def _literal(options: tuple[Any, ...]) -> _Convert | None:
    """Enum members from their values; an int option from the float JSON Schema lets
    match it (``3.0`` for ``Literal[3]``)."""
    members: dict[Any, Any] = {o.value: o for o in options if isinstance(o, enum.Enum)}
    members.update((o, o) for o in options if type(o) is int)
    if not members:
        return None
    return lambda value: value if type(value) is bool else members.get(_tuples(value), value)


def _enum_converter(kind: type[enum.Enum]) -> _Convert:
    """The member, found by its value: a tuple value arrives as a JSON array."""
    if any(isinstance(member.value, tuple) for member in kind):
        return lambda value: kind(_tuples(value))
    return kind


def _tuples(value: Any) -> Any:
    """``value`` with its arrays as tuples, as an enum's tuple values are written."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _collection(kind: Callable[[Any], Any], convert: _Convert | None) -> _Convert:
    if convert is None:
        return kind
    return lambda value: kind(convert(item) for item in value)


def _map(convert: _Convert, value: Mapping[str, Any]) -> dict[str, Any]:
    return {key: convert(item) for key, item in value.items()}


def _tuple_converter(args: tuple[Any, ...], *, tool_name: str, where: str) -> _Convert:
    if len(args) == 2 and args[1] is Ellipsis:
        return _collection(tuple, _converter(args[0], tool_name=tool_name, where=where))
    positions = [_converter(a, tool_name=tool_name, where=f"{where}.items") for a in args]
    if all(p is None for p in positions):
        return tuple
    return lambda value: tuple(
        item if convert is None else convert(item)
        for convert, item in zip(positions, value, strict=True)
    )


def _union_converter(args: tuple[Any, ...], *, tool_name: str, where: str) -> _Convert | None:
    """The first option whose schema the value fits converts it, as validation read it."""
    converters = [_converter(a, tool_name=tool_name, where=where) for a in args]
    if all(c is None for c in converters):
        return None
    options: list[tuple[CompiledSchema, _Convert | None]] = [
        (compile_schema(_schema_for(a, tool_name=tool_name, where=where)), c)
        for a, c in zip(args, converters, strict=True)
    ]

    def convert(value: Any) -> Any:
        for schema, option in options:
            if schema.is_valid(value):
                return value if option is None else option(value)
        raise ValueError("the value fits none of the union's options")

    return convert


def _record_converter(annotation: Any, *, tool_name: str, where: str) -> _Convert | None:
    converters = {
        key: _converter(hint, tool_name=tool_name, where=f"{where}.{key}")
        for key, hint in _record_fields(annotation).items()
    }
    fields = tuple((key, c) for key, c in converters.items() if c is not None)
    if typing.is_typeddict(annotation):
        return functools.partial(_convert_fields, fields) if fields else None
    return lambda value: annotation(**_convert_fields(fields, value))


def _convert_fields(
    fields: tuple[tuple[str, _Convert], ...], value: Mapping[str, Any]
) -> dict[str, Any]:
    result = dict(value)
    for key, convert in fields:
        if key in result:
            result[key] = convert(result[key])
    return result


def _check_hashable(annotation: Any, *, tool_name: str, where: str) -> None:
    """Set items become set members: refuse, at decoration, types that cannot be."""
    unhashable = _unhashable(annotation)
    if unhashable is not None:
        what = f"set items must be hashable; {_type_name(unhashable)} is not"
        raise DefinitionError(tool_name, where, what)


def _unhashable(annotation: Any) -> Any:
    """The part of ``annotation`` whose values cannot be hashed, if any: a list, a map,
    a set, ``Any`` (which admits them), or such a part of a union, a tuple or a frozen
    dataclass."""
    annotation = _bare(annotation)
    origin = get_origin(annotation) or annotation
    if (
        annotation in (Any, tuple)  # a bare tuple's items are Any
        or origin in (list, dict, set, Mapping, Sequence)
        or typing.is_typeddict(annotation)
        or (isinstance(annotation, type) and annotation.__hash__ is None)
    ):
        return annotation
    if origin in (typing.Union, types.UnionType, tuple):
        parts: Sequence[Any] = [a for a in get_args(annotation) if a is not Ellipsis]
    elif dataclasses.is_dataclass(annotation):
        parts = list(_record_fields(annotation).values())
    else:
        return None
    return next((u for u in map(_unhashable, parts) if u is not None), None)

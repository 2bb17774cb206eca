"""Berkeley Function Calling Leaderboard (BFCL) definitions as toolkernel tools.

BFCL writes parameters in a Python-flavoured dialect of JSON Schema: ``dict`` for
object, ``float`` for number, ``tuple`` for array, ``any`` for any value, plus Java and
JavaScript type names (``String``, ``HashMap``, ``long``, …) in its Java/JS sets. This
module turns such a definition into a strict 2020-12 input schema and a toolkernel
definition mapping, and a ground-truth call into the arguments it stands for.

The conversion, and the few repairs the real data needs:

* types map as BFCL's own ``GORILLA_TO_OPENAPI`` does, except ``any`` → ``{}`` (any
  value) where BFCL says string; an empty type name is a string, as in BFCL;
* every object with declared properties is closed (``additionalProperties: false``); a
  ``dict`` that declares none (BFCL's "dict of any") stays an open map, since its
  ground truth carries keys nobody declared;
* a name in ``required`` that ``properties`` does not declare is declared as any value
  (otherwise no value could satisfy the schema);
* ``enum`` members are coerced to the declared type where that is lossless (``"2"`` for
  an integer becomes ``2``), and dropped when they cannot be;
* ``default`` is kept only when it is a valid value (``"dontcare"`` for a boolean, or
  ``None`` for a string, is not: it says "optional" and is dropped);
* keywords outside JSON Schema (``optional``) are dropped; ``required`` decides.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final, Literal

from toolkernel.definition import ExecutionMode
from toolkernel.errors import ToolkernelError
from toolkernel.schema import compile_schema

__all__ = [
    "BFCL_TYPES",
    "BfclError",
    "convert_arguments",
    "convert_function",
    "convert_parameters",
    "tool_name",
]

BFCL_TYPES: Final[Mapping[str, str | None]] = {
    "string": "string", "str": "string", "String": "string", "char": "string", "": "string",
    "integer": "integer", "int": "integer", "long": "integer", "short": "integer",
    "byte": "integer", "Bigint": "integer",
    "float": "number", "number": "number", "double": "number",
    "boolean": "boolean", "bool": "boolean", "Boolean": "boolean",
    "dict": "object", "object": "object", "HashMap": "object", "Hashtable": "object",
    "array": "array", "list": "array", "tuple": "array", "Array": "array",
    "ArrayList": "array", "Queue": "array", "Stack": "array",
    "any": None, "Any": None,
}  # fmt: skip
"""BFCL type name → JSON Schema type; None means any value."""

Language = Literal["python", "java", "javascript"]
"""The language a BFCL set is written for; Java and JavaScript values may be expressions."""

NAMESPACE: Final = "bfcl"
MAX_DESCRIPTION: Final = 4000
_TOOL_NAME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)+$")
_COPIED: Final = ("description", "format", "maximum", "minimum", "minItems", "maxItems")
_OMITTED: Final = ""  # in BFCL ground truth: "this optional parameter may be left out"


class BfclError(ToolkernelError):
    """A BFCL definition or ground-truth call cannot be converted; ``where`` says where."""

    def __init__(self, where: str, problem: str) -> None:
        self.where = where or "/"
        self.problem = problem
        super().__init__(f"{self.where}: {problem}")


def tool_name(name: str) -> str:
    """The toolkernel name of a BFCL function.

    Dotted names that are valid toolkernel names stay (``math.factorial``); others get
    the ``bfcl.`` namespace (``calculate_triangle_area`` → ``bfcl.calculate_triangle_area``).
    """
    return name if _TOOL_NAME.fullmatch(name) else f"{NAMESPACE}.{name}"


def convert_function(
    function: Mapping[str, Any],
    *,
    version: str = "1.0",
    execution_mode: ExecutionMode = ExecutionMode.EXTERNAL_API,
    language: Language = "python",
) -> dict[str, Any]:
    """A toolkernel definition mapping (camelCase) for one BFCL function.

    Args:
        function: ``{"name", "description", "parameters"}`` as BFCL writes it.
        version: the definition's version.
        execution_mode: how the tool would run; BFCL functions are foreign APIs.
        language: the BFCL set's language (see ``convert_parameters``).

    Returns:
        A mapping ``ToolDefinition.from_dict`` accepts.

    Raises:
        BfclError: the function cannot be converted.
    """
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise BfclError("/name", "a function needs a name")
    description = str(function.get("description") or "").strip() or name
    return {
        "name": tool_name(name),
        "version": version,
        "title": name,
        "description": description[:MAX_DESCRIPTION],
        "inputSchema": convert_parameters(function.get("parameters") or {}, language=language),
        "executionMode": str(execution_mode),
        "safety": {"external": True, "trust": "untrusted", "source": f"bfcl:{name}"},
    }


def convert_parameters(
    parameters: Mapping[str, Any], *, language: Language = "python"
) -> dict[str, Any]:
    """A strict 2020-12 input schema for a BFCL ``parameters`` object.

    Args:
        parameters: BFCL's ``parameters`` (``{"type": "dict", "properties": ...}``).
        language: ``"java"`` and ``"javascript"`` sets let every parameter that is not
            a string also be a string: BFCL asks for those languages' values as source
            text (``"ResultSet.TYPE_SCROLL_INSENSITIVE"``, ``"myItemList"``), and its
            ground truth mixes such expressions with literal values.

    Returns:
        The schema, closed at the root even when it declares no properties.

    Raises:
        BfclError: a type is unknown or a keyword has the wrong shape.
    """
    schema = _Converter(language).object(parameters, "", closed=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def convert_arguments(allowed: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments a BFCL ground-truth call stands for.

    Ground truth lists the acceptable values of each parameter; the first one is
    taken. ``""`` first means an optional parameter may be left out, and it is. A
    nested object's values are lists of acceptable values in turn. An empty list for
    an array parameter is read as the empty array (BFCL's data writes ``[]`` where it
    means ``[[]]``).

    Args:
        allowed: ``{parameter: [acceptable values]}`` of one ground-truth call.
        schema: the converted input schema of the function called.

    Returns:
        The arguments object.

    Raises:
        BfclError: a parameter has no acceptable value to take.
    """
    return _pick_object(allowed, schema, "")


class _Converter:
    def __init__(self, language: Language) -> None:
        self.expressions = language != "python"

    def node(self, node: Any, pointer: str) -> dict[str, Any]:
        if not isinstance(node, Mapping):
            raise BfclError(pointer, "a parameter must be an object")
        kind = node.get("type", "string")
        if not isinstance(kind, str) or kind not in BFCL_TYPES:
            raise BfclError(f"{pointer}/type", f"unknown type {kind!r}")
        json_type = BFCL_TYPES[kind]
        out: dict[str, Any] = {k: node[k] for k in _COPIED if k in node}
        if json_type is None:
            return out
        if json_type == "object":
            closed = "properties" in node or "required" in node
            out.update(self.object(node, pointer, closed=closed))
        else:
            out["type"] = json_type
        if json_type == "array" and "items" in node:
            out["items"] = self.node(node["items"], f"{pointer}/items")
        if "enum" in node:
            _add_enum(out, node["enum"], json_type, f"{pointer}/enum")
        if "default" in node and _is_valid(node["default"], out):
            out["default"] = node["default"]
        if self.expressions and json_type != "string":
            typed = {k: v for k, v in out.items() if k != "description"}
            expression = {"type": "string", "description": f"a {kind} as source code"}
            return {**_described(out), "anyOf": [typed, expression]}
        return out

    def object(self, node: Mapping[str, Any], pointer: str, *, closed: bool) -> dict[str, Any]:
        if not closed:
            # BFCL's "dict of any": its ground truth carries keys no one declared.
            return {"type": "object"}
        properties = node.get("properties") or {}
        required = node.get("required") or []
        if not isinstance(properties, Mapping) or not isinstance(required, list):
            raise BfclError(pointer, "'properties' must be an object and 'required' a list")
        converted = {
            str(key): self.node(sub, f"{pointer}/properties/{key}")
            for key, sub in properties.items()
        }
        for key in required:
            converted.setdefault(str(key), {})  # required but never declared: any value
        out: dict[str, Any] = {"type": "object", "properties": converted}
        if required:
            out["required"] = list(dict.fromkeys(str(key) for key in required))
        out["additionalProperties"] = False
        return out


def _described(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"description": schema["description"]} if "description" in schema else {}


def _add_enum(out: dict[str, Any], values: Any, json_type: str, pointer: str) -> None:
    if not isinstance(values, list) or not values:
        raise BfclError(pointer, "'enum' must be a non-empty list")
    target, kind = out, json_type
    items = out.get("items")
    if (
        json_type == "array"
        and isinstance(items, dict)
        and not any(isinstance(v, list) for v in values)
    ):
        target, kind = items, str(items.get("type", ""))  # an array's enum meant its items
    coerced = [_coerce(v, kind) for v in values]
    kept: list[Any] = []
    for value in coerced:
        if value is not _NOT_COERCIBLE and value not in kept:
            kept.append(value)
    if kept:
        target["enum"] = kept
    # else: no member has the declared type; the type wins, as in BFCL's own checker.


_NOT_COERCIBLE: Final[Any] = object()


def _coerce(value: Any, json_type: str) -> Any:
    if _has_type(value, json_type):
        return value
    if isinstance(value, str) and json_type == "boolean":
        return {"true": True, "false": False}.get(value.lower(), _NOT_COERCIBLE)
    if isinstance(value, str) and json_type in ("integer", "number"):
        try:
            number = float(value)
        except ValueError:
            return _NOT_COERCIBLE
        if not math.isfinite(number):
            return _NOT_COERCIBLE
        if json_type == "integer":
            return int(number) if number.is_integer() else _NOT_COERCIBLE
        return number
    return _NOT_COERCIBLE


def _has_type(value: Any, json_type: str) -> bool:
    checks: dict[str, bool] = {
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "array": isinstance(value, list),
        "object": isinstance(value, Mapping),
    }
    return checks.get(json_type, True)


def _is_valid(value: Any, schema: Mapping[str, Any]) -> bool:
    return value is not None and _is_valid_instance(value, schema)


def _is_valid_instance(value: Any, schema: Mapping[str, Any]) -> bool:
    return compile_schema(schema, check_schema=False).is_valid(value)


def _pick_object(
    allowed: Mapping[str, Any], schema: Mapping[str, Any], pointer: str
) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    required = schema.get("required") or ()
    arguments: dict[str, Any] = {}
    for key, options in allowed.items():
        sub = properties.get(key, {})
        where = f"{pointer}/{key}"
        if not isinstance(options, list):
            arguments[key] = options  # a literal value, not a list of options
            continue
        if key in required:
            # "" says "may be left out", which a required parameter may not be.
            options = [o for o in options if o != _OMITTED] or options
        if not options:
            if sub.get("type") != "array":
                raise BfclError(where, "no acceptable value is listed")
            arguments[key] = []
            continue
        first = options[0]
        if key not in required and (first == _OMITTED or (first is None and not _nullable(sub))):
            continue  # left out; None is a Python default's "not given"
        arguments[key] = _pick_value(first, sub, where)
    return arguments


def _nullable(schema: Mapping[str, Any]) -> bool:
    return _is_valid_instance(None, schema)


def _pick_value(value: Any, schema: Mapping[str, Any], pointer: str) -> Any:
    if isinstance(value, Mapping) and all(isinstance(v, list) for v in value.values()):
        return _pick_object(value, schema, pointer)
    if isinstance(value, list):
        items = schema.get("items") or {}
        return [_pick_value(v, items, f"{pointer}/{i}") for i, v in enumerate(value)]
    return value

"""Input schemas as the providers accept them.

``plain_object_schema``: OpenAI and Anthropic refuse a whole request when one tool's
input schema has ``anyOf``/``oneOf``/``allOf`` at its top level, so what is sent there is
a plain object schema, looser than the real one where it must be.

``openai_strict_schema``: an input schema rewritten into the subset OpenAI strict mode
accepts.

Strict mode constrains the model's decoding to the schema, so the schema must be
closed and complete: every object sets ``additionalProperties: false`` and lists every
property in ``required``; an optional property is made nullable instead, and the model
sends ``null`` to leave it out. ``strip_strict_nulls`` undoes that before the kernel
validates the call against the tool's *real* schema, which stays the authority: the
strict schema may be looser than the real one (dropped bounds), never stricter in a way
that matters, except that an object with declared properties is closed, as OpenAI's own
SDK helpers do.

Keywords follow OpenAI's Structured Outputs guide, "Supported schemas" (the official
page was not in the reference index when this was written; this is its last text we
know, corroborated by third-party guides and by the reported API error "'default' is
not permitted"): strings keep ``pattern`` and ``format`` (only the formats listed in
``STRICT_FORMATS``), numbers keep ``minimum``/``maximum``/``exclusiveMinimum``/
``exclusiveMaximum``/``multipleOf``, arrays keep ``minItems``/``maxItems``. Not
supported, and therefore moved into the description so the model still reads them:
``minLength``, ``maxLength``, ``default``, other formats, ``uniqueItems``,
``minProperties``, ``maxProperties``. ``oneOf`` becomes ``anyOf``; ``prefixItems``
becomes ``items`` with an ``anyOf`` of the positions. Strict mode refuses a ``$ref``
beside any other keyword, a description included, so such a reference is expanded with
its siblings merged in (as the openai SDK's own strict helper does). A schema strict
mode cannot express faithfully (an open object or map, an unconstrained value,
``allOf``, ``patternProperties``, a combinator at the top level, a reference whose
siblings contradict its target) or one over OpenAI's size limits raises
``StrictSchemaError``; renderers then send that tool with ``strict: false`` and its
``plain_object_schema``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from toolkernel.errors import ToolkernelError

__all__ = [
    "STRICT_FORMATS",
    "StrictSchemaError",
    "openai_strict_schema",
    "plain_object_schema",
    "strip_strict_nulls",
]

STRICT_FORMATS: Final = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
# OpenAI's documented limits for one strict schema (Structured Outputs guide, "Supported
# schemas": "Objects have limitations on nesting depth and size", "Limitations on total
# string size", "Limitations on enum size"); a schema over any of them is refused.
MAX_OBJECT_DEPTH: Final = 10
MAX_PROPERTIES: Final = 5000
MAX_ENUM_VALUES: Final = 1000  # in all the schema's enums together
LARGE_ENUM_VALUES: Final = 250  # one string enum with more values than this …
MAX_LARGE_ENUM_CHARS: Final = 15_000  # … may hold this many characters in all
MAX_SCHEMA_CHARS: Final = 120_000  # property and definition names, enum and const values
# Ours: each expansion of a $ref with siblings copies its target, so a few references
# that fan out could otherwise build a schema of exponential size.
MAX_EXPANDED_REFERENCES: Final = 200

_KEPT: Final = frozenset(
    {
        "type", "enum", "const", "description", "title", "pattern",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "minItems", "maxItems",
    }
)  # fmt: skip
_NOTED: Final = (
    "minLength", "maxLength", "default", "format", "uniqueItems",
    "minProperties", "maxProperties",
)  # fmt: skip
_REFUSED: Final = ("allOf", "patternProperties", "dependentSchemas", "$dynamicRef")
# OpenAI refuses these at the top of an input schema, strict or not; Anthropic the first
# three.
_NOT_AT_TOP: Final = ("anyOf", "oneOf", "allOf", "enum", "not")
# Keywords that only say something about a value: a $ref's sibling may override them.
_ANNOTATIONS: Final = frozenset(
    {"description", "title", "default", "examples", "deprecated", "readOnly", "writeOnly",
     "$comment"}
)  # fmt: skip
_MAX_NOTE_CHARS: Final = 300
_DEFS_PREFIX: Final = "#/$defs/"


class StrictSchemaError(ToolkernelError):
    """The schema cannot be expressed in OpenAI strict mode; ``pointer`` says where."""

    def __init__(self, problem: str, pointer: str) -> None:
        self.problem = problem
        self.pointer = pointer or "/"
        super().__init__(f"{self.pointer}: {problem}")


def plain_object_schema(schema: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """``schema`` as both providers accept a tool's input schema: a plain object.

    ``anyOf``/``oneOf``/``allOf``/``enum``/``not`` are dropped from the top level (MCP
    servers use a top-level ``anyOf`` to say "at least one of these fields"). What the
    dropped branches require of every call is kept: all of ``allOf``'s ``required``,
    and the names every ``anyOf``/``oneOf`` branch requires. Their properties are not
    added: a tool's top level is closed (``additionalProperties: false``), so the real
    schema admits only the properties declared there, and an open top level admits
    the others anyway. The result is never stricter than ``schema``, which the kernel
    still validates every call against.

    Args:
        schema: the tool's input schema.

    Returns:
        A new schema, and a sentence for the tool's description that says what the
        dropped branches require ("" when nothing was dropped, or it cannot be said
        briefly).
    """
    plain: dict[str, Any] = json.loads(json.dumps(schema))
    dropped = {keyword: plain.pop(keyword) for keyword in _NOT_AT_TOP if keyword in plain}
    plain["type"] = "object"
    if not dropped:
        return plain, ""
    defs = plain.get("$defs")
    defs = defs if isinstance(defs, Mapping) else {}
    required = [name for name in plain.get("required") or () if isinstance(name, str)]
    notes = []
    for keyword in ("allOf", "anyOf", "oneOf"):
        branches = dropped.get(keyword)
        if not isinstance(branches, list) or not branches:
            continue
        alternatives = [_required(_resolve(branch, defs)) for branch in branches]
        required = list(dict.fromkeys([*required, *_needed(keyword, alternatives)]))
        if keyword != "allOf":
            notes.append(_choice_note(keyword, branches, alternatives))
    if required:
        plain["required"] = required
    note = " ".join(n for n in notes if n)
    return plain, note if len(note) <= _MAX_NOTE_CHARS else ""


def _required(branch: Any) -> list[str]:
    names = branch.get("required") if isinstance(branch, Mapping) else None
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []


def _needed(keyword: str, alternatives: list[list[str]]) -> list[str]:
    """The names a call must hold whichever of the branches it matches."""
    if keyword == "allOf":
        return [name for names in alternatives for name in names]
    return [name for name in alternatives[0] if all(name in names for names in alternatives)]


def _choice_note(keyword: str, branches: list[Any], alternatives: list[list[str]]) -> str:
    """In words, an ``anyOf``/``oneOf`` whose branches only require properties."""
    only_required = all(
        isinstance(b, Mapping) and b.keys() <= {"required", *_ANNOTATIONS} for b in branches
    )
    if not only_required or not all(alternatives):
        return ""
    how_many = "at least one" if keyword == "anyOf" else "exactly one"
    choices = "; ".join(" and ".join(names) for names in alternatives)
    return f"The arguments must include {how_many} of: {choices}."


def openai_strict_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Rewrite a tool's input schema for OpenAI strict mode.

    Args:
        schema: the tool's input schema (an object schema).

    Returns:
        A new schema; ``schema`` is not changed.

    Raises:
        StrictSchemaError: strict mode cannot express the schema; the message says
            where and why.
    """
    if schema.get("type") != "object":
        raise StrictSchemaError("the root of a strict schema must be an object", "")
    for keyword in _NOT_AT_TOP:
        if keyword in schema:
            raise StrictSchemaError(f"{keyword!r} is not allowed at the root", "")
    defs = schema.get("$defs")
    defs = defs if isinstance(defs, Mapping) else {}
    converter = _Converter(defs)
    converted = converter.node(schema, "", depth=0)
    if defs:
        converter.count_chars(sum(len(name) for name in defs), "/$defs")
        converted["$defs"] = {
            name: converter.node(sub, f"/$defs/{name}", depth=0) for name, sub in defs.items()
        }
    return converted


class _Converter:
    def __init__(self, defs: Mapping[str, Any]) -> None:
        self.defs = defs
        self.properties = 0
        self.enum_values = 0
        self.chars = 0
        self.expanded = 0
        self.expanding: list[str] = []

    def node(self, schema: Any, pointer: str, *, depth: int) -> dict[str, Any]:
        if not isinstance(schema, Mapping) or not schema:
            raise StrictSchemaError("an unconstrained value cannot be strict", pointer)
        for keyword in _REFUSED:
            if keyword in schema:
                raise StrictSchemaError(f"{keyword!r} is not supported in strict mode", pointer)
        if "$ref" in schema:
            return self._reference(schema, pointer, depth=depth)
        out: dict[str, Any] = {k: v for k, v in schema.items() if k in _KEPT}
        self._count_values(out, pointer)
        if schema.get("format") in STRICT_FORMATS:
            out["format"] = schema["format"]
        notes = [
            _note(k, schema[k])
            for k in _NOTED
            if k in schema and k not in out and not (k == "default" and schema[k] is None)
        ]  # a null default only says "optional", which nullability already says
        choices = schema.get("anyOf", schema.get("oneOf"))
        if isinstance(choices, list):
            out["anyOf"] = [
                self.node(c, f"{pointer}/anyOf/{i}", depth=depth) for i, c in enumerate(choices)
            ]
        elif not {"type", "enum", "const"} & out.keys():
            raise StrictSchemaError("a value without a type cannot be strict", pointer)
        if "object" in _types(schema):
            out.update(self._object(schema, pointer, depth=depth + 1))
        if "array" in _types(schema):
            out["items"] = self._items(schema, pointer, depth=depth)
        if notes:
            described = str(schema.get("description", "")).rstrip()
            out["description"] = f"{described} ({'; '.join(notes)})".lstrip()
        return out

    def _reference(self, schema: Mapping[str, Any], pointer: str, *, depth: int) -> dict[str, Any]:
        target = schema["$ref"]
        if not isinstance(target, str) or not target.startswith(_DEFS_PREFIX):
            raise StrictSchemaError("only references into the root $defs are supported", pointer)
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        if not siblings:
            return {"$ref": target}
        if target in self.expanding:
            if siblings.keys() <= _ANNOTATIONS:
                return {"$ref": target}  # the loop's own copy of the target describes it
            raise StrictSchemaError(
                f"{target} refers back to itself beside other keywords", pointer
            )
        return self._expanded(target, siblings, pointer, depth=depth)

    def _expanded(
        self, target: str, siblings: Mapping[str, Any], pointer: str, *, depth: int
    ) -> dict[str, Any]:
        """The target of a ``$ref`` with its sibling keywords merged in, made strict."""
        resolved = self.defs.get(target.removeprefix(_DEFS_PREFIX))
        if not isinstance(resolved, Mapping):
            raise StrictSchemaError(f"{target} does not name an object schema in $defs", pointer)
        self.expanded += 1
        if self.expanded > MAX_EXPANDED_REFERENCES:
            raise StrictSchemaError(
                f"more than {MAX_EXPANDED_REFERENCES} references beside other keywords", pointer
            )
        self.expanding.append(target)
        try:
            return self.node(_merged_reference(resolved, siblings, pointer), pointer, depth=depth)
        finally:
            self.expanding.pop()

    def _count_values(self, schema: Mapping[str, Any], pointer: str) -> None:
        values = schema.get("enum")
        if isinstance(values, list):
            self.enum_values += len(values)
            if self.enum_values > MAX_ENUM_VALUES:
                raise StrictSchemaError(f"more than {MAX_ENUM_VALUES} enum values in all", pointer)
            chars = sum(len(v) for v in values if isinstance(v, str))
            if len(values) > LARGE_ENUM_VALUES and chars > MAX_LARGE_ENUM_CHARS:
                raise StrictSchemaError(
                    f"an enum of more than {LARGE_ENUM_VALUES} values holds more than "
                    f"{MAX_LARGE_ENUM_CHARS} characters",
                    pointer,
                )
            self.count_chars(chars, pointer)
        if isinstance(schema.get("const"), str):
            self.count_chars(len(schema["const"]), pointer)

    def count_chars(self, chars: int, pointer: str) -> None:
        self.chars += chars
        if self.chars > MAX_SCHEMA_CHARS:
            raise StrictSchemaError(
                f"names, enum and const values hold more than {MAX_SCHEMA_CHARS} characters",
                pointer,
            )

    def _object(self, schema: Mapping[str, Any], pointer: str, *, depth: int) -> dict[str, Any]:
        if depth > MAX_OBJECT_DEPTH:
            raise StrictSchemaError(f"objects nest deeper than {MAX_OBJECT_DEPTH} levels", pointer)
        properties = schema.get("properties")
        closed = schema.get("additionalProperties", schema.get("unevaluatedProperties")) is False
        if not isinstance(properties, Mapping) or not (closed or properties):
            raise StrictSchemaError("an object open to any property cannot be strict", pointer)
        if schema.get("additionalProperties", False) is not False:
            raise StrictSchemaError("an object open to extra properties cannot be strict", pointer)
        self.properties += len(properties)
        if self.properties > MAX_PROPERTIES:
            raise StrictSchemaError(f"more than {MAX_PROPERTIES} properties", pointer)
        self.count_chars(sum(len(str(name)) for name in properties), pointer)
        required = set(schema.get("required") or ())
        converted: dict[str, Any] = {}
        for name, sub in properties.items():
            child = self.node(sub, f"{pointer}/properties/{name}", depth=depth)
            converted[name] = child if name in required else _nullable(child)
        return {
            "properties": converted,
            "required": list(converted),
            "additionalProperties": False,
        }

    def _items(self, schema: Mapping[str, Any], pointer: str, *, depth: int) -> dict[str, Any]:
        positions = schema.get("prefixItems")
        if isinstance(positions, list) and positions:
            choices = [
                self.node(p, f"{pointer}/prefixItems/{i}", depth=depth)
                for i, p in enumerate(positions)
            ]
            rest = schema.get("items", True)
            if rest is True or rest == {}:  # items past the positions may be anything
                raise StrictSchemaError("items past prefixItems are unconstrained", pointer)
            if rest is not False:  # they are allowed too: one more choice, never fewer
                choices.append(self.node(rest, f"{pointer}/items", depth=depth))
            distinct = [c for i, c in enumerate(choices) if c not in choices[:i]]
            return distinct[0] if len(distinct) == 1 else {"anyOf": distinct}
        items = schema.get("items")
        if items is None:
            raise StrictSchemaError("an array without an items schema cannot be strict", pointer)
        return self.node(items, f"{pointer}/items", depth=depth)


def _types(schema: Mapping[str, Any]) -> set[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)}
    return set()


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` that also accepts null: how strict mode spells "optional"."""
    if _accepts_null(schema, {}):
        return schema
    declared = schema.get("type")
    if declared is not None and not {"enum", "const", "anyOf"} & schema.keys():
        kinds = [declared] if isinstance(declared, str) else list(declared)
        return {**schema, "type": [*kinds, "null"]}
    if isinstance(schema.get("anyOf"), list):
        return {**schema, "anyOf": [*schema["anyOf"], {"type": "null"}]}
    return {"anyOf": [schema, {"type": "null"}]}


def _note(keyword: str, value: Any) -> str:
    return f"{keyword}: {json.dumps(value, ensure_ascii=False)}"


def strip_strict_nulls(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Drop the ``null`` values that mean "left out" under strict mode.

    A ``null`` is dropped where the property is optional and its real schema does not
    accept ``null``: strict mode made it nullable, so ``null`` can only mean omission.
    Every other value is kept as the model sent it. Inside ``anyOf``/``oneOf`` the
    value is read against the branches it could belong to (its type, required keys and,
    for closed objects, its keys): if one of them takes it as sent, or they disagree on
    what to drop, nothing is dropped there. So an argument that is already valid
    comes back unchanged.

    Args:
        schema: the tool's real input schema.
        arguments: the decoded arguments.

    Returns:
        A copy of ``arguments`` without those nulls, nested objects, arrays and
        ``anyOf``/``oneOf`` branches included.
    """
    defs = schema.get("$defs")
    return _Stripper(defs if isinstance(defs, Mapping) else {}).object(schema, arguments)


class _Stripper:
    """One ``strip_strict_nulls``. Only ``anyOf``/``oneOf`` can lead back to the same
    value, so their answers are kept per (schema node, value node): references that
    loop, or branch into the same definitions many times, cost at most the schema's size
    times the arguments' size, and a question met again while it is being answered gets
    the answer that keeps values as sent."""

    __slots__ = ("_holds", "_merged", "_nullable", "_stripped", "defs")

    def __init__(self, defs: Mapping[str, Any]) -> None:
        self.defs = defs
        self._stripped: dict[tuple[int, int], Any] = {}
        self._holds: dict[tuple[int, int], bool] = {}
        self._nullable: dict[int, bool] = {}
        self._merged: dict[int, Any] = {}

    def object(self, schema: Mapping[str, Any], value: Mapping[str, Any]) -> dict[str, Any]:
        properties = schema.get("properties")
        if not isinstance(properties, Mapping):
            return dict(value)
        required = schema.get("required") or ()
        result: dict[str, Any] = {}
        for key, item in value.items():
            sub = self.resolve(properties.get(key))
            if item is None and key not in required and not self.accepts_null(sub):
                continue
            result[key] = self.value(sub, item)
        return result

    def value(self, schema: Any, value: Any) -> Any:
        schema = self.resolve(schema)
        if not isinstance(schema, Mapping):
            return value
        if isinstance(value, Mapping):
            if isinstance(schema.get("properties"), Mapping):
                return self.object(schema, value)
        elif isinstance(value, list):
            if isinstance(schema.get("items"), Mapping) or isinstance(
                schema.get("prefixItems"), list
            ):
                return self.array(schema, value)
        else:
            return value  # a scalar has nothing to drop
        choices = schema.get("anyOf", schema.get("oneOf"))
        if not isinstance(choices, list):
            return dict(value) if isinstance(value, Mapping) else value
        key = (id(schema), id(value))
        if key not in self._stripped:
            self._stripped[key] = value
            self._stripped[key] = self.choice(choices, value)
        return self._stripped[key]

    def array(self, schema: Mapping[str, Any], value: list[Any]) -> list[Any]:
        positions = schema.get("prefixItems")
        positions = positions if isinstance(positions, list) else []
        items = schema.get("items")
        return [
            self.value(positions[i] if i < len(positions) else items, element)
            for i, element in enumerate(value)
        ]

    def choice(self, choices: list[Any], value: Any) -> Any:
        """``value`` read against the branches that could hold it; unchanged unless
        they all agree on what to drop and none of them takes it as sent."""
        candidates: list[Any] = []
        for choice in choices:
            branch = self.resolve(choice)
            if not self.could_hold(branch, value):
                continue
            stripped = self.value(branch, value)
            if stripped == value:
                return stripped
            if stripped not in candidates:
                candidates.append(stripped)
        if len(candidates) == 1:
            return candidates[0]
        return dict(value) if isinstance(value, Mapping) else value

    def could_hold(self, branch: Any, value: Any) -> bool:
        """Whether ``value`` (an object or an array) might be an instance of
        ``branch``; errs on the side of yes, which only ever keeps values as sent."""
        if not isinstance(branch, Mapping):
            return branch is not False
        if "const" in branch and branch["const"] != value:
            return False
        if isinstance(branch.get("enum"), list) and value not in branch["enum"]:
            return False
        kinds = _types(branch)
        if isinstance(value, Mapping):
            if kinds and "object" not in kinds:
                return False
            if any(key not in value for key in branch.get("required") or ()):
                return False
            if branch.get("additionalProperties") is False and "patternProperties" not in branch:
                properties = branch.get("properties")
                declared = properties if isinstance(properties, Mapping) else {}
                if any(key not in declared for key in value):
                    return False
        elif kinds and "array" not in kinds:
            return False
        choices = branch.get("anyOf", branch.get("oneOf"))
        if not isinstance(choices, list):
            return True
        key = (id(branch), id(value))
        if key not in self._holds:
            self._holds[key] = True
            self._holds[key] = any(self.could_hold(self.resolve(c), value) for c in choices)
        return self._holds[key]

    def accepts_null(self, schema: Any) -> bool:
        schema = self.resolve(schema)
        if not isinstance(schema, Mapping):
            return schema is not False  # no schema, or `true`, accepts anything
        if "null" in _types(schema) or schema.get("const", ...) is None:
            return True
        if None in (schema.get("enum") or ()):
            return True
        choices = schema.get("anyOf", schema.get("oneOf"))
        if not isinstance(choices, list):
            return not {"type", "enum", "const", "$ref"} & schema.keys()
        if id(schema) not in self._nullable:
            self._nullable[id(schema)] = True
            self._nullable[id(schema)] = any(self.accepts_null(c) for c in choices)
        return self._nullable[id(schema)]

    def resolve(self, schema: Any) -> Any:
        """The schema a ``$ref`` stands for, its sibling keywords merged in as the
        strict schema has them; any other schema as it is."""
        resolved = _resolve(schema, self.defs)
        if resolved is schema or len(schema) == 1 or not isinstance(resolved, Mapping):
            return resolved
        if id(schema) not in self._merged:  # kept, so the merged node's id stays its own
            siblings = {k: v for k, v in schema.items() if k != "$ref"}
            try:
                self._merged[id(schema)] = _merged_reference(resolved, siblings, "")
            except StrictSchemaError:  # then the tool was not strict: no nulls to drop
                self._merged[id(schema)] = resolved
        return self._merged[id(schema)]


def _merged_reference(
    target: Mapping[str, Any], siblings: Mapping[str, Any], pointer: str
) -> dict[str, Any]:
    """One schema for a ``$ref``'s target and its sibling keywords, both of which an
    instance must satisfy: a sibling adds a keyword the target lacks, overrides an
    annotation, and adds properties and required names. Any other keyword both set
    differently is refused: merging it takes knowing what that keyword means, and
    keeping the target's alone would drop what the siblings require."""
    merged = dict(target)
    for key, value in siblings.items():
        mine = merged.get(key, value)
        if key in _ANNOTATIONS or mine == value:
            merged[key] = value
        elif key == "required" and isinstance(mine, list) and isinstance(value, list):
            merged[key] = [*mine, *(name for name in value if name not in mine)]
        elif key == "properties" and isinstance(mine, Mapping) and isinstance(value, Mapping):
            clash = next(
                (name for name in value if mine.get(name, value[name]) != value[name]), None
            )
            if clash is not None:
                raise StrictSchemaError(
                    f"a $ref and its sibling 'properties' both constrain {clash!r}", pointer
                )
            merged[key] = {**mine, **value}
        else:
            raise StrictSchemaError(
                f"a $ref and its sibling {key!r} both constrain the value", pointer
            )
    return merged


def _resolve(schema: Any, defs: Mapping[str, Any]) -> Any:
    if isinstance(schema, Mapping):
        target = schema.get("$ref")
        if isinstance(target, str) and target.startswith(_DEFS_PREFIX):
            return defs.get(target.removeprefix(_DEFS_PREFIX), schema)
    return schema


def _accepts_null(schema: Any, defs: Mapping[str, Any]) -> bool:
    return _Stripper(defs).accepts_null(schema)

"""Validation: are the arguments well-formed for this tool?

First the tool's compiled JSON Schema (2020-12), then semantic checks that follow the
schema: every string the schema marks ``"format": "workspace-path"`` goes through the
one shared path guard, whatever the tool's execution mode. Safe messages name the
property and the fix; they never echo argument values.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from toolkernel.codes import ErrorCode, safe_field
from toolkernel.functions import NO_NUL_PATTERN
from toolkernel.pathguard import GuardedPath, PathGuard, PathViolation
from toolkernel.registry import PATH_FORMAT, RegisteredTool
from toolkernel.schema import SchemaError

__all__ = ["ValidationResult", "Violation", "validate"]

_MAX_REF_DEPTH: Final = 32
_BOUND_TEXT: Final = {
    "maxLength": "at most {limit} characters",
    "minLength": "at least {limit} characters",
    "maxItems": "at most {limit} items",
    "minItems": "at least {limit} items",
    "maxProperties": "at most {limit} properties",
    "minProperties": "at least {limit} properties",
    "maximum": "at most {limit}",
    "minimum": "at least {limit}",
    "exclusiveMaximum": "less than {limit}",
    "exclusiveMinimum": "greater than {limit}",
    "multipleOf": "a multiple of {limit}",
    "maxContains": "at most {limit} matching items",
    "minContains": "at least {limit} matching items",
}


@dataclass(frozen=True, slots=True)
class Violation:
    """The first problem found: a code, where it is, and the safe-message fields."""

    code: ErrorCode
    property: str
    fields: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ValidationResult:
    """Either valid (with the guarded paths found) or the first violation."""

    violation: Violation | None = None
    paths: tuple[GuardedPath, ...] = ()

    @property
    def ok(self) -> bool:
        return self.violation is None


VALID: Final = ValidationResult()


def validate(
    tool: RegisteredTool, arguments: Mapping[str, Any], guard: PathGuard
) -> ValidationResult:
    """Check ``arguments`` against the tool's schema, then its path fields."""
    try:
        valid = tool.validator.is_valid(arguments)
        errors = [] if valid else tool.validator.errors(arguments, limit=1)
    except (ValueError, TypeError):  # a mapping from code, with a key that is no string
        rule = "every key must be a string"
        return ValidationResult(
            Violation(ErrorCode.SCHEMA_VIOLATION, "(arguments)", {"rule": rule})
        )
    if not valid:
        if errors:
            return ValidationResult(_violation_for(errors[0], tool))
        return ValidationResult(
            Violation(ErrorCode.SCHEMA_VIOLATION, "(arguments)", {"rule": "schema"})
        )
    if not tool.takes_paths:
        return VALID
    schema = tool.definition.input_schema
    guarded: list[GuardedPath] = []
    for where, value in _path_values(schema, arguments, (), schema, 0):
        checked = guard.check(value)
        if isinstance(checked, PathViolation):
            return ValidationResult(
                Violation(checked.code, _label(where), {"detail": checked.detail})
            )
        guarded.append(checked)
    return ValidationResult(paths=tuple(guarded))


def _violation_for(error: SchemaError, tool: RegisteredTool) -> Violation:
    path = error.instance_path
    details = error.details
    keyword = error.keyword
    if keyword in ("additionalProperties", "unevaluatedProperties"):
        unexpected = details.get("unexpected") or ["?"]
        name = safe_field(str(unexpected[0]))
        parent = _subschema(tool.definition.input_schema, error.schema_path[:-1])
        allowed = sorted(parent.get("properties", {})) if isinstance(parent, Mapping) else []
        return Violation(
            ErrorCode.UNKNOWN_PROPERTY,
            _label((*path, name)),
            {"allowed": ", ".join(allowed) or "none"},
        )
    if keyword == "required":
        missing = safe_field(str(details.get("property", "?")))
        return Violation(ErrorCode.MISSING_PROPERTY, _label((*path, missing)))
    if keyword == "type":
        expected = details.get("expected") or ["?"]
        kinds = expected if isinstance(expected, list | tuple) else [expected]
        return Violation(
            ErrorCode.TYPE_MISMATCH, _label(path), {"expected": " or ".join(map(_article, kinds))}
        )
    if keyword in _BOUND_TEXT:
        limit = details.get("limit", "?")
        return Violation(
            ErrorCode.OUT_OF_BOUNDS,
            _label(path),
            {"bound": _BOUND_TEXT[keyword].format(limit=limit)},
        )
    if keyword in ("enum", "const"):
        options = details.get("options")
        if options is None and "expected_value" in details:
            options = [details["expected_value"]]
        return Violation(ErrorCode.NOT_IN_ENUM, _label(path), {"allowed": _options(options)})
    if keyword == "pattern" and details.get("pattern") == NO_NUL_PATTERN:
        rule = "it must not contain a NUL character"
        return Violation(ErrorCode.SCHEMA_VIOLATION, _label(path), {"rule": rule})
    return Violation(ErrorCode.SCHEMA_VIOLATION, _label(path), {"rule": keyword})


def _path_values(
    schema: Any, instance: Any, where: tuple[str | int, ...], root: Any, depth: int
) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """Every string in ``instance`` that the schema marks as a workspace path, and the
    default of each such property left out (what the tool will use: a ``cwd`` left
    out is the workspace root, and is judged as such)."""
    if depth > _MAX_REF_DEPTH or not isinstance(schema, Mapping):
        return
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        yield from _path_values(_resolve(root, ref), instance, where, root, depth + 1)
    if schema.get("format") == PATH_FORMAT and isinstance(instance, str):
        yield where, instance
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(key, ()):
            yield from _path_values(sub, instance, where, root, depth + 1)
    for key in ("if", "then", "else", "not"):
        yield from _path_values(schema.get(key), instance, where, root, depth + 1)
    if isinstance(instance, Mapping):
        properties = schema.get("properties", {})
        patterns = schema.get("patternProperties", {})
        for name, value in instance.items():
            subs = [properties[name]] if name in properties else []
            subs += [s for p, s in patterns.items() if re.search(p, name)]
            if not subs and isinstance(schema.get("additionalProperties"), Mapping):
                subs = [schema["additionalProperties"]]
            for sub in subs:
                yield from _path_values(sub, value, (*where, name), root, depth + 1)
        for name, sub in properties.items():
            if name not in instance and isinstance(sub, Mapping) and "default" in sub:
                yield from _path_values(sub, sub["default"], (*where, name), root, depth + 1)
    elif isinstance(instance, list):
        prefix = schema.get("prefixItems", ())
        for index, value in enumerate(instance):
            sub = prefix[index] if index < len(prefix) else schema.get("items")
            yield from _path_values(sub, value, (*where, index), root, depth + 1)


def _resolve(root: Any, ref: str) -> Any:
    node = root
    for part in ref.lstrip("#").split("/"):
        if not part:
            continue
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping):
            node = node.get(key)
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


def _subschema(schema: Any, schema_path: tuple[str | int, ...]) -> Any:
    node = schema
    for part in schema_path:
        if isinstance(node, Mapping):
            node = node.get(str(part))
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return None
    return node


def _label(path: tuple[str | int, ...]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return safe_field(text) or "(arguments)"


def _article(kind: object) -> str:
    names = {
        "string": "a string",
        "integer": "an integer",
        "number": "a number",
        "boolean": "a boolean",
        "array": "an array",
        "object": "an object",
        "null": "null",
    }
    return names.get(str(kind), str(kind))


def _options(options: Any, limit: int = 12) -> str:
    if not isinstance(options, list | tuple):
        return "the values listed in the schema"
    shown = [safe_field(str(o), 40) for o in options[:limit]]
    more = f" (and {len(options) - limit} more)" if len(options) > limit else ""
    return ", ".join(shown) + more

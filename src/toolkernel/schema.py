"""JSON Schema 2020-12: compile a tool's schema once, validate every call against it.

This is the project's one wrapper around a validator library. jsonschema-rs was chosen
by measurement (``bench/validators.py``, results in ``bench/results/validators.md``):
it alone passes every required test of the official 2020-12 suite, and it checks a
typical tool input in about 0.3 µs: some 130x faster than ``jsonschema`` and 5x faster
than ``fastjsonschema``, which does not implement 2020-12.

Three rules hold whatever the schema says:

* No network, ever. A ``$ref`` (or ``$schema``) naming a document outside the schema
  resolves only from the ``resources`` the caller passes; anything else is refused at
  compile time with a :class:`SchemaCompileError`.
* ``format`` is an annotation, as 2020-12 says: unknown formats such as
  ``workspace-path`` are accepted and checked by the runtime itself.
* Errors come back as :class:`SchemaError` records with a keyword and plain
  ``details``; the library's message is kept for logs only.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn
from urllib.parse import urldefrag, urljoin

import jsonschema_rs

from toolkernel.errors import ToolkernelError

__all__ = [
    "CompiledSchema",
    "SchemaCompileError",
    "SchemaError",
    "compile_schema",
    "iter_subschemas",
]

_Kind = jsonschema_rs.ValidationErrorKind

# Keywords whose value names another document, so a refused fetch can be traced back.
_REFERENCE_KEYWORDS = ("$ref", "$dynamicRef", "$schema")

_MISSING_RESOURCE = re.compile(r"Resource '([^']+)' is not present in a registry")

# Meta-schemas jsonschema-rs ships; any other `$schema` must come from `resources`.
_BUILTIN_DIALECTS = frozenset(
    {
        "http://json-schema.org/draft-04/schema",
        "http://json-schema.org/draft-06/schema",
        "http://json-schema.org/draft-07/schema",
        "https://json-schema.org/draft/2019-09/schema",
        "https://json-schema.org/draft/2020-12/schema",
    }
)


class SchemaCompileError(ToolkernelError):
    """A schema could not be compiled: it is malformed or references something refused.

    Attributes:
        pointer: JSON pointer into the schema at the offending keyword ("" for the root).
    """

    def __init__(self, message: str, *, pointer: str = "") -> None:
        super().__init__(message)
        self.pointer = pointer


@dataclass(frozen=True, slots=True)
class SchemaError:
    """One way an instance violates a schema.

    Attributes:
        instance_path: Where in the instance the violation is (keys and indexes).
        schema_path: Which keyword of the schema rejected it (keys and indexes).
        keyword: The keyword that failed, e.g. ``"required"`` or ``"maxLength"``. A
            ``false`` subschema reports ``"falseSchema"``.
        message: The library's text. For logs only: it may echo the instance.
        details: Plain JSON facts about the failure, keyed per keyword, e.g.
            ``{"unexpected": [...]}`` for additionalProperties, ``{"property": "x"}``
            for required, ``{"expected": ["string"]}`` for type, ``{"limit": 500}`` for
            maxLength and the other bounds, ``{"options": [...]}`` for enum,
            ``{"expected_value": value}`` for const, ``{"pattern": "..."}`` for pattern.
            These are the library's own fields, made plain JSON; only ``type`` renames
            its field (``types`` to ``expected``).
    """

    instance_path: tuple[str | int, ...]
    schema_path: tuple[str | int, ...]
    keyword: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)


class CompiledSchema:
    """A schema compiled once, safe to share between threads and calls.

    Attributes:
        schema: The schema as given to :func:`compile_schema`.
    """

    __slots__ = ("_validator", "schema")

    def __init__(
        self, schema: Mapping[str, Any] | bool, validator: jsonschema_rs.Validator
    ) -> None:
        self.schema = schema
        self._validator = validator

    def __repr__(self) -> str:
        return f"CompiledSchema({self.schema!r})"

    def is_valid(self, instance: Any) -> bool:
        """Tell whether ``instance`` conforms, stopping at the first violation.

        Args:
            instance: A JSON value as ``json.loads`` returns it.

        Returns:
            True if the instance conforms to the schema.
        """
        return self._validator.is_valid(instance)

    def errors(self, instance: Any, *, limit: int = 20) -> list[SchemaError]:
        """List the violations of ``instance``, at most ``limit`` of them.

        Args:
            instance: A JSON value as ``json.loads`` returns it.
            limit: The most errors to return; a hostile instance can violate a schema
                in thousands of places and the model needs only the first few.

        Returns:
            The violations in the library's order; empty if the instance conforms.
        """
        if limit <= 0:
            return []
        found = itertools.islice(self._validator.iter_errors(instance), limit)
        return [_to_schema_error(error) for error in found]


def compile_schema(
    schema: Mapping[str, Any] | bool,
    *,
    resources: Mapping[str, Any] | None = None,
    check_schema: bool = True,
) -> CompiledSchema:
    """Compile a JSON Schema (draft 2020-12 unless its ``$schema`` names another draft).

    Args:
        schema: The schema, an object or a boolean.
        resources: Documents that remote references may resolve to, keyed by URI.
            Nothing else is ever fetched.
        check_schema: Validate the schema against its meta-schema first, so that the
            error names the exact keyword. jsonschema-rs also checks the schema while
            building, so False only skips the separate pass; a malformed schema is
            refused either way, with a less precise pointer in rare cases.

    Returns:
        The compiled schema.

    Raises:
        SchemaCompileError: The schema is malformed, a resource is malformed, or a
            reference names a document not in ``resources``.
    """
    if not isinstance(schema, bool | Mapping):
        raise SchemaCompileError(
            f"a schema must be an object or a boolean, not {type(schema).__name__}"
        )
    document: dict[str, Any] | bool = schema if isinstance(schema, bool) else dict(schema)
    refused: list[str] = []

    def refuse(uri: str) -> NoReturn:
        # Replaces the library's HTTP/file retriever: this is what keeps compiling offline.
        refused.append(uri)
        raise LookupError(f"remote reference {uri!r} is not allowed")

    registry = _registry(resources or {}, refuse, refused)
    _check_dialect(document, resources or {})
    try:
        if check_schema:
            jsonschema_rs.meta.validate(document, registry=registry)
        validator = jsonschema_rs.validator_for(
            document, registry=registry, retriever=refuse, validate_formats=False
        )
    except jsonschema_rs.ValidationError as exc:
        if isinstance(exc.kind, _Kind.Referencing):
            raise _reference_error(document, refused, exc.kind.error.message) from exc
        raise _malformed_error(exc) from exc
    except jsonschema_rs.ReferencingError as exc:
        raise _reference_error(document, refused, exc.message) from exc
    except ValueError as exc:
        # Values JSON cannot express (a set, a tuple key) end up here.
        raise SchemaCompileError(f"schema is invalid: {exc}") from exc
    return CompiledSchema(schema, validator)


def _registry(
    resources: Mapping[str, Any], refuse: Callable[[str], NoReturn], refused: list[str]
) -> jsonschema_rs.Registry:
    # Always pass a registry, even an empty one: without it jsonschema_rs.meta.validate
    # fetches an unknown `$schema` over HTTP (seen in 0.61.2), and it has no retriever
    # argument of its own.
    try:
        return jsonschema_rs.Registry(list(resources.items()), retriever=refuse)
    except (ValueError, jsonschema_rs.ReferencingError) as exc:
        if refused:
            message = f"resources: remote reference {refused[0]!r} is not allowed"
        else:
            message = f"resources could not be loaded: {exc}"
        raise SchemaCompileError(message) from exc


def _check_dialect(document: dict[str, Any] | bool, resources: Mapping[str, Any]) -> None:
    # A populated registry never consults its retriever, so an unknown `$schema` would
    # only surface as an opaque lookup failure; name it here instead.
    dialect = document.get("$schema") if isinstance(document, dict) else None
    if dialect is None:
        return
    if not isinstance(dialect, str):
        return  # the meta-schema check reports the wrong type with its pointer
    uri = urldefrag(dialect).url
    if uri not in _BUILTIN_DIALECTS and uri not in resources and dialect not in resources:
        raise SchemaCompileError(
            f"remote reference {dialect!r} is not allowed; pass the meta-schema in resources",
            pointer="/$schema",
        )


def _malformed_error(exc: jsonschema_rs.ValidationError) -> SchemaCompileError:
    # Meta-schema errors are about the schema *as an instance*, so the instance path
    # is where the bad keyword sits.
    pointer = _pointer(exc.instance_path)
    keyword = next((p for p in reversed(exc.instance_path) if isinstance(p, str)), None)
    where = f"keyword {keyword!r} at {pointer!r}" if keyword else "schema root"
    return SchemaCompileError(f"invalid {where}: {exc.message}", pointer=pointer)


def _reference_error(
    document: dict[str, Any] | bool, refused: list[str], detail: str
) -> SchemaCompileError:
    # Some lookups (`$dynamicRef`, a populated registry) fail without consulting the
    # retriever; the library's message then is the only place naming the document.
    missing = _MISSING_RESOURCE.search(detail)
    if not refused and missing is None:
        return SchemaCompileError(f"unresolvable reference: {detail}")
    uri = refused[0] if refused else urldefrag(missing[1] if missing else "").url
    pointer = _find_reference(document, uri, base="", pointer="") or ""
    return SchemaCompileError(
        f"remote reference {uri!r} is not allowed; pass the document in resources",
        pointer=pointer,
    )


def _find_reference(node: Any, uri: str, *, base: str, pointer: str) -> str | None:
    """Return the pointer of the first reference keyword that resolves to ``uri``."""
    if isinstance(node, dict):
        node_id = node.get("$id")
        if isinstance(node_id, str):
            base = urljoin(base, node_id)
        for keyword in _REFERENCE_KEYWORDS:
            target = node.get(keyword)
            if isinstance(target, str) and urldefrag(urljoin(base, target)).url == uri:
                return f"{pointer}/{_escape(keyword)}"
        children: Any = node.items()
    elif isinstance(node, list):
        children = enumerate(node)
    else:
        return None
    for key, child in children:
        found = _find_reference(child, uri, base=base, pointer=f"{pointer}/{_escape(key)}")
        if found is not None:
            return found
    return None


# Kinds whose fields are plain JSON already: the common errors skip the checks below.
_PLAIN_KINDS: frozenset[type[jsonschema_rs.ValidationErrorKind]] = frozenset(
    {
        _Kind.AdditionalProperties,
        _Kind.Constant,
        _Kind.Enum,
        _Kind.ExclusiveMaximum,
        _Kind.ExclusiveMinimum,
        _Kind.MaxItems,
        _Kind.MaxLength,
        _Kind.MaxProperties,
        _Kind.Maximum,
        _Kind.MinItems,
        _Kind.MinLength,
        _Kind.MinProperties,
        _Kind.Minimum,
        _Kind.MultipleOf,
        _Kind.Pattern,
        _Kind.Required,
        _Kind.UnevaluatedItems,
        _Kind.UnevaluatedProperties,
    }
)


def _to_schema_error(error: jsonschema_rs.ValidationError) -> SchemaError:
    kind = error.kind
    return SchemaError(
        instance_path=tuple(error.instance_path),
        schema_path=tuple(error.schema_path),
        keyword=kind.name,
        message=error.message,
        details=_details(kind),
    )


def _details(kind: jsonschema_rs.ValidationErrorKind) -> dict[str, Any]:
    if type(kind) in _PLAIN_KINDS:
        return kind.as_dict()
    match kind:
        case _Kind.Type(types):
            return {"expected": list(types)}
        case _Kind.PropertyNames(error):
            return {"name": error.instance, "keyword": error.kind.name}
        case _Kind.AnyOf() | _Kind.OneOfNotValid() | _Kind.OneOfMultipleValid():
            # Per-branch errors are long and confusing; the message keeps them for logs.
            return {}
        case _Kind.Referencing(error):
            return {"error": error.message}
    # The remaining kinds carry plain JSON already (limit, options, property,
    # unexpected, pattern, format, ...); anything else is dropped rather than leaked.
    return {key: value for key, value in kind.as_dict().items() if _is_plain(value)}


def _is_plain(value: Any) -> bool:
    if isinstance(value, list):
        return all(_is_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return value is None or isinstance(value, str | int | float | bool)


def _pointer(path: list[str | int]) -> str:
    return "".join(f"/{_escape(part)}" for part in path)


def _escape(part: str | int) -> str:
    return str(part).replace("~", "~0").replace("/", "~1")


_SCHEMA_MAPS: Final = (
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
)
_SCHEMA_ONE: Final = (
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
)
_SCHEMA_LISTS: Final = ("allOf", "anyOf", "oneOf", "prefixItems", "items")


def iter_subschemas(schema: Any, pointer: str) -> Iterator[tuple[Mapping[str, Any], str]]:
    """Yield ``schema`` and every schema nested in it, with their JSON pointers (from
    ``pointer``): the walk the lint rules and the definition checks share."""
    if not isinstance(schema, Mapping):
        return
    yield schema, pointer
    for key in _SCHEMA_MAPS:
        children = schema.get(key)
        if isinstance(children, Mapping):
            for name, child in children.items():
                yield from iter_subschemas(child, f"{pointer}/{key}/{_escape(name)}")
    for key in _SCHEMA_ONE:
        yield from iter_subschemas(schema.get(key), f"{pointer}/{key}")
    for key in _SCHEMA_LISTS:
        children = schema.get(key)
        if isinstance(children, list):
            for index, child in enumerate(children):
                yield from iter_subschemas(child, f"{pointer}/{key}/{index}")

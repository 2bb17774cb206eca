"""Definition-hygiene rules (``D0xx``), from seed section 19.

For native ToolDefinitions every rule is an error: the runtime relies on each of these
fields. MCP, OpenAI and Anthropic formats cannot express several of them (no timeout,
no permission profile, often no output schema), and their schema gaps are the norm in
the wild, so the same gaps are warnings there: the kernel compensates when it bridges
such a tool (it imposes a timeout and treats untrusted tools as mutating and external).
Only a definition that is structurally broken (``D010``) or whose schema the runtime
cannot compile (``D012``) is an error in every format.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from toolkernel.lint.findings import Finding, Severity
from toolkernel.lint.loaders import ToolKind, ToolView, escape_token
from toolkernel.lint.schemas import (
    iter_properties,
    iter_subschemas,
    types_of,
    unresolved_reference,
)
from toolkernel.schema import SchemaCompileError, compile_schema

__all__ = ["check_hygiene"]

_NATIVE_NAME: Final = re.compile(r"[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)+")
# Formats without dots namespace with a separator: ``github__create_issue``,
# ``github_create_issue``, ``git-status``. Lenient on purpose: a warning only.
_FOREIGN_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:\.|__|_|-|/)[A-Za-z0-9].*")

# A schema with one of these says what its values may be (D002-D004 judge the rest).
_TYPING: Final = frozenset(
    {"type", "enum", "const", "$ref", "$dynamicRef", "allOf", "anyOf", "oneOf", "properties"}
)
# Formats whose values have an inherent length bound.
_BOUNDED_FORMATS: Final = frozenset(
    {"date", "time", "date-time", "duration", "uuid", "ipv4", "ipv6", "email", "hostname"}
)
# An unbounded quantifier outside an escape: ``*``, ``+`` or ``{n,}``.
_UNBOUNDED_QUANTIFIER: Final = re.compile(r"[*+]|\{\d+,\}")

_PRECONDITION_NAMES: Final = frozenset(
    {"precondition", "preconditions", "ifmatch", "etag", "sha", "ifunmodifiedsince"}
)
_PRECONDITION_PARTS: Final = re.compile(
    r"(expected|base|if|previous|old|current)(hash|sha|sha256|etag|version|revision|rev|mtime)"
)

# The compiler's message can echo schema text (a pattern, a $ref): keep it short.
_MESSAGE_LIMIT: Final = 240
# Characters a reader would not see or a terminal would act on, escaped in messages.
_UNSHOWN: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})

_Check = Callable[[ToolView], Iterator[Finding]]


def check_hygiene(view: ToolView) -> list[Finding]:
    """Run every ``D`` rule on one definition."""
    malformed = list(_well_formed(view))
    if malformed:
        # The other rules assume a name and an object schema; they would only echo this.
        return malformed
    checks: tuple[_Check, ...] = (
        _valid_schemas,
        _namespaced_name,
        _description,
        _closed_objects,
        _bounded_strings,
        _typed_values,
        _bounded_arrays,
        _mutation_precondition,
        _network_permission,
        _output_contract,
        _timeout,
        _idempotency,
    )
    return [finding for check in checks for finding in check(view)]


def _severity(view: ToolView) -> Severity:
    return Severity.ERROR if view.kind is ToolKind.NATIVE else Severity.WARNING


def _finding(view: ToolView, rule: str, pointer: str, message: str) -> Finding:
    return Finding(view.name, rule, _severity(view), pointer, message)


def _well_formed(view: ToolView) -> Iterator[Finding]:
    name = view.fields.get("name")
    if not isinstance(name, str) or not name:
        yield Finding(view.name, "D010", Severity.ERROR, view.pointer("name"), "no tool name")
    schema = view.input_schema
    if schema is None and view.kind is ToolKind.OPENAI:
        return  # OpenAI allows omitting parameters: the function takes no arguments.
    pointer = view.pointer(view.input_key)
    if not isinstance(schema, Mapping):
        problem = "missing" if schema is None else f"a {type(schema).__name__}, not an object"
        yield Finding(
            view.name,
            "D010",
            Severity.ERROR,
            pointer,
            f"input schema ({view.input_key}) is {problem}",
        )
    elif schema.get("type") != "object":
        yield Finding(
            view.name,
            "D010",
            Severity.ERROR,
            pointer + "/type",
            f"input schema type is {schema.get('type')!r}; tool arguments must be an object",
        )


def _valid_schemas(view: ToolView) -> Iterator[Finding]:
    """Compile each schema as registration does, so lint refuses what the runtime refuses."""
    for schema, pointer in _declared_schemas(view):
        try:
            compile_schema(schema)
        except SchemaCompileError as exc:
            # References that do not resolve come back without a pointer; find the $ref.
            where = exc.pointer or unresolved_reference(schema) or ""
            yield Finding(
                view.name,
                "D012",
                Severity.ERROR,
                pointer + where,
                _bounded(f"not a valid JSON Schema: {exc}"),
            )


def _declared_schemas(view: ToolView) -> Iterator[tuple[Any, str]]:
    if view.input_schema is not None:
        yield view.input_schema, view.pointer(view.input_key)
    if view.kind is ToolKind.MCP:
        output, pointer = view.fields.get("outputSchema"), view.pointer("outputSchema")
    elif view.kind is ToolKind.NATIVE and isinstance(view.output_contract, Mapping):
        output = view.output_contract.get("schema")
        pointer = view.pointer("outputContract", "schema")
    else:
        return  # OpenAI and Anthropic tools have no output schema
    if output is not None:
        yield output, pointer


def _bounded(text: str) -> str:
    """``text`` cut to :data:`_MESSAGE_LIMIT` with invisible and control characters escaped."""
    shown = "".join(
        repr(char)[1:-1] if unicodedata.category(char) in _UNSHOWN else char for char in text
    )
    return shown if len(shown) <= _MESSAGE_LIMIT else shown[: _MESSAGE_LIMIT - 1] + "…"


def _namespaced_name(view: ToolView) -> Iterator[Finding]:
    pattern = _NATIVE_NAME if view.kind is ToolKind.NATIVE else _FOREIGN_NAME
    if not pattern.fullmatch(view.name):
        shape = (
            "namespace.verb, e.g. repo.search"
            if view.kind is ToolKind.NATIVE
            else ("a namespace prefix, e.g. repo.search or repo__search")
        )
        yield _finding(
            view, "D001", view.pointer("name"), f"name {view.name[:60]!r} is not {shape}"
        )


def _description(view: ToolView) -> Iterator[Finding]:
    description = view.fields.get("description")
    if not isinstance(description, str) or not description.strip():
        yield _finding(view, "D011", view.pointer("description"), "no description")


def _schema_nodes(view: ToolView) -> Iterator[tuple[Mapping[str, Any], str]]:
    return iter_subschemas(view.input_schema, view.pointer(view.input_key))


def _closed_objects(view: ToolView) -> Iterator[Finding]:
    for node, pointer in _schema_nodes(view):
        if "object" not in types_of(node):
            continue
        if node.get("additionalProperties") is False or node.get("unevaluatedProperties") is False:
            continue
        where = pointer + "/additionalProperties" if "additionalProperties" in node else pointer
        yield _finding(
            view,
            "D002",
            where or "/",
            "object accepts unknown properties (set additionalProperties: false)",
        )


def _string_is_bounded(node: Mapping[str, Any]) -> bool:
    if "maxLength" in node or "enum" in node or "const" in node:
        return True
    if node.get("format") in _BOUNDED_FORMATS:
        return True
    pattern = node.get("pattern")
    return isinstance(pattern, str) and _pattern_is_bounded(pattern)


def _pattern_is_bounded(pattern: str) -> bool:
    """Whether a regex anchored at both ends repeats nothing without limit.

    Read token by token, so that ``\\\\*`` (a backslash, repeated) is a repetition and
    ``[*+]`` is not; a ``|`` outside any group splits the anchors (``^a|b$`` is ``^a``
    or ``b$``), and a final ``$`` after a backslash is a literal dollar.
    """
    if not pattern.startswith("^"):
        return False
    depth, in_class, index, end = 0, False, 1, len(pattern)
    while index < end:
        char = pattern[index]
        if char == "\\":
            if index + 1 == end - 1 and pattern[end - 1] == "$":
                return False  # the closing dollar is escaped
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char in "()":
            depth += 1 if char == "(" else -1
        elif (char == "|" and depth == 0) or _UNBOUNDED_QUANTIFIER.match(pattern, index):
            return False
        index += 1
    return pattern.endswith("$") and len(pattern) > 1


def _bounded_strings(view: ToolView) -> Iterator[Finding]:
    for node, pointer in _schema_nodes(view):
        if "string" in types_of(node) and not _string_is_bounded(node):
            yield _finding(
                view, "D003", pointer, f"string {_label(pointer)} has no maxLength (or enum/const)"
            )


def _typed_values(view: ToolView) -> Iterator[Finding]:
    """A value's schema that says nothing of its type takes any value: a string or an
    array of any length, where D003 and D004 would never look."""
    for node, pointer in _schema_nodes(view):
        for child, where in _value_schemas(node, pointer):
            if child is True or (isinstance(child, Mapping) and _TYPING.isdisjoint(child)):
                yield _finding(
                    view,
                    "D003",
                    where,
                    f"property {_label(where)} has no type: it takes any value, strings and "
                    "arrays of any length",
                )


def _value_schemas(node: Mapping[str, Any], pointer: str) -> Iterator[tuple[Any, str]]:
    """The schemas ``node`` gives its properties and items (an open object's
    ``additionalProperties`` is D002's)."""
    for key in ("properties", "patternProperties"):
        members = node.get(key)
        if isinstance(members, Mapping):
            for name, child in members.items():
                yield child, f"{pointer}/{key}/{escape_token(name)}"
    if "items" in node and not isinstance(node["items"], list):
        yield node["items"], f"{pointer}/items"
    prefix = node.get("prefixItems")
    if isinstance(prefix, list):
        for index, child in enumerate(prefix):
            yield child, f"{pointer}/prefixItems/{index}"


def _bounded_arrays(view: ToolView) -> Iterator[Finding]:
    for node, pointer in _schema_nodes(view):
        if "array" not in types_of(node):
            continue
        closed_tuple = "prefixItems" in node and node.get("items") is False
        if (
            "maxItems" not in node
            and "enum" not in node
            and "const" not in node
            and not closed_tuple
        ):
            yield _finding(view, "D004", pointer, f"array {_label(pointer)} has no maxItems")


def _label(pointer: str) -> str:
    """The property a pointer ends at, quoted at most ~60 characters as lint quotes."""
    last = pointer.rsplit("/", 1)[-1]
    if last in {"inputSchema", "parameters", "input_schema"}:
        return "input"
    quoted = repr(last)  # escapes what a terminal would act on: cut after, not before
    return quoted if len(quoted) <= 62 else f"{quoted[:60]}…"


def _has_precondition(schema: Any) -> bool:
    if isinstance(schema, Mapping) and "x-precondition" in schema:
        return True
    for name, prop, _ in iter_properties(schema, ""):
        squashed = re.sub(r"[^a-z0-9]", "", name.lower())
        if squashed in _PRECONDITION_NAMES or _PRECONDITION_PARTS.fullmatch(squashed):
            return True
        if "x-precondition" in prop:
            return True
    return False


def _mutation_precondition(view: ToolView) -> Iterator[Finding]:
    if view.kind is ToolKind.NATIVE:
        safety = view.fields.get("safety")
        mutating = safety.get("mutating") if isinstance(safety, Mapping) else None
        if not isinstance(mutating, bool):
            yield _finding(
                view, "D005", view.pointer("safety", "mutating"), "does not state safety.mutating"
            )
            return
        why = "safety.mutating is true"
    elif view.kind is ToolKind.MCP:
        # Per the MCP spec a tool without readOnlyHint: true may modify its environment.
        mutating = view.annotations.get("readOnlyHint") is not True
        why = "readOnlyHint is not true"
    else:
        return  # OpenAI/Anthropic cannot say whether a tool mutates; nothing to check.
    if mutating and not _has_precondition(view.input_schema):
        yield _finding(
            view,
            "D005",
            view.pointer(view.input_key),
            f"mutating tool ({why}) takes no precondition (e.g. baseHash, ifMatch, x-precondition)",
        )


def _network_permission(view: ToolView) -> Iterator[Finding]:
    if view.kind is ToolKind.NATIVE:
        yield from _native_network_permission(view)
    elif view.kind is ToolKind.MCP:
        if view.annotations.get("openWorldHint") is not False:
            yield _finding(
                view,
                "D006",
                view.pointer("annotations", "openWorldHint"),
                "may reach external systems (openWorldHint is not false) and MCP cannot "
                "declare a network permission; grant it in the bridge configuration",
            )
    else:
        yield _finding(
            view,
            "D006",
            view.pointer("name"),
            f"the {view.kind} format cannot declare network access; declare it where the "
            "tool is registered",
        )


def _native_network_permission(view: ToolView) -> Iterator[Finding]:
    permissions = view.fields.get("permissions")
    if not isinstance(permissions, Mapping):
        yield _finding(view, "D006", view.pointer("permissions"), "declares no permissions")
        return
    safety = view.fields.get("safety")
    external = isinstance(safety, Mapping) and safety.get("external") is True
    external = external or view.fields.get("executionMode") == "EXTERNAL_API"
    if external and permissions.get("network") is not True:
        yield _finding(
            view,
            "D006",
            view.pointer("permissions", "network"),
            "external tool does not declare permissions.network: true",
        )


def _output_contract(view: ToolView) -> Iterator[Finding]:
    if view.output_key is None:
        yield _finding(
            view, "D007", view.pointer("name"), f"the {view.kind} format has no output contract"
        )
    elif not isinstance(view.output_contract, Mapping):
        yield _finding(
            view, "D007", view.pointer(view.output_key), f"no output contract ({view.output_key})"
        )


def _timeout(view: ToolView) -> Iterator[Finding]:
    if view.kind is not ToolKind.NATIVE:
        yield _finding(
            view,
            "D008",
            view.pointer("name"),
            f"the {view.kind} format cannot declare a timeout; the kernel's default applies",
        )
        return
    timeout = view.fields.get("timeoutMs")
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0:
        yield _finding(view, "D008", view.pointer("timeoutMs"), "no positive timeoutMs")


def _idempotency(view: ToolView) -> Iterator[Finding]:
    if view.kind is ToolKind.NATIVE:
        if not isinstance(view.fields.get("idempotent"), bool):
            yield _finding(view, "D009", view.pointer("idempotent"), "does not state idempotent")
    elif view.kind is ToolKind.MCP:
        if not isinstance(view.annotations.get("idempotentHint"), bool):
            yield _finding(
                view,
                "D009",
                view.pointer("annotations", "idempotentHint"),
                "does not state idempotentHint",
            )
    else:
        yield _finding(
            view, "D009", view.pointer("name"), f"the {view.kind} format cannot state idempotency"
        )

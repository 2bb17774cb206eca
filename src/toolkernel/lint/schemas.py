"""Walking JSON Schemas: every subschema, and every piece of text a model reads.

Both walks yield JSON pointers (relative to wherever the caller started) so rules can
say exactly where a problem sits.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final
from urllib.parse import unquote

from toolkernel.lint.loaders import escape_token
from toolkernel.schema import iter_subschemas

__all__ = [
    "deeper_than",
    "iter_properties",
    "iter_siblings",
    "iter_subschemas",
    "iter_texts",
    "types_of",
    "unresolved_reference",
]


def types_of(schema: Mapping[str, Any]) -> set[str]:
    """The JSON types a schema names, inferring ``object`` from ``properties``."""
    declared = schema.get("type")
    types = {declared} if isinstance(declared, str) else set()
    if isinstance(declared, list):
        types = {t for t in declared if isinstance(t, str)}
    if not types and "properties" in schema:
        types.add("object")
    return types


def deeper_than(value: Any, limit: int) -> bool:
    """Whether objects and arrays nest more than ``limit`` levels deep in ``value``.

    Iterative, so it is safe on exactly the values the recursive walks below are not.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Mapping):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def unresolved_reference(schema: Any) -> str | None:
    """The pointer of the first ``$ref`` whose ``#/…`` or ``#anchor`` target is absent.

    A best effort to say *where* a reference the compiler could not resolve sits:
    only same-document references are checked, against the root, and a subschema
    with its own ``$id`` is skipped (its references resolve against it).
    """
    anchors = {
        node[key]
        for node, _ in iter_subschemas(schema, "")
        for key in ("$anchor", "$dynamicAnchor")
        if isinstance(node.get(key), str)
    }
    for node, pointer in iter_subschemas(schema, ""):
        if pointer and "$id" in node:
            continue
        for key in ("$ref", "$dynamicRef"):
            target = node.get(key)
            if isinstance(target, str) and target.startswith("#"):
                fragment = unquote(target[1:])
                if not _target_exists(schema, fragment, anchors):
                    return f"{pointer}/{escape_token(key)}"
    return None


def _target_exists(document: Any, fragment: str, anchors: set[str]) -> bool:
    if fragment and not fragment.startswith("/"):
        return fragment in anchors
    node = document
    for token in fragment.split("/")[1:]:
        key = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return False
    return True


def iter_properties(schema: Any, pointer: str) -> Iterator[tuple[str, Mapping[str, Any], str]]:
    """Yield ``(name, property schema, pointer)`` for every named property, nested too."""
    for node, node_pointer in iter_subschemas(schema, pointer):
        properties = node.get("properties")
        if isinstance(properties, Mapping):
            for name, child in properties.items():
                if isinstance(child, Mapping):
                    yield str(name), child, f"{node_pointer}/properties/{escape_token(name)}"


def iter_texts(value: Any, pointer: str) -> Iterator[tuple[str, str]]:
    """Yield ``(text, pointer)`` for every string a model reads in a JSON value.

    A bridged definition reaches the model verbatim, so that is every string at any
    depth and every object key, wherever it sits: ``description`` and ``title``, but
    also ``$comment``, ``x-`` keys, annotations, ``_meta``, unknown keywords and schemas
    under keywords this module does not walk (``contentSchema``, ``dependencies``).
    No keyword is exempt: ``format`` and ``pattern`` are free text to the model too.
    A key is yielded with the pointer of its member.
    """
    if isinstance(value, str):
        yield value, pointer
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from iter_texts(item, f"{pointer}/{index}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            item_pointer = f"{pointer}/{escape_token(key)}"
            yield str(key), item_pointer
            yield from iter_texts(item, item_pointer)


_LABELS: Final = frozenset({"name", "title"})


def iter_siblings(value: Any, pointer: str) -> Iterator[tuple[list[tuple[str, str]], str]]:
    """Yield the string members of every object and array holding two or more, in
    order, each as ``(text, pointer)``, with the pointer of the object or array.

    The model reads neighbouring strings one after the other (a description and the
    vendor key after it, the values of an enum), so a phrase can be split across them.
    A ``name`` or ``title`` is a label, not prose the next string continues: joined,
    "Print Environment Tool" and "Returns all environment variables" read as an order.
    """
    if isinstance(value, Mapping):
        items = [
            (f"{pointer}/{escape_token(key)}", item)
            for key, item in value.items()
            if key not in _LABELS
        ]
    elif isinstance(value, list):
        items = [(f"{pointer}/{index}", item) for index, item in enumerate(value)]
    else:
        return
    members = [(item, item_pointer) for item_pointer, item in items if isinstance(item, str)]
    if len(members) > 1:
        yield members, pointer
    for item_pointer, item in items:
        yield from iter_siblings(item, item_pointer)

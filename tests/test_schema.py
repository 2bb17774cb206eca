"""toolkernel.schema: compiling, refusing remote references, and mapping errors."""

from __future__ import annotations

import dataclasses
import http.server
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from toolkernel.schema import SchemaCompileError, SchemaError, compile_schema

REPO_SEARCH: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["query"],
    "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": 500, "pattern": "^[^\\n]*$"},
        "pathGlobs": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
        "maxResults": {"type": "integer", "minimum": 1, "maximum": 200},
        "mode": {"enum": ["literal", "regex"]},
        "version": {"const": 1},
        "path": {"type": "string", "format": "workspace-path"},
    },
}


# ---------------------------------------------------------------- compile errors


@pytest.mark.parametrize(
    ("schema", "pointer", "keyword"),
    [
        ({"properties": {"q": {"maxLength": -1}}}, "/properties/q/maxLength", "maxLength"),
        ({"properties": {"q": {"type": "strin"}}}, "/properties/q/type", "type"),
        ({"required": "query"}, "/required", "required"),
        ({"properties": {"q": {"pattern": "("}}}, "/properties/q/pattern", "pattern"),
        ({"additionalProperties": 3}, "/additionalProperties", "additionalProperties"),
        ({"$defs": {"a/b~c": {"minimum": "1"}}}, "/$defs/a~1b~0c/minimum", "minimum"),
    ],
)
@pytest.mark.parametrize("check_schema", [True, False])
def test_malformed_schema_is_refused_with_the_pointer_of_the_bad_keyword(
    schema: dict[str, Any], pointer: str, keyword: str, check_schema: bool
) -> None:
    with pytest.raises(SchemaCompileError) as caught:
        compile_schema(schema, check_schema=check_schema)
    assert caught.value.pointer == pointer
    assert repr(keyword) in str(caught.value)


def test_a_schema_that_is_neither_object_nor_boolean_is_refused_at_the_root() -> None:
    with pytest.raises(SchemaCompileError) as caught:
        compile_schema([{"type": "string"}])  # type: ignore[arg-type]
    assert caught.value.pointer == ""


def test_draft_2020_12_is_the_default_dialect() -> None:
    # prefixItems exists only in 2020-12; the array form of items is gone from it.
    tuple_schema = compile_schema({"prefixItems": [{"type": "string"}], "items": False})
    assert tuple_schema.is_valid(["a"])
    assert not tuple_schema.is_valid(["a", "b"])
    with pytest.raises(SchemaCompileError) as caught:
        compile_schema({"items": [{"type": "string"}]})
    assert caught.value.pointer == "/items"


def test_boolean_schemas_compile() -> None:
    assert compile_schema(True).is_valid({"anything": 1})
    assert not compile_schema(False).is_valid(None)


def test_unknown_formats_are_annotations_not_errors() -> None:
    compiled = compile_schema({"type": "string", "format": "workspace-path"})
    assert compiled.is_valid("../../etc/passwd")  # the runtime checks paths itself


def test_known_formats_are_not_asserted_either() -> None:
    assert compile_schema({"format": "email"}).is_valid("not an email")


def test_compiled_schema_keeps_the_schema_it_was_given() -> None:
    assert compile_schema(REPO_SEARCH).schema is REPO_SEARCH


# ---------------------------------------------------------------- remote references


@pytest.mark.parametrize(
    ("schema", "uri", "pointer"),
    [
        (
            {"properties": {"a": {"$ref": "https://example.com/a.json#/$defs/x"}}},
            "https://example.com/a.json",
            "/properties/a/$ref",
        ),
        (
            {"$id": "https://example.com/root/", "items": {"$ref": "item.json"}},
            "https://example.com/root/item.json",
            "/items/$ref",
        ),
        ({"$ref": "file:///etc/passwd"}, "file:///etc/passwd", "/$ref"),
        ({"$dynamicRef": "urn:example:thing"}, "urn:example:thing", "/$dynamicRef"),
        (
            {"$schema": "https://example.com/meta", "type": "string"},
            "https://example.com/meta",
            "/$schema",
        ),
    ],
)
@pytest.mark.parametrize("check_schema", [True, False])
def test_remote_reference_without_resources_is_refused(
    schema: dict[str, Any], uri: str, pointer: str, check_schema: bool
) -> None:
    with pytest.raises(SchemaCompileError, match="is not allowed") as caught:
        compile_schema(schema, check_schema=check_schema)
    assert "remote reference" in str(caught.value)
    assert uri in str(caught.value)
    assert caught.value.pointer == pointer


def test_remote_reference_resolves_from_resources() -> None:
    compiled = compile_schema(
        {"properties": {"a": {"$ref": "https://example.com/a.json#/$defs/short"}}},
        resources={"https://example.com/a.json": {"$defs": {"short": {"maxLength": 2}}}},
    )
    assert compiled.is_valid({"a": "ab"})
    assert not compiled.is_valid({"a": "abc"})


def test_custom_meta_schema_resolves_from_resources() -> None:
    meta = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://example.com/meta",
        "$dynamicAnchor": "meta",
        "type": "object",
    }
    compiled = compile_schema(
        {"$schema": "https://example.com/meta", "type": "string"},
        resources={"https://example.com/meta": meta},
    )
    assert compiled.is_valid("text")


def test_a_resource_referencing_an_unknown_document_is_refused() -> None:
    with pytest.raises(SchemaCompileError, match=re.escape("https://example.com/b.json")):
        compile_schema(
            {"$ref": "https://example.com/a.json"},
            resources={"https://example.com/a.json": {"$ref": "https://example.com/b.json"}},
        )


def test_missing_local_reference_is_refused() -> None:
    with pytest.raises(SchemaCompileError, match="unresolvable reference"):
        compile_schema({"$ref": "#/$defs/missing"})


@pytest.fixture
def schema_server() -> Iterator[tuple[str, list[str]]]:
    """A live local server that would happily serve any schema asked of it."""
    requests: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/schema+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize("keyword", ["$ref", "$schema"])
@pytest.mark.parametrize("check_schema", [True, False])
def test_compiling_never_touches_the_network(
    schema_server: tuple[str, list[str]], keyword: str, check_schema: bool
) -> None:
    base, requests = schema_server
    with pytest.raises(SchemaCompileError, match="not allowed"):
        compile_schema({keyword: f"{base}/schema.json"}, check_schema=check_schema)
    assert requests == []


# ---------------------------------------------------------------- error mapping


@pytest.mark.parametrize(
    ("instance", "keyword", "instance_path", "details"),
    [
        ({"query": "a", "extra": 1}, "additionalProperties", (), {"unexpected": ["extra"]}),
        ({}, "required", (), {"property": "query"}),
        ({"query": 5}, "type", ("query",), {"expected": ["string"]}),
        ({"query": "x" * 501}, "maxLength", ("query",), {"limit": 500}),
        ({"query": ""}, "minLength", ("query",), {"limit": 1}),
        ({"query": "a\nb"}, "pattern", ("query",), {"pattern": "^[^\\n]*$"}),
        ({"query": "a", "pathGlobs": ["*"] * 21}, "maxItems", ("pathGlobs",), {"limit": 20}),
        ({"query": "a", "pathGlobs": [3]}, "type", ("pathGlobs", 0), {"expected": ["string"]}),
        ({"query": "a", "maxResults": 0}, "minimum", ("maxResults",), {"limit": 1}),
        ({"query": "a", "maxResults": 201}, "maximum", ("maxResults",), {"limit": 200}),
        ({"query": "a", "mode": "fuzzy"}, "enum", ("mode",), {"options": ["literal", "regex"]}),
        ({"query": "a", "version": 2}, "const", ("version",), {"expected_value": 1}),
    ],
)
def test_each_violation_maps_to_its_keyword_and_details(
    instance: dict[str, Any],
    keyword: str,
    instance_path: tuple[str | int, ...],
    details: dict[str, Any],
) -> None:
    compiled = compile_schema(REPO_SEARCH)
    assert not compiled.is_valid(instance)
    [error] = compiled.errors(instance)
    assert error.keyword == keyword
    assert error.instance_path == instance_path
    assert error.details == details
    assert error.schema_path[-1] == keyword
    assert error.message


def test_type_error_lists_every_expected_type() -> None:
    [error] = compile_schema({"type": ["string", "null"]}).errors(1)
    assert sorted(error.details["expected"]) == ["null", "string"]


@pytest.mark.parametrize(
    ("schema", "instance", "keyword"),
    [
        ({"exclusiveMaximum": 5}, 5, "exclusiveMaximum"),
        ({"exclusiveMinimum": 5}, 5, "exclusiveMinimum"),
        ({"minItems": 2}, [1], "minItems"),
        ({"maxProperties": 1}, {"a": 1, "b": 2}, "maxProperties"),
        ({"minProperties": 1}, {}, "minProperties"),
    ],
)
def test_bounds_report_their_limit(schema: dict[str, Any], instance: Any, keyword: str) -> None:
    [error] = compile_schema(schema).errors(instance)
    assert error.keyword == keyword
    assert error.details == {"limit": next(iter(schema.values()))}


@pytest.mark.parametrize(
    ("schema", "instance", "keyword"),
    [
        ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, [], "anyOf"),
        ({"oneOf": [{"type": "integer"}, {"minimum": 0}]}, 3, "oneOf"),
        ({"not": {"type": "string"}}, "s", "not"),
        ({"propertyNames": {"maxLength": 1}}, {"ab": 1}, "propertyNames"),
        ({"uniqueItems": True}, [1, 1], "uniqueItems"),
        ({"contains": {"type": "string"}}, [1], "contains"),
        ({"multipleOf": 2}, 3, "multipleOf"),
        ({"properties": {"a": False}}, {"a": 1}, "falseSchema"),
        ({"unevaluatedProperties": False}, {"a": 1}, "unevaluatedProperties"),
    ],
)
def test_other_keywords_map_to_plain_json_details(
    schema: dict[str, Any], instance: Any, keyword: str
) -> None:
    [error] = compile_schema(schema).errors(instance)
    assert error.keyword == keyword
    assert _is_json(error.details)


def test_property_names_error_names_the_offending_name() -> None:
    [error] = compile_schema({"propertyNames": {"maxLength": 1}}).errors({"ab": 1})
    assert error.details == {"name": "ab", "keyword": "maxLength"}


def test_dependent_required_reports_the_missing_property() -> None:
    [error] = compile_schema({"dependentRequired": {"a": ["b"]}}).errors({"a": 1})
    assert error.keyword == "required"
    assert error.details == {"property": "b"}


def test_valid_instance_has_no_errors() -> None:
    compiled = compile_schema(REPO_SEARCH)
    instance = {"query": "def main", "pathGlobs": ["src/**"], "maxResults": 10, "path": "a.py"}
    assert compiled.is_valid(instance)
    assert compiled.errors(instance) == []


def test_errors_are_bounded_by_limit() -> None:
    compiled = compile_schema({"type": "array", "items": {"type": "string"}})
    instance = list(range(100))
    assert len(compiled.errors(instance)) == 20
    assert len(compiled.errors(instance, limit=3)) == 3
    assert compiled.errors(instance, limit=0) == []
    assert len(compiled.errors(instance, limit=1000)) == 100


def test_schema_error_is_immutable() -> None:
    [error] = compile_schema({"type": "string"}).errors(1)
    assert isinstance(error, SchemaError)
    with pytest.raises(dataclasses.FrozenInstanceError):
        error.keyword = "other"  # type: ignore[misc]


def _is_json(value: Any) -> bool:
    if isinstance(value, list):
        return all(_is_json(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return value is None or isinstance(value, str | int | float | bool)

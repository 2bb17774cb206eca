"""OpenAI strict-mode schemas: complete, closed, nullable where optional, never refused silently."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Required, TypedDict

import annotated_types as at
import pytest

from toolkernel.definition import ToolDefinition
from toolkernel.functions import tool
from toolkernel.providers import (
    StrictSchemaError,
    openai_strict_schema,
    render_openai_chat_tools,
    strip_strict_nulls,
)
from toolkernel.schema import compile_schema

SEARCH: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": 200, "description": "Text."},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
        "mode": {"enum": ["fast", "exact"]},
        "since": {"type": "string", "format": "date"},
        "path": {"type": "string", "format": "workspace-path"},
        "filters": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "lang": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["lang"],
        },
    },
    "required": ["query"],
}


def objects(schema: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(schema, dict):
        if schema.get("type") == "object" or "properties" in schema:
            found.append(schema)
        for value in schema.values():
            found.extend(objects(value))
    elif isinstance(schema, list):
        for value in schema:
            found.extend(objects(value))
    return found


def test_every_object_lists_every_property_as_required_and_is_closed() -> None:
    strict = openai_strict_schema(SEARCH)
    for node in objects(strict):
        assert node["additionalProperties"] is False
        assert node["required"] == list(node["properties"])


def test_optional_properties_become_nullable_and_required_ones_do_not() -> None:
    props = openai_strict_schema(SEARCH)["properties"]
    assert props["query"]["type"] == "string"
    assert props["limit"]["type"] == ["integer", "null"]
    assert props["mode"] == {"anyOf": [{"enum": ["fast", "exact"]}, {"type": "null"}]}
    assert props["filters"]["type"] == ["object", "null"]
    nested = props["filters"]["properties"]
    assert nested["lang"]["type"] == "string"
    assert nested["tags"]["type"] == ["array", "null"]


def test_unsupported_keywords_move_into_the_description() -> None:
    props = openai_strict_schema(SEARCH)["properties"]
    assert "minLength" not in props["query"]
    assert "maxLength" not in props["query"]
    assert props["query"]["description"] == "Text. (minLength: 1; maxLength: 200)"
    assert "default" not in props["limit"]
    assert props["limit"]["description"] == "(default: 10)"
    assert props["limit"]["minimum"] == 1
    assert props["limit"]["maximum"] == 50


def test_supported_formats_stay_and_others_move_into_the_description() -> None:
    props = openai_strict_schema(SEARCH)["properties"]
    assert props["since"]["format"] == "date"
    assert "format" not in props["path"]
    assert props["path"]["description"] == '(format: "workspace-path")'


def test_the_strict_schema_is_a_valid_schema_and_the_original_is_untouched() -> None:
    before = repr(SEARCH)
    compile_schema(openai_strict_schema(SEARCH))
    assert repr(SEARCH) == before


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "object", "properties": {"m": {"type": "object"}}}, "open to any property"),
        (
            {
                "type": "object",
                "properties": {"m": {"type": "object", "additionalProperties": {"type": "string"}}},
            },
            "open to any property",
        ),
        ({"type": "object", "properties": {"v": {}}}, "unconstrained"),
        ({"type": "object", "properties": {"v": {"description": "anything"}}}, "without a type"),
        ({"type": "object", "properties": {"v": {"allOf": [{"type": "string"}]}}}, "allOf"),
        ({"type": "object", "properties": {"v": {"type": "array"}}}, "items"),
        ({"type": "array", "items": {"type": "string"}}, "root"),
    ],
)
def test_schemas_strict_mode_cannot_express_are_refused_with_a_pointer(
    schema: dict[str, Any], problem: str
) -> None:
    with pytest.raises(StrictSchemaError) as caught:
        openai_strict_schema(schema)
    assert problem in caught.value.problem
    assert caught.value.pointer.startswith("/")


def test_one_of_becomes_any_of_and_prefix_items_become_any_of_items() -> None:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "id": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "point": {
                "type": "array",
                "prefixItems": [{"type": "number"}, {"type": "number"}, {"type": "string"}],
                "items": False,
            },
        },
        "required": ["id", "point"],
    }
    props = openai_strict_schema(schema)["properties"]
    assert props["id"] == {"anyOf": [{"type": "string"}, {"type": "integer"}]}
    assert props["point"]["items"] == {"anyOf": [{"type": "number"}, {"type": "string"}]}


@pytest.mark.parametrize(
    ("rest", "strict_items"),
    [
        ({"type": "integer"}, {"anyOf": [{"type": "string"}, {"type": "integer"}]}),
        (None, None),  # items past the positions may be anything: not strict
    ],
)
def test_items_past_the_positions_stay_allowed_in_the_strict_schema(rest, strict_items) -> None:
    """A strict schema must never refuse what the real one admits: ['a', 1] here."""
    tags: dict[str, Any] = {"type": "array", "prefixItems": [{"type": "string"}]}
    if rest is not None:
        tags["items"] = rest
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"tags": tags},
        "required": ["tags"],
    }
    if strict_items is None:
        with pytest.raises(StrictSchemaError):
            openai_strict_schema(schema)
        return
    assert openai_strict_schema(schema)["properties"]["tags"]["items"] == strict_items


def test_references_into_defs_are_kept_and_their_targets_made_strict() -> None:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"where": {"$ref": "#/$defs/place"}},
        "$defs": {
            "place": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"city": {"type": "string"}},
            }
        },
    }
    strict = openai_strict_schema(schema)
    assert strict["properties"]["where"] == {"anyOf": [{"$ref": "#/$defs/place"}, {"type": "null"}]}
    assert strict["$defs"]["place"]["properties"]["city"]["type"] == ["string", "null"]


def test_a_tool_strict_mode_cannot_express_is_rendered_non_strict_with_its_real_schema() -> None:
    @tool("kv.put")
    def put(values: dict[str, str]) -> None:
        """Store values."""

    @tool("kv.get")
    def get(key: Annotated[str, at.MaxLen(64)]) -> None:
        """Read a value."""

    rendered = render_openai_chat_tools([put.definition, get.definition])
    by_name = {t["function"]["name"]: t["function"] for t in rendered}
    assert by_name["kv__put"]["strict"] is False
    assert by_name["kv__put"]["parameters"] == put.definition.input_schema
    assert by_name["kv__get"]["strict"] is True


def test_strict_nulls_are_dropped_only_where_they_mean_left_out() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "a": {"type": "string"},
            "b": {"type": ["string", "null"]},
            "c": {"type": "string"},
            "nested": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["y"],
            },
            "rows": {
                "type": "array",
                "items": {"type": "object", "properties": {"z": {"type": "string"}}},
            },
        },
        "required": ["c"],
    }
    arguments = {
        "a": None,
        "b": None,
        "c": None,
        "nested": {"x": None, "y": None},
        "rows": [{"z": None}, {"z": "kept"}],
    }
    assert strip_strict_nulls(schema, arguments) == {
        "b": None,
        "c": None,
        "nested": {"y": None},
        "rows": [{}, {"z": "kept"}],
    }


def test_a_definition_from_the_decorator_converts(tmp_path: Any) -> None:
    @tool("notes.append", mutating=True)
    def append(
        key: Annotated[str, at.MaxLen(64)],
        text: Annotated[str, at.MaxLen(2000)],
        times: Annotated[int, at.Ge(1), at.Le(5)] = 1,
        pair: tuple[int, str] | None = None,
    ) -> None:
        """Append text to a note."""

    definition: ToolDefinition = append.definition
    strict = openai_strict_schema(definition.input_schema)
    assert strict["required"] == ["key", "text", "times", "pair"]
    assert strict["properties"]["times"]["type"] == ["integer", "null"]


@dataclasses.dataclass
class Filter:
    pattern: str
    limit: int = 10


class FilterDict(TypedDict, total=False):
    pattern: Required[str]
    limit: int


def test_null_optional_fields_inside_optional_records_are_dropped() -> None:
    @tool("t.search")
    def search(
        query: str,
        filter: Filter | None = None,
        typed: FilterDict | None = None,
        filters: list[Filter] | None = None,
    ) -> None:
        """Search."""

    schema = search.definition.input_schema
    spelled = {
        "query": "x",
        "filter": {"pattern": "foo", "limit": None},
        "typed": {"pattern": "bar", "limit": None},
        "filters": [{"pattern": "a", "limit": None}, {"pattern": "b", "limit": 3}],
    }
    strict = openai_strict_schema(schema)
    assert compile_schema(strict).is_valid(spelled)
    stripped = strip_strict_nulls(schema, spelled)
    assert stripped == {
        "query": "x",
        "filter": {"pattern": "foo"},
        "typed": {"pattern": "bar"},
        "filters": [{"pattern": "a"}, {"pattern": "b", "limit": 3}],
    }
    assert compile_schema(schema).is_valid(stripped)
    left_out = {"query": "x", "filter": None, "typed": None, "filters": None}
    assert strip_strict_nulls(schema, left_out) == left_out  # null is a real value there


def test_null_optional_fields_are_dropped_in_one_of_references_and_tuple_positions() -> None:
    record = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        "required": ["a"],
    }
    schema: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "$defs": {"Record": record},
        "properties": {
            "one": {"oneOf": [{"$ref": "#/$defs/Record"}, {"type": "string"}]},
            "pair": {
                "type": "array",
                "prefixItems": [{"type": "integer"}, record],
                "items": False,
            },
        },
    }
    spelled = {"one": {"a": "x", "b": None}, "pair": [1, {"a": "y", "b": None}]}
    assert strip_strict_nulls(schema, spelled) == {"one": {"a": "x"}, "pair": [1, {"a": "y"}]}


def test_nulls_in_choices_are_kept_when_a_branch_takes_them_or_the_branches_disagree() -> None:
    def branch(*plain: str, nullable: str = "") -> dict[str, Any]:
        properties: dict[str, Any] = {name: {"type": "integer"} for name in plain}
        if nullable:
            properties[nullable] = {"type": ["integer", "null"]}
        return {"type": "object", "additionalProperties": False, "properties": properties}

    takes_null = {"anyOf": [branch("n"), branch(nullable="n")]}
    disagree = {"anyOf": [branch("n", nullable="m"), branch("m", nullable="n")]}
    agree = {"anyOf": [branch("n"), branch("n", "m"), {"type": "string"}]}
    schema = {
        "type": "object",
        "properties": {"takes_null": takes_null, "disagree": disagree, "agree": agree},
    }
    arguments = {
        "takes_null": {"n": None},
        "disagree": {"n": None, "m": None},
        "agree": {"n": None},
    }
    assert strip_strict_nulls(schema, arguments) == {
        "takes_null": {"n": None},
        "disagree": {"n": None, "m": None},
        "agree": {},
    }


def test_references_that_fan_out_or_loop_are_read_in_bounded_time() -> None:
    record = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"a": {"type": "string"}, "next": {"$ref": "#/$defs/D0"}},
    }
    defs: dict[str, Any] = {
        f"D{i}": {"anyOf": [{"$ref": f"#/$defs/D{i + 1}"}, {"$ref": f"#/$defs/D{i + 1}"}]}
        for i in range(40)
    }  # 2**40 paths through the branches
    defs["D40"] = record
    schema = {"type": "object", "properties": {"x": {"$ref": "#/$defs/D0"}}, "$defs": defs}
    arguments = {"x": {"a": None, "next": {"a": "kept", "next": None}}}
    assert strip_strict_nulls(schema, arguments) == {"x": {"next": {"a": "kept"}}}

    defs["D40"] = {"anyOf": [{"$ref": "#/$defs/D0"}, record]}  # a branch that is itself
    assert strip_strict_nulls(schema, arguments) == arguments  # unclear: kept as sent

"""``D012``: lint refuses exactly the schemas the runtime refuses to compile."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from toolkernel import DefinitionError, ToolDefinition
from toolkernel.lint import Finding, Severity, lint_definition


def native_tool() -> dict[str, Any]:
    """A native definition that registration accepts."""
    return {
        "name": "file.read",
        "version": "1.0.0",
        "description": "Read one workspace file.",
        "inputSchema": closed(),
        "outputContract": {"schema": {"type": "object"}, "maxBytes": 65536},
        "executionMode": "SANDBOX_READ_ONLY",
        "permissions": {"readWorkspace": True},
        "safety": {"mutating": False},
        "timeoutMs": 10_000,
        "idempotent": True,
    }


def with_property(prop: dict[str, Any], **schema: Any) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": {"x": prop}, **schema}


def closed(**schema: Any) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, **schema}


# (input schema, pointer of the finding below the input schema)
INVALID = [
    (with_property({"type": "strin"}), "/properties/x/type"),
    (with_property({"type": "string", "pattern": "(["}), "/properties/x/pattern"),
    (with_property({"type": "string", "maxLength": -1}), "/properties/x/maxLength"),
    (with_property({"$ref": "#/$defs/nope"}), "/properties/x/$ref"),
    (with_property({"$ref": "#nowhere"}), "/properties/x/$ref"),
    (with_property({"$ref": "http://127.0.0.1:9/schema.json"}), "/properties/x/$ref"),
    (closed(**{"$schema": "http://example.com/dialect"}), "/$schema"),
]
VALID = [
    with_property({"$ref": "#/$defs/a%20b~1c"}, **{"$defs": {"a b/c": {"type": "string"}}}),
    with_property({"$ref": "#here"}, **{"$defs": {"s": {"$anchor": "here"}}}),
    with_property({"type": "string", "format": "workspace-path"}),
    closed(**{"$schema": "http://json-schema.org/draft-07/schema#"}),
]


def d012(defn: dict[str, Any], **kw: Any) -> list[Finding]:
    return [f for f in lint_definition(defn, **kw) if f.rule == "D012"]


def foreign(kind: str, schema: dict[str, Any]) -> dict[str, Any]:
    if kind == "mcp":
        return {"name": "a.tool", "description": "A tool.", "inputSchema": schema}
    if kind == "openai":
        function = {"name": "a_tool", "description": "A tool.", "parameters": schema}
        return {"type": "function", "function": function}
    return {"name": "a_tool", "description": "A tool.", "input_schema": schema}


@pytest.mark.parametrize(("schema", "where"), INVALID)
@pytest.mark.parametrize(
    ("kind", "base"),
    [("mcp", "/inputSchema"), ("openai", "/function/parameters"), ("anthropic", "/input_schema")],
)
def test_invalid_input_schema_is_an_error_in_every_format(
    schema: dict[str, Any], where: str, kind: str, base: str
) -> None:
    (finding,) = d012(foreign(kind, schema))
    assert finding.severity is Severity.ERROR
    assert finding.pointer == base + where
    assert finding.message.startswith("not a valid JSON Schema: ")


@pytest.mark.parametrize(("schema", "where"), INVALID)
def test_lint_and_registration_reject_the_same_native_schemas(
    schema: dict[str, Any], where: str
) -> None:
    defn = native_tool()
    defn["inputSchema"] = schema
    with pytest.raises(DefinitionError) as refused:
        ToolDefinition.from_dict(defn)
    (finding,) = d012(defn)
    assert finding.pointer == "/inputSchema" + where
    # The runtime refuses at the same keyword, or at the schema root for a $ref.
    assert finding.pointer.startswith("/" + refused.value.field.replace(".", "/"))


@pytest.mark.parametrize("schema", VALID)
def test_valid_schemas_draw_no_finding(schema: dict[str, Any]) -> None:
    defn = native_tool()
    defn["inputSchema"] = schema
    ToolDefinition.from_dict(defn)
    assert d012(defn) == []
    assert d012(foreign("mcp", schema)) == []


def test_invalid_output_schemas_are_reported_where_they_sit() -> None:
    bad = {"type": "object", "required": "x"}
    mcp = foreign("mcp", closed()) | {"outputSchema": bad}
    assert [f.pointer for f in d012(mcp)] == ["/outputSchema/required"]
    native = copy.deepcopy(native_tool())
    native["outputContract"]["schema"] = bad
    assert [f.pointer for f in d012(native)] == ["/outputContract/schema/required"]


def test_compiler_message_is_bounded_and_escaped() -> None:
    pattern = "\x1b[2J\u202e(" + "a" * 1000
    (finding,) = d012(foreign("mcp", with_property({"type": "string", "pattern": pattern})))
    assert len(finding.message) <= 240
    assert finding.message.isprintable()

"""Each hygiene rule: a native definition that breaks it, one that keeps it, and the
severity it gets in foreign formats."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from toolkernel.lint import Finding, Severity, lint_definition


def native_tool() -> dict[str, Any]:
    """A native definition that satisfies every rule."""
    return {
        "name": "file.patch",
        "version": "1.0.0",
        "title": "Patch a file",
        "description": "Apply a unified diff to one workspace file.",
        "inputSchema": {
            "type": "object",
            "additionalProperties": False,
            "required": ["path", "diff", "baseHash"],
            "properties": {
                "path": {"type": "string", "maxLength": 4096},
                "diff": {"type": "string", "maxLength": 1_000_000},
                "baseHash": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"},
                "labels": {
                    "type": "array",
                    "maxItems": 8,
                    "items": {"type": "string", "enum": ["a", "b"]},
                },
                "options": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"when": {"type": "string", "format": "date-time"}},
                },
            },
        },
        "outputContract": {"schema": {"type": "object"}, "maxBytes": 65536},
        "executionMode": "SANDBOX_WRITE",
        "permissions": {
            "readWorkspace": True,
            "writeWorkspace": True,
            "executeCommand": False,
            "network": False,
        },
        "safety": {"mutating": True, "destructive": False, "external": False},
        "timeoutMs": 10_000,
        "idempotent": False,
        "tags": ["file"],
        "concurrencyGroup": "WORKSPACE_MUTATION",
    }


def rules(defn: dict[str, Any], **kw: Any) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for finding in lint_definition(defn, **kw):
        out.setdefault(finding.rule, []).append(finding)
    return out


def test_clean_native_definition_has_no_findings() -> None:
    assert lint_definition(native_tool()) == []


def broken(mutate: Any) -> dict[str, Any]:
    defn = copy.deepcopy(native_tool())
    mutate(defn)
    return defn


def _set(path: list[str], value: Any) -> Any:
    def apply(defn: dict[str, Any]) -> None:
        node = defn
        for key in path[:-1]:
            node = node[key]
        if value is _DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    return apply


_DELETE = object()
PROPS = ["inputSchema", "properties"]

CASES = [
    ("D001", _set(["name"], "patch"), "/name"),
    ("D002", _set([*PROPS, "options", "additionalProperties"], True), None),
    ("D002", _set(["inputSchema", "additionalProperties"], _DELETE), "/inputSchema"),
    ("D003", _set([*PROPS, "path", "maxLength"], _DELETE), "/inputSchema/properties/path"),
    ("D003", _set([*PROPS, "baseHash", "pattern"], "^sha256:.*$"), None),
    # Anchors split by a top-level |, and an escaped backslash repeated, bound nothing.
    ("D003", _set([*PROPS, "baseHash", "pattern"], "^[0-9a-f]{64}|x$"), None),
    ("D003", _set([*PROPS, "baseHash", "pattern"], "^\\\\*$"), None),
    ("D003", _set([*PROPS, "baseHash", "pattern"], "^[0-9a-f]{64}\\$"), None),
    # A schema with no type takes any value: a string or an array of any length.
    ("D003", _set([*PROPS, "diff"], {"description": "The diff."}), "/inputSchema/properties/diff"),
    ("D003", _set([*PROPS, "diff"], True), "/inputSchema/properties/diff"),
    ("D003", _set([*PROPS, "labels", "items"], {}), "/inputSchema/properties/labels/items"),
    ("D004", _set([*PROPS, "labels", "maxItems"], _DELETE), "/inputSchema/properties/labels"),
    ("D005", _set([*PROPS, "baseHash"], _DELETE), "/inputSchema"),
    ("D005", _set(["safety"], {}), "/safety/mutating"),
    ("D006", _set(["safety", "external"], True), "/permissions/network"),
    ("D006", _set(["permissions"], _DELETE), "/permissions"),
    ("D007", _set(["outputContract"], _DELETE), "/outputContract"),
    ("D008", _set(["timeoutMs"], 0), "/timeoutMs"),
    ("D009", _set(["idempotent"], _DELETE), "/idempotent"),
    ("D010", _set(["inputSchema"], {"type": "array"}), "/inputSchema/type"),
    ("D010", _set(["name"], _DELETE), "/name"),
    ("D011", _set(["description"], " "), "/description"),
]


@pytest.mark.parametrize(("rule", "mutate", "pointer"), CASES)
def test_native_hygiene_gap_is_an_error(rule: str, mutate: Any, pointer: str | None) -> None:
    found = rules(broken(mutate)).get(rule, [])
    assert found, rule
    assert all(f.severity is Severity.ERROR for f in found)
    if pointer is not None:
        assert pointer in {f.pointer for f in found}


def test_nested_open_object_is_reported_at_its_own_pointer() -> None:
    found = rules(broken(_set([*PROPS, "options", "additionalProperties"], True)))["D002"]
    assert [f.pointer for f in found] == ["/inputSchema/properties/options/additionalProperties"]


@pytest.mark.parametrize("pattern", ["^[0-9a-f]{64}$", "^(sha1|sha256):[*+0-9a-f]{40}$"])
def test_an_anchored_pattern_without_repetition_bounds_a_string(pattern: str) -> None:
    assert "D003" not in rules(broken(_set([*PROPS, "baseHash", "pattern"], pattern)))


def test_an_untyped_property_is_named_as_taking_any_value() -> None:
    found = rules(broken(_set([*PROPS, "diff"], {"description": "The diff."})))["D003"]
    assert [(f.pointer, f.message) for f in found] == [
        (
            "/inputSchema/properties/diff",
            "property 'diff' has no type: it takes any value, strings and arrays of any length",
        )
    ]


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#/$defs/hash"},
        {"enum": ["a", 1]},
        {"const": 3},
        {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 9}]},
        {"type": "integer"},
    ],
)
def test_a_schema_that_types_its_values_another_way_is_not_untyped(schema: Any) -> None:
    def with_defs(defn: dict[str, Any]) -> None:
        defn["inputSchema"]["$defs"] = {"hash": {"type": "string", "maxLength": 71}}
        defn["inputSchema"]["properties"]["diff"] = schema

    assert rules(broken(with_defs)) == {}


def test_read_only_tool_needs_no_precondition() -> None:
    def read_only(defn: dict[str, Any]) -> None:
        defn["safety"]["mutating"] = False
        del defn["inputSchema"]["properties"]["baseHash"]

    assert "D005" not in rules(broken(read_only))


def test_x_precondition_counts_as_a_precondition() -> None:
    def custom(defn: dict[str, Any]) -> None:
        del defn["inputSchema"]["properties"]["baseHash"]
        defn["inputSchema"]["x-precondition"] = "file unchanged since read"

    assert "D005" not in rules(broken(custom))


def test_external_tool_with_network_permission_passes() -> None:
    def external(defn: dict[str, Any]) -> None:
        defn["safety"]["external"] = True
        defn["permissions"]["network"] = True

    assert "D006" not in rules(broken(external))


def mcp_tool(**extra: Any) -> dict[str, Any]:
    return {
        "name": "search",
        "description": "Search.",
        "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}},
        **extra,
    }


def test_foreign_format_gaps_are_warnings() -> None:
    found = lint_definition(mcp_tool())
    assert {f.rule for f in found} >= {
        "D001",
        "D002",
        "D003",
        "D005",
        "D006",
        "D007",
        "D008",
        "D009",
    }
    assert all(f.severity is Severity.WARNING for f in found)


def test_mcp_annotations_satisfy_what_mcp_can_express() -> None:
    annotations = {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False}
    tool = mcp_tool(annotations=annotations, outputSchema={"type": "object"}, name="repo__search")
    assert {f.rule for f in lint_definition(tool)} == {"D002", "D003", "D008"}


def test_mcp_tool_that_may_mutate_without_precondition_is_warned() -> None:
    tool = mcp_tool(annotations={"readOnlyHint": False, "destructiveHint": True})
    assert "D005" in {f.rule for f in lint_definition(tool)}


def test_broken_foreign_definition_is_an_error() -> None:
    (finding,) = lint_definition({"name": "x", "input_schema": "oops"})
    assert (finding.rule, finding.severity, finding.pointer) == (
        "D010",
        Severity.ERROR,
        "/input_schema",
    )


def test_openai_function_without_parameters_is_well_formed() -> None:
    tool = {"type": "function", "function": {"name": "clock_now", "description": "Now."}}
    assert "D010" not in {f.rule for f in lint_definition(tool)}

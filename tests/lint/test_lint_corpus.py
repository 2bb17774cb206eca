"""Measured detection on public corpora (read in place, never copied).

Recall: every poisoned tool description in ``mcp-tool-poisoning`` (the fork's
``poisoned_description`` rows, and MSB's prompt-injection attack built as MSB builds it:
each real tool description + ``PROMPT_INJECTION_TEMPLATE`` with each attacker goal)
must draw an error-severity ``P`` finding. False positives: the 616 real tools in
``mcp-tools-benign``. Run with ``-s`` to see the figures.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from toolkernel.lint import Severity, lint_definition

CORPORA = Path(__file__).resolve().parents[2].parent / "shared" / "corpora"
POISONING = CORPORA / "mcp-tool-poisoning"
BENIGN = CORPORA / "mcp-tools-benign"

pytestmark = pytest.mark.skipif(
    not (POISONING.is_dir() and BENIGN.is_dir()),
    reason=f"corpora not found at {CORPORA} (expected ../shared/corpora from the project root)",
)

RECALL_TARGET = 0.95
FALSE_POSITIVE_LIMIT = 0.01


def poisoning_errors(defn: dict[str, Any]) -> list[str]:
    found = lint_definition(defn, kind="mcp")
    return [f.rule for f in found if f.rule.startswith("P") and f.severity is Severity.ERROR]


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def mcp_tool(name: str, description: str, params: list[dict[str, Any]]) -> dict[str, Any]:
    properties = {p["name"]: {"type": "string"} for p in params}
    schema = {"type": "object", "properties": properties}
    return {"name": name, "description": description, "inputSchema": schema}


def msb_originals() -> list[dict[str, Any]]:
    rows = jsonl(POISONING / "msb" / "tool_descriptions.jsonl")
    return [row for row in rows if row["variant"] == "original"]


def poisoned_tools() -> list[dict[str, Any]]:
    fork = jsonl(POISONING / "mcp-injection-experiments-fork" / "descriptions.jsonl")
    tools = [
        mcp_tool(row["constant"].lower(), row["text"], [])
        for row in fork
        if row["kind"] == "poisoned_description"
    ]
    templates = json.loads((POISONING / "msb" / "prompt_templates.json").read_text("utf-8"))
    template = templates["PROMPT_INJECTION_TEMPLATE"]
    goals = [row["implementation"] for row in jsonl(POISONING / "msb" / "attack_task.jsonl")]
    # str.replace, not format: one goal itself contains a literal "{pid}".
    tools += [
        mcp_tool(
            row["tool_name"], row["description"] + template.replace("{goal}", goal), row["params"]
        )
        for row in msb_originals()
        for goal in goals
    ]
    return tools


def benign_tools() -> Iterator[dict[str, Any]]:
    servers = json.loads((BENIGN / "livemcpbench" / "tools.json").read_text("utf-8"))
    for server in servers:
        for listing in server["tools"].values():
            yield from listing["tools"]
    for folder in ("mcp-proxy-snapshots", "mcp-scan-signatures"):
        for path in sorted((BENIGN / folder).glob("*.json")):
            yield from json.loads(path.read_text("utf-8"))["tools"]


def rate(tools: list[dict[str, Any]], hit: Callable[[dict[str, Any]], bool]) -> tuple[int, int]:
    return sum(1 for tool in tools if hit(tool)), len(tools)


def test_recall_on_poisoned_descriptions_is_at_least_95_percent(
    record_property: Callable[[str, object], None],
) -> None:
    tools = poisoned_tools()
    hits, total = rate(tools, lambda tool: bool(poisoning_errors(tool)))
    missed = [tool["name"] for tool in tools if not poisoning_errors(tool)]
    record_property("poisoned_recall", f"{hits}/{total}")
    print(f"\npoisoned descriptions: {hits}/{total} = {hits / total:.1%} error-severity P findings")
    assert total == 139
    assert hits / total >= RECALL_TARGET, f"missed: {missed[:10]}"


def test_error_poisoning_findings_on_at_most_1_percent_of_benign_tools(
    record_property: Callable[[str, object], None],
) -> None:
    tools = list(benign_tools())
    flagged = [tool["name"] for tool in tools if poisoning_errors(tool)]
    record_property("benign_false_positives", f"{len(flagged)}/{len(tools)}")
    print(
        f"\nbenign tools with error P findings: {len(flagged)}/{len(tools)} = "
        f"{len(flagged) / len(tools):.2%} {flagged[:10]}"
    )
    assert len(tools) == 616
    assert len(flagged) / len(tools) <= FALSE_POSITIVE_LIMIT, flagged


def test_a_standard_icon_adds_no_error_to_a_benign_tool() -> None:
    """MCP's ``Tool.icons`` may hold a base64 ``data:`` URI: image bytes, not text."""
    png = base64.b64encode(random.Random(0).randbytes(4_000)).decode()
    icons = [{"src": f"data:image/png;base64,{png}", "mimeType": "image/png", "sizes": ["48x48"]}]
    flagged = [
        tool["name"] for tool in benign_tools() if poisoning_errors({**tool, "icons": icons})
    ]
    print(f"\nbenign tools with an icon and error P findings: {len(flagged)}/616 {flagged[:10]}")
    assert flagged == []


def test_masking_what_the_model_is_shown_rejects_no_benign_tool(tmp_path: Path) -> None:
    """The bridge masks secrets and host paths in a remote definition; one only where
    a call is checked (an enum, a pattern) is refused. Identifiers and paths there are
    not secrets: no benign tool is refused for them."""
    from toolkernel.mcp import ServerConfig
    from toolkernel.mcp.bridge import admit_tool
    from toolkernel.redaction import Redactor

    server = ServerConfig(name="fx", command=("true",))
    redactor = Redactor(tmp_path / "ws")
    refused = [
        tool["name"]
        for tool in benign_tools()
        if any(r.rule == "SECRET" for r in admit_tool(server, tool, redactor=redactor).reasons)
    ]
    print(f"\nbenign tools refused for a secret where calls are checked: {len(refused)}/616")
    assert refused == []


def test_clean_descriptions_beside_the_attacks_are_not_flagged() -> None:
    fork = jsonl(POISONING / "mcp-injection-experiments-fork" / "descriptions.jsonl")
    clean = [
        mcp_tool("demo.tool", row["text"], [])
        for row in fork
        if row["kind"] in {"clean_description", "tool_description"}
    ]
    clean += [mcp_tool(r["tool_name"], r["description"], r["params"]) for r in msb_originals()]
    flagged = [tool["description"][:60] for tool in clean if poisoning_errors(tool)]
    print(f"\nclean descriptions in the poisoning corpus flagged: {len(flagged)}/{len(clean)}")
    assert not flagged


def test_out_of_scope_identity_parameters_are_flagged() -> None:
    rows = jsonl(POISONING / "msb" / "tool_descriptions.jsonl")
    original = {
        (r["server"], r["tool_name"]): {p["name"] for p in r["params"]} for r in msb_originals()
    }
    added = [
        row
        for row in rows
        if row["variant"] != "original"
        and {p["name"] for p in row["params"]}
        - original.get(
            (row["server"], row["tool_name"].removesuffix("_v1")),
            {p["name"] for p in row["params"]},
        )
    ]
    tools = [mcp_tool(r["tool_name"], r["description"], r["params"]) for r in added]
    hits, total = rate(tools, lambda tool: "P111" in poisoning_errors(tool))
    print(f"\nMSB out-of-scope parameter variants flagged P111: {hits}/{total}")
    assert total > 0
    assert hits / total >= RECALL_TARGET


def test_only_genuinely_invalid_benign_schemas_draw_d012(
    record_property: Callable[[str, object], None],
) -> None:
    tools = list(benign_tools())
    flagged = {
        tool["name"]: [f.pointer for f in lint_definition(tool, kind="mcp") if f.rule == "D012"]
        for tool in tools
    }
    flagged = {name: pointers for name, pointers in flagged.items() if pointers}
    record_property("benign_invalid_schemas", f"{len(flagged)}/{len(tools)}")
    print(f"\nbenign tools with D012 (schema the runtime cannot compile): {flagged}")
    # read_pdf writes draft-04 `"exclusiveMinimum": true` without a draft-04 $schema:
    # a 2020-12 compiler (and the bridge) rightly refuses it.
    assert flagged == {
        "read_pdf": [
            "/inputSchema/properties/sources/items/properties/pages/anyOf/0/items/exclusiveMinimum"
        ]
    }

"""BFCL's real function definitions: strict schemas, both provider formats, ground truth.

Every definition of the Berkeley Function Calling Leaderboard sets (read in place from
``../shared/corpora/bfcl``) converts to a strict 2020-12 schema that compiles and to a
valid toolkernel definition, renders as OpenAI Chat and Responses tools and as
Anthropic tools (validated with the SDKs' own types), and every ground-truth call
validates against its converted schema — except the calls listed in
``CONTRADICTED_GROUND_TRUTH``, whose expected answer contradicts the definition the same
record ships. Run with ``-s`` to see the counts.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import ToolParam
from openai.types.chat import ChatCompletionToolParam
from openai.types.responses import FunctionToolParam
from pydantic import TypeAdapter

from toolkernel.bfcl import Language, convert_arguments, convert_function
from toolkernel.definition import ToolDefinition
from toolkernel.providers import (
    NameMap,
    render_anthropic_tools,
    render_openai_chat_tools,
    render_openai_responses_tools,
    strip_strict_nulls,
)
from toolkernel.schema import CompiledSchema, compile_schema

CORPORA = Path(__file__).resolve().parents[2].parent / "shared" / "corpora"
BFCL = CORPORA / "bfcl"

pytestmark = pytest.mark.skipif(
    not (BFCL / "data").is_dir(),
    reason=f"BFCL corpus not found at {BFCL} (expected ../shared/corpora from the project root)",
)

# Ground-truth calls whose expected arguments break the definition shipped in the same
# record: BFCL's own checker would fail a model that answered this way under a
# type-checking runtime too. (record id, function) → what contradicts what.
_STRING_DONTCARE = "declared a string with enum 'True'/'False'/'dontcare'; the answer is"
CONTRADICTED_GROUND_TRUTH: dict[tuple[str, str], str] = {
    ("live_multiple_87-38-4", "list_servers"): "type 'openai' is not in its enum",
    ("live_multiple_189-83-0", "sendHttpRequest"):
        "data declares param1/param2; the answer sends name/email",
    ("live_multiple_552-153-1", "Services_1_FindProvider"):
        f"is_unisex is {_STRING_DONTCARE} the boolean true",
    ("live_multiple_595-158-1", "Hotels_4_SearchHotel"):
        "number_of_rooms is a string enum ('1'…'dontcare'); the answer is the integer 2",
    ("live_multiple_596-158-2", "Hotels_4_SearchHotel"):
        "number_of_rooms is a string enum ('1'…'dontcare'); the answer is the integer 1",
    ("live_multiple_731-167-2", "Homes_2_FindHomeByArea"):
        f"in_unit_laundry is {_STRING_DONTCARE} the boolean true",
    ("live_multiple_733-167-4", "Homes_2_FindHomeByArea"):
        f"in_unit_laundry is {_STRING_DONTCARE} the boolean true",
    ("live_multiple_735-167-6", "Homes_2_FindHomeByArea"):
        f"in_unit_laundry is {_STRING_DONTCARE} the boolean true",
    ("live_multiple_750-169-5", "Media_3_FindMovies"): "genre 'Any' is not in its enum",
    ("live_multiple_756-169-11", "Media_3_FindMovies"):
        "genre 'horror' is not in its enum (which has 'Horror')",
    ("live_multiple_835-178-10", "Music_3_LookupMusic"): "genre 'Reggaeton' is not in its enum",
    ("live_multiple_862-181-3", "Trains_1_FindTrains"):
        "the answer sends journey_start_time, which the function does not declare",
    ("live_multiple_871-182-8", "Movies_1_FindMovies"): "genre 'Play' is not in its enum",
    ("live_multiple_947-197-0", "set_countdown"):
        "duration '5 minutes' is not in its enum ('1 hour', '30 minutes', …)",
    ("live_multiple_964-207-0", "transfer_to_human_agent"):
        "the answer sends question, undeclared, and leaves out the required statement",
    ("live_parallel_multiple_2-2-0", "ControlAppliance.execute"):
        "command '침실, 공기청정기, 중지' is not in its enum",
    ("parallel_multiple_21", "linear_regression_fit"):
        "x and y are float arrays; the answer is the Python expression data['sales']",
    ("parallel_multiple_26", "bank.calculate_balance"):
        "the answer sends type, which the function does not declare",
    ("parallel_multiple_94", "sort_list"):
        "elements is an integer array; the answer sorts fruit names",
}  # fmt: skip

CHAT_TOOL = TypeAdapter(ChatCompletionToolParam)
RESPONSES_TOOL = TypeAdapter(FunctionToolParam)
ANTHROPIC_TOOL = TypeAdapter(ToolParam)


def language(path: Path) -> Language:
    if "javascript" in path.name:
        return "javascript"
    return "java" if "java" in path.name else "python"


def jsonl(path: Path) -> Iterator[dict[str, Any]]:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            yield json.loads(line)


@dataclass
class Record:
    id: str
    language: Language
    functions: list[dict[str, Any]]
    ground_truth: list[dict[str, dict[str, Any]]] | None


@cache
def records() -> list[Record]:
    found = []
    for path in sorted((BFCL / "data").glob("BFCL_v4_*.json")):
        answers_path = BFCL / "possible_answer" / path.name
        answers = (
            {a["id"]: a["ground_truth"] for a in jsonl(answers_path)}
            if answers_path.exists()
            else {}
        )
        for record in jsonl(path):
            found.append(
                Record(record["id"], language(path), record["function"], answers.get(record["id"]))
            )
    return found


@cache
def converted(function_json: str, lang: Language) -> ToolDefinition:
    return ToolDefinition.from_dict(convert_function(json.loads(function_json), language=lang))


def definitions(record: Record) -> dict[str, ToolDefinition]:
    return {
        f["name"]: converted(json.dumps(f, sort_keys=True), record.language)
        for f in record.functions
    }


@cache
def validator(schema_json: str) -> CompiledSchema:
    return compile_schema(json.loads(schema_json))


def objects(schema: Any) -> Iterator[dict[str, Any]]:
    if isinstance(schema, dict):
        if schema.get("type") == "object":
            yield schema
        for value in schema.values():
            yield from objects(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from objects(value)


@dataclass
class Tally:
    counts: Counter[str] = field(default_factory=Counter)
    contradicted: dict[tuple[str, str], str] = field(default_factory=dict)


def test_every_definition_converts_to_a_strict_schema_that_compiles() -> None:
    tally = Tally()
    unique: set[str] = set()
    for record in records():
        for function in record.functions:
            key = json.dumps(function, sort_keys=True)
            tally.counts["definitions"] += 1
            if key in unique:
                continue
            unique.add(key)
            schema = converted(key, record.language).input_schema
            compile_schema(schema)
            for node in objects(schema):
                if "properties" in node:
                    assert node["additionalProperties"] is False, (record.id, node)
                else:
                    tally.counts["open maps (dict without properties)"] += 1
    tally.counts["unique definitions"] = len(unique)
    print("\nBFCL definitions:", dict(tally.counts))
    assert tally.counts["unique definitions"] > 3000


def test_every_record_renders_for_openai_and_anthropic() -> None:
    counts: Counter[str] = Counter()
    for record in records():
        tool_set = list(definitions(record).values())
        for chat, responses, anthropic in zip(
            render_openai_chat_tools(tool_set),
            render_openai_responses_tools(tool_set),
            render_anthropic_tools(tool_set),
            strict=True,
        ):
            assert CHAT_TOOL.validate_python(chat) == chat
            assert RESPONSES_TOOL.validate_python(responses) == responses
            assert ANTHROPIC_TOOL.validate_python(anthropic) == anthropic
            function = chat["function"]
            counts["strict" if function["strict"] else "non-strict (open map or any value)"] += 1
            if function["strict"]:
                validator(json.dumps(function["parameters"]))  # compiles
                for node in objects(function["parameters"]):
                    assert node["required"] == list(node["properties"])
    print("\nOpenAI renderings:", dict(counts))
    assert counts["strict"] > 0.9 * sum(counts.values())


def strict_spelling(schema: Any, value: Any) -> Any:
    """``value`` as strict mode spells it: every optional property present, null if left out."""
    if not isinstance(schema, dict):
        return value
    for branch in schema.get("anyOf", ()):
        if branch.get("type") == ("object" if isinstance(value, dict) else "array"):
            return strict_spelling(branch, value)
    if isinstance(value, dict) and "properties" in schema:
        return {
            key: strict_spelling(sub, value[key]) if key in value else None
            for key, sub in schema["properties"].items()
        } | {k: v for k, v in value.items() if k not in schema["properties"]}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [strict_spelling(schema["items"], v) for v in value]
    return value


def test_every_ground_truth_call_validates_except_the_documented_contradictions() -> None:
    tally = Tally()
    for record in records():
        if record.ground_truth is None:
            continue
        tool_set = definitions(record)
        strict = {
            NameMap.build(tool_set.values()).tool_name(t["function"]["name"]): t["function"]
            for t in render_openai_chat_tools(list(tool_set.values()))
        }
        for call in record.ground_truth:
            for name, allowed in call.items():
                tally.counts["ground-truth calls"] += 1
                definition = tool_set[name]
                arguments = convert_arguments(allowed, definition.input_schema)
                schema_json = json.dumps(definition.input_schema)
                if not validator(schema_json).is_valid(arguments):
                    tally.contradicted[(record.id, name)] = "invalid"
                    continue
                rendered = strict[definition.name]
                if rendered["strict"]:
                    spelled = strict_spelling(definition.input_schema, arguments)
                    assert validator(json.dumps(rendered["parameters"])).is_valid(spelled)
                    assert strip_strict_nulls(definition.input_schema, spelled) == arguments
                    tally.counts["validated in strict spelling too"] += 1
                tally.counts["valid"] += 1
    tally.counts["contradicted (documented)"] = len(tally.contradicted)
    print("\nBFCL ground truth:", dict(tally.counts))
    assert set(tally.contradicted) == set(CONTRADICTED_GROUND_TRUTH)

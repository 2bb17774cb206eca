"""What the providers refuse outright, kept out of the requests toolkernel renders.

Each case here is a request OpenAI or Anthropic answers with a 400 for the whole turn
(a top-level ``anyOf``, a ``$ref`` beside other keywords in strict mode, a description
over 1,024 characters, too many enum values), or a call answered wrongly (strict-mode
nulls kept in large arguments, a result under an id the model never sent). Responses
are built with the official SDKs' own types.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import annotated_types as at
import anyio
import pytest

from sdk_responses import anthropic, chat, responses
from toolkernel.codes import Status
from toolkernel.definition import ToolDefinition
from toolkernel.errors import UsageError
from toolkernel.functions import tool
from toolkernel.kernel import Kernel
from toolkernel.loop import AgentLoop
from toolkernel.mcp import ServerConfig
from toolkernel.mcp.bridge import admit_tool
from toolkernel.providers import (
    NameMap,
    StrictSchemaError,
    openai_strict_schema,
    parse_anthropic,
    parse_openai_chat,
    parse_openai_responses,
    render_anthropic_results,
    render_anthropic_tools,
    render_openai_chat_results,
    render_openai_chat_tools,
    render_openai_responses_results,
    render_openai_responses_tools,
    strip_strict_nulls,
)
from toolkernel.run import ToolCall
from toolkernel.schema import compile_schema
from toolkernel.testing import make_kernel

EDITING = """
[run]
state = "EDITING"
profile = "developer"

[policy]
write_scope = ["src/**"]

[[exposure]]
tools = ["*"]
"""

COMBINATORS = ("anyOf", "oneOf", "allOf", "enum", "not")

# The limits as the APIs state them, written out rather than imported: a constant that
# drifted from them fails here.
MAX_DESCRIPTION_CHARS = 1024  # Chat Completions: function.description
MAX_ENUM_VALUES = 1000  # strict mode: enum values in one schema
LARGE_ENUM_VALUES = 250  # strict mode: a string enum with more values than this …
MAX_LARGE_ENUM_CHARS = 15_000  # … holds at most this many characters
MAX_SCHEMA_CHARS = 120_000  # strict mode: names, enum and const values in all

UPDATE_ISSUE: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string"},
        "title": {"type": "string"},
        "body": {"type": "string"},
    },
    "required": ["id"],
    "anyOf": [{"required": ["title"]}, {"required": ["body"]}],
}


def definition(input_schema: dict[str, Any], description: str = "Update an issue.") -> Any:
    return ToolDefinition.from_dict(
        {
            "name": "issues.update",
            "version": "1",
            "description": description,
            "inputSchema": input_schema,
            "executionMode": "EXTERNAL_API",
        }
    )


def sent_schemas(d: ToolDefinition) -> dict[str, tuple[dict[str, Any], str, bool | None]]:
    """Per API: the input schema sent, the description sent, and ``strict``."""
    chat = render_openai_chat_tools([d])[0]["function"]
    responses = render_openai_responses_tools([d])[0]
    anthropic = render_anthropic_tools([d])[0]
    return {
        "openai-chat": (chat["parameters"], chat["description"], chat["strict"]),
        "openai-responses": (
            responses["parameters"],
            responses["description"],
            responses["strict"],
        ),
        "anthropic": (anthropic["input_schema"], anthropic["description"], None),
    }


# -- a combinator at the top level ------------------------------------------------------


def test_a_top_level_any_of_is_sent_as_a_plain_object_with_the_choice_in_words() -> None:
    for api, (schema, description, strict) in sent_schemas(definition(UPDATE_ISSUE)).items():
        assert schema["type"] == "object", api
        assert not set(COMBINATORS) & schema.keys(), api
        assert schema["properties"] == UPDATE_ISSUE["properties"], api
        assert schema["required"] == ["id"], api
        assert description == (
            "Update an issue. The arguments must include at least one of: title; body."
        ), api
        assert strict in (None, False), api


def test_a_plain_top_level_schema_is_never_stricter_than_the_real_one() -> None:
    real = compile_schema(UPDATE_ISSUE)
    plain = compile_schema(render_anthropic_tools([definition(UPDATE_ISSUE)])[0]["input_schema"])
    instances: list[dict[str, Any]] = [
        {"id": "1", "title": "t"},
        {"id": "1", "body": "b"},
        {"id": "1", "title": "t", "body": "b"},
        {"id": "1"},  # only the real schema refuses it: the kernel says why
        {"title": "t"},
    ]
    for instance in instances:
        if real.is_valid(instance):
            assert plain.is_valid(instance), instance
    assert not real.is_valid({"id": "1"})
    assert plain.is_valid({"id": "1"})


def test_what_every_branch_requires_stays_required_in_the_plain_schema() -> None:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"id": {"type": "string"}, "a": {"type": "string"}, "b": {"type": "string"}},
        "allOf": [{"required": ["a"]}],
        "oneOf": [{"required": ["id", "a"]}, {"required": ["id", "b"]}],
    }
    plain, description, strict = sent_schemas(definition(schema))["openai-chat"]
    assert plain["required"] == ["a", "id"]
    assert not set(COMBINATORS) & plain.keys()
    assert strict is False
    assert description.endswith("exactly one of: id and a; id and b.")


def test_a_bridged_mcp_tool_with_a_top_level_any_of_is_offered_as_a_plain_object() -> None:
    listed = {
        "name": "update_issue",
        "description": "Update fields of an issue.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "identifier": {"type": "string"},
                "title": {"type": "string"},
                "priority": {"type": "string"},
            },
            "required": ["identifier"],
            "anyOf": [{"required": ["title"]}, {"required": ["priority"]}],
        },
    }
    admitted = admit_tool(ServerConfig(name="huly", command=("x",)), listed)
    assert admitted.definition is not None
    for api, (schema, _, _) in sent_schemas(admitted.definition).items():
        assert not set(COMBINATORS) & schema.keys(), api
        assert schema["required"] == ["identifier"], api


def test_the_kernel_still_holds_calls_to_the_dropped_any_of(kernel: Kernel) -> None:
    kernel.register(
        {
            "name": "issues.update",
            "version": "1",
            "description": "Update an issue.",
            "executionMode": "NATIVE",
            "inputSchema": UPDATE_ISSUE,
        },
        handler=lambda **arguments: sorted(arguments),
    )
    loop = AgentLoop(kernel, kernel.start_run(), "anthropic")
    (shown,) = [t for t in loop.tools() if t["name"] == "issues__update"]
    assert "anyOf" not in shown["input_schema"]
    message = anthropic(
        ("t1", "issues__update", {"id": "1"}), ("t2", "issues__update", {"id": "1", "body": "b"})
    )
    refused, done = anyio.run(loop.execute, message)
    assert refused.status is Status.INVALID_ARGUMENTS
    assert done.status is Status.SUCCEEDED
    assert done.structured_output == ["body", "id"]


# -- $ref beside other keywords in strict mode -------------------------------------------


def refs_with_siblings(node: Any) -> list[Any]:
    if isinstance(node, dict):
        found = [node] if "$ref" in node and len(node) > 1 else []
        return found + [f for value in node.values() for f in refs_with_siblings(value)]
    if isinstance(node, list):
        return [f for value in node for f in refs_with_siblings(value)]
    return []


FASTMCP_SEARCH: dict[str, Any] = {
    "$defs": {
        "Options": {
            "properties": {"limit": {"type": "integer", "title": "Limit"}},
            "required": ["limit"],
            "title": "Options",
            "type": "object",
        }
    },
    "properties": {
        "query": {"type": "string", "title": "Query"},
        "opts": {"$ref": "#/$defs/Options", "description": "Search options."},
    },
    "required": ["query", "opts"],
    "title": "searchArguments",
    "type": "object",
    "additionalProperties": False,
}


def test_a_ref_with_a_description_is_expanded_with_it_for_strict_mode() -> None:
    strict = openai_strict_schema(FASTMCP_SEARCH)
    assert refs_with_siblings(strict) == []
    opts = strict["properties"]["opts"]
    assert opts["description"] == "Search options."
    assert opts["properties"] == {"limit": {"type": "integer", "title": "Limit"}}
    assert opts["required"] == ["limit"]
    assert render_openai_chat_tools([definition(FASTMCP_SEARCH)])[0]["function"]["strict"] is True


SIBLINGS: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["opts"],
    "properties": {
        "opts": {
            "$ref": "#/$defs/Base",
            "properties": {"mode": {"enum": ["fast", "safe"]}, "note": {"type": "string"}},
            "required": ["mode"],
            "unevaluatedProperties": False,
        }
    },
    "$defs": {
        "Base": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    },
}


def test_a_ref_whose_siblings_add_requirements_is_strict_about_both() -> None:
    strict = openai_strict_schema(SIBLINGS)
    assert refs_with_siblings(strict) == []
    opts = strict["properties"]["opts"]
    assert set(opts["properties"]) == {"name", "mode", "note"}
    real, decoded = compile_schema(SIBLINGS), compile_schema(strict)
    wanted = {"opts": {"name": "n", "mode": "fast", "note": None}}
    assert decoded.is_valid(wanted)
    assert not decoded.is_valid({"opts": {"name": "n", "note": None}})  # mode is required
    # what strict decoding sends is what the real schema takes once "left out" is undone
    assert strip_strict_nulls(SIBLINGS, wanted) == {"opts": {"name": "n", "mode": "fast"}}
    assert real.is_valid(strip_strict_nulls(SIBLINGS, wanted))


def test_a_ref_whose_siblings_contradict_its_target_is_not_strict() -> None:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["n"],
        "properties": {"n": {"$ref": "#/$defs/Small", "maximum": 5}},
        "$defs": {"Small": {"type": "integer", "maximum": 10}},
    }
    with pytest.raises(StrictSchemaError) as caught:
        openai_strict_schema(schema)
    assert caught.value.pointer == "/properties/n"
    fn = render_openai_chat_tools([definition(schema)])[0]["function"]
    assert fn["strict"] is False
    assert fn["parameters"]["properties"]["n"] == {"$ref": "#/$defs/Small", "maximum": 5}


def test_a_described_ref_that_loops_keeps_its_inner_reference_bare() -> None:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["root"],
        "properties": {"root": {"$ref": "#/$defs/Node", "description": "The tree."}},
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"child": {"$ref": "#/$defs/Node", "description": "A subtree."}},
            }
        },
    }
    strict = openai_strict_schema(schema)
    assert refs_with_siblings(strict) == []
    root = strict["properties"]["root"]
    assert root["description"] == "The tree."
    assert root["properties"]["child"] == {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}


def test_refs_beside_other_keywords_that_fan_out_are_refused_not_expanded_forever() -> None:
    levels = 40
    defs: dict[str, Any] = {
        f"D{i}": {
            "anyOf": [
                {"$ref": f"#/$defs/D{i + 1}", "description": "left"},
                {"$ref": f"#/$defs/D{i + 1}", "description": "right"},
            ]
        }
        for i in range(levels)
    }
    defs[f"D{levels}"] = {"type": "string"}
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["x"],
        "properties": {"x": {"$ref": "#/$defs/D0", "description": "x"}},
        "$defs": defs,
    }
    with pytest.raises(StrictSchemaError, match="references beside other keywords"):
        openai_strict_schema(schema)  # 2**40 copies of D40 otherwise


# -- descriptions ---------------------------------------------------------------------------

LONG = ("Search the issue tracker for matching tickets. " * 40).strip()


def test_descriptions_over_the_limit_are_cut_at_a_word_for_both_openai_apis() -> None:
    d = definition({"type": "object", "additionalProperties": False}, LONG)
    chat = render_openai_chat_tools([d])[0]["function"]["description"]
    responses = render_openai_responses_tools([d])[0]["description"]
    for sent in (chat, responses):
        assert len(sent) <= MAX_DESCRIPTION_CHARS
        assert sent.endswith("…")
        kept = sent.removesuffix("…")
        assert LONG.startswith(kept)
        assert LONG[len(kept)] == " "  # the cut falls between words
        assert len(kept) > MAX_DESCRIPTION_CHARS - 60
    assert render_anthropic_tools([d])[0]["description"] == LONG


def test_a_description_under_the_limit_is_sent_as_it_is() -> None:
    text = "x" * MAX_DESCRIPTION_CHARS
    d = definition({"type": "object", "additionalProperties": False}, text)
    assert render_openai_chat_tools([d])[0]["function"]["description"] == text


def test_the_any_of_note_survives_the_cut() -> None:
    fn = render_openai_chat_tools([definition(UPDATE_ISSUE, LONG)])[0]["function"]
    assert len(fn["description"]) <= MAX_DESCRIPTION_CHARS
    assert fn["description"].endswith("… The arguments must include at least one of: title; body.")


# -- strict-mode nulls in large arguments ---------------------------------------------------

BIG = 1_048_576


@tool("doc.store", timeout_ms=5_000)
def store(
    name: str,
    content: Annotated[str, at.MaxLen(900_000)],
    mode: Literal["replace", "append"] = "replace",
) -> dict[str, Any]:
    """Store a document."""
    return {"stored": len(content), "mode": mode}


def stored(size: int) -> str:
    return json.dumps({"name": "a", "content": "x" * size, "mode": None})


@pytest.mark.parametrize("provider", ["openai-chat", "openai-responses"])
def test_strict_nulls_are_dropped_up_to_the_kernels_argument_cap(
    tmp_path: Path, provider: Literal["openai-chat", "openai-responses"]
) -> None:
    with make_kernel(tmp_path / "ws", f"max_argument_bytes = {BIG}\n" + EDITING) as kernel:
        kernel.register(store)
        loop = AgentLoop(kernel, kernel.start_run(), provider)
        loop.tools()
        args = stored(300_000)
        assert len(args) > 256 * 1024
        response = (
            chat(("c1", "doc__store", args))
            if provider == "openai-chat"
            else (responses(("c1", "doc__store", args)))
        )
        (result,) = anyio.run(loop.execute, response)
        assert result.status is Status.SUCCEEDED, result.safe_message
        assert result.structured_output == {"stored": 300_000, "mode": "replace"}


def test_the_free_parsers_read_arguments_within_the_cap_they_are_given() -> None:
    d = definition(
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {"content": {"type": "string"}, "mode": {"enum": ["a", "b"]}},
            "required": ["content"],
        }
    )
    names = NameMap.build([d])
    args = json.dumps({"content": "x" * 300_000, "mode": None})
    for parse, response in (
        (parse_openai_chat, chat(("c1", "issues__update", args))),
        (parse_openai_responses, responses(("c1", "issues__update", args))),
    ):
        (call,) = parse(response, names, max_argument_bytes=BIG)
        assert call.arguments == {"content": "x" * 300_000}
        (untouched,) = parse(response, names)  # the default cap: left to the kernel
        assert untouched.arguments == args


# -- enum limits ------------------------------------------------------------------------


def enum_schema(**enums: list[Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {name: {"enum": values} for name, values in enums.items()},
        "required": list(enums),
    }


def test_more_enum_values_than_openai_allows_make_the_tool_non_strict() -> None:
    half = [f"zone/{i}" for i in range(MAX_ENUM_VALUES // 2 + 1)]
    schema = enum_schema(source=half, target=half)
    with pytest.raises(StrictSchemaError, match="enum values"):
        openai_strict_schema(schema)
    assert render_openai_chat_tools([definition(schema)])[0]["function"]["strict"] is False
    assert openai_strict_schema(enum_schema(source=half[:-1], target=half[:-1]))


def test_a_large_string_enum_over_the_character_limit_makes_the_tool_non_strict() -> None:
    width = MAX_LARGE_ENUM_CHARS // (LARGE_ENUM_VALUES + 1) + 1
    large = [f"{i:0{width}d}" for i in range(LARGE_ENUM_VALUES + 1)]
    assert sum(map(len, large)) > MAX_LARGE_ENUM_CHARS
    with pytest.raises(StrictSchemaError, match="characters"):
        openai_strict_schema(enum_schema(v=large))
    # as many characters in no more than 250 values are within the limits
    assert openai_strict_schema(enum_schema(v=[v * 2 for v in large[:LARGE_ENUM_VALUES]]))


def test_names_and_enum_values_over_the_schema_character_limit_are_not_strict() -> None:
    values = 200
    width = MAX_SCHEMA_CHARS // (4 * values) + 1
    enums = {f"e{n}": [f"{n}{i:0{width}d}" for i in range(values)] for n in range(4)}
    with pytest.raises(StrictSchemaError, match="characters"):
        openai_strict_schema(enum_schema(**enums))


ZONE = Literal[tuple(f"Area/City_{i}" for i in range(600))]  # type: ignore[valid-type]


@tool("clock.convert", timeout_ms=2_000)
def convert(time: str, from_zone: ZONE, to_zone: ZONE) -> dict[str, str]:  # type: ignore[valid-type]
    """Convert a wall-clock time between two time zones."""
    return {}


def test_a_function_tool_with_two_large_literals_goes_non_strict(kernel: Kernel) -> None:
    kernel.register(convert)
    d = next(r for r in kernel.registry.latest() if r.name == "clock.convert").definition
    assert render_openai_chat_tools([d])[0]["function"]["strict"] is False


# -- results answer the ids the model sent --------------------------------------------------


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "stats.py").write_text("def mean(v):\n    return sum(v) / len(v)\n")
    with make_kernel(root, EDITING) as kernel:
        yield kernel


def test_the_low_level_path_answers_calls_sent_without_an_id_under_an_empty_id(
    kernel: Kernel,
) -> None:
    run = kernel.start_run()
    names = NameMap.build(kernel.expose(run))
    sent = (
        ("", "repo__search", '{"query": "mean"}'),
        ("", "file__read", '{"path": "src/stats.py"}'),
    )
    inputs = [(i, n, json.loads(a)) for i, n, a in sent]
    turns = [
        (parse_openai_chat(chat(*sent), names), render_openai_chat_results, "tool_call_id"),
        (
            parse_openai_responses(responses(*sent), names),
            render_openai_responses_results,
            "call_id",
        ),
    ]
    for calls, render, key in turns:
        results = anyio.run(kernel.call_many, run, calls)
        assert all(r.tool_call_id for r in results)  # the kernel's own, made-up ids
        assert [m[key] for m in render(results, calls=calls)] == ["", ""]
    calls = parse_anthropic(anthropic(*inputs), names)
    results = anyio.run(kernel.call_many, run, calls)
    blocks = render_anthropic_results(results, calls=calls)["content"]
    assert [b["tool_use_id"] for b in blocks] == ["", ""]
    assert [b["is_error"] for b in blocks] == [False, False]


def test_results_rendered_with_calls_of_another_turn_are_refused() -> None:
    call = ToolCall("repo.search", "{}", tool_call_id="a")
    with pytest.raises(UsageError):
        render_openai_chat_results([], calls=[call])


def test_the_agent_loop_still_answers_the_ids_it_was_sent(kernel: Kernel) -> None:
    loop = AgentLoop(kernel, kernel.start_run(), "openai-chat")
    loop.tools()
    messages = loop.handle_sync(chat(("", "repo__search", '{"query": "mean"}')))
    assert [m["tool_call_id"] for m in messages] == [""]
    assert json.loads(messages[0]["content"])["status"] == Status.SUCCEEDED.value


# -- responses, built with the SDKs' own types ---------------------------------------------

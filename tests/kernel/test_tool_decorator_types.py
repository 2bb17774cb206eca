"""``@tool``: the derived schema and what the function accepts agree, or decoration fails.

Each test pins a case where the schema once said one thing and the function did another
(a bound left on the wrong keyword, a default the kernel cannot hash, a value the schema
admits and the conversion cannot build), or where decoration failed without saying why.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any, NotRequired, TypedDict

import pydantic
import pytest
from annotated_types import Ge, Gt, MaxLen
from pydantic import Field, StringConstraints, conint, constr

from toolkernel.codes import ErrorCode, Status
from toolkernel.context import ToolContext
from toolkernel.errors import DefinitionError
from toolkernel.functions import FunctionTool, Pattern, tool

_NO_DEFAULT = object()


def _probe(annotation: Any, default: Any = _NO_DEFAULT, *, name: str = "types.probe") -> Any:
    """A tool of one parameter ``x`` of type ``annotation``, returning what it got."""

    def probe(x):  # type: ignore[no-untyped-def]
        """Probe."""
        return repr(x)

    probe.__annotations__ = {"x": annotation, "return": str}
    if default is not _NO_DEFAULT:
        probe.__defaults__ = (default,)
    return tool(name)(probe)


def _refusal(annotation: Any, default: Any = _NO_DEFAULT) -> DefinitionError:
    with pytest.raises(DefinitionError) as info:
        _probe(annotation, default)
    return info.value


def _call(kernel: Any, function: FunctionTool, arguments: dict[str, Any]) -> Any:
    if kernel.registry.find(function.definition.name) is None:
        kernel.register(function)
    return kernel.call_sync(kernel.start_run(), function.definition.name, arguments)


# Defaults


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_non_finite_float_default_is_refused_naming_the_parameter(value: float):
    refusal = _refusal(float, value)
    assert refusal.field == "inputSchema.properties.x.default"
    assert "finite number" in refusal.problem


@dataclasses.dataclass(frozen=True)
class Window:
    start: int = 0
    size: int = 10


@pytest.mark.parametrize(
    ("annotation", "default", "advertised"),
    [
        (dict[str, Any], {}, {}),
        (dict[str, int], {"b": 2, "a": 1}, {"b": 2, "a": 1}),
        (frozenset[str], frozenset(), []),
        (frozenset[str], frozenset({"b", "c", "a"}), ["a", "b", "c"]),
        (set[int], {3, 1, 2}, [1, 2, 3]),
        (Window, Window(), {"start": 0, "size": 10}),
        (list[Window], [Window(size=1)], [{"start": 0, "size": 1}]),
    ],
)
def test_a_json_representable_default_of_a_supported_type_is_advertised(
    annotation: Any, default: Any, advertised: Any
):
    schema = _probe(annotation, default).definition.input_schema
    assert schema["properties"]["x"]["default"] == advertised
    assert "required" not in schema


@pytest.mark.parametrize(
    ("annotation", "default"),
    [(int, "a"), (Annotated[int, Ge(1)], 0), (Annotated[str, MaxLen(2)], "abc")],
)
def test_a_default_the_schema_refuses_is_a_definition_error(annotation: Any, default: Any):
    refusal = _refusal(annotation, default)
    assert refusal.field == "inputSchema.properties.x.default"
    assert "does not fit" in refusal.problem


received: list[Any] = []


def mutate(items: list[int] = []) -> int:  # noqa: B006
    """Change what it is given, as a tool should be free to."""
    items.append(1)
    received.append(items)
    return len(items)


def test_a_mutable_default_is_a_fresh_copy_for_each_call(kernel_factory):
    mutating = tool("types.mutate")(mutate)
    kernel = kernel_factory()
    first, second = _call(kernel, mutating, {}), _call(kernel, mutating, {})
    assert (first.status, second.status) == (Status.SUCCEEDED, Status.SUCCEEDED)
    assert second.structured_output == 1
    assert received[-1] == [1]
    assert mutate.__defaults__ == ([],)


def field_default(
    m: int = Field(ge=0),
    n: int = Field(default=5, ge=1, le=10, description="How many."),
) -> list[int]:
    """Take pydantic-style parameters."""
    return [m, n]


def test_a_pydantic_field_default_gives_the_parameter_its_bounds_and_default(kernel_factory):
    fielded = tool("types.field_default")(field_default)
    schema = fielded.definition.input_schema
    assert schema["required"] == ["m"]
    assert schema["properties"]["m"] == {"type": "integer", "minimum": 0}
    assert schema["properties"]["n"] == {
        "type": "integer",
        "description": "How many.",
        "minimum": 1,
        "maximum": 10,
        "default": 5,
    }
    kernel = kernel_factory()
    assert _call(kernel, fielded, {"m": 2}).structured_output == [2, 5]
    refused = _call(kernel, fielded, {"m": 2, "n": 11})
    assert (refused.status, refused.error_code) == (
        Status.INVALID_ARGUMENTS,
        ErrorCode.OUT_OF_BOUNDS,
    )


# Bounds on the branch they fit


@pytest.mark.parametrize(
    ("annotation", "schema"),
    [
        (
            Annotated[list[str] | None, MaxLen(2)],
            {
                "anyOf": [
                    {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                    {"type": "null"},
                ]
            },
        ),
        (
            Annotated[list[int] | None, Field(max_length=2)],
            {
                "anyOf": [
                    {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
                    {"type": "null"},
                ]
            },
        ),
        (
            Annotated[dict[str, int], MaxLen(2)],
            {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 2},
        ),
        (
            Annotated[str | list[str], MaxLen(3)],
            {
                "anyOf": [
                    {"type": "string", "maxLength": 3},
                    {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                ]
            },
        ),
        (Annotated[Annotated[str, MaxLen(5)], MaxLen(9)], {"type": "string", "maxLength": 5}),
    ],
)
def test_a_length_bound_takes_the_keyword_of_each_branch_it_bounds(annotation: Any, schema: Any):
    assert _probe(annotation).definition.input_schema["properties"]["x"] == schema


@pytest.mark.parametrize(
    ("annotation", "arguments"),
    [
        (Annotated[list[str] | None, MaxLen(2)], {"x": list("abcde")}),
        (Annotated[dict[str, int], MaxLen(2)], {"x": dict.fromkeys("abcde", 1)}),
    ],
)
def test_a_value_over_its_length_bound_is_refused_before_the_tool_runs(
    kernel_factory, annotation: Any, arguments: dict[str, Any]
):
    result = _call(kernel_factory(), _probe(annotation), arguments)
    assert result.status is Status.INVALID_ARGUMENTS


@pytest.mark.parametrize(
    "annotation",
    [
        Annotated[str, Ge(3)],
        Annotated[str, Gt(3)],
        Annotated[int, MaxLen(2)],
        Annotated[int | str, MaxLen(2)],
        Annotated[list[str] | None, Pattern("^a")],
        Annotated[Any, MaxLen(2)],
    ],
)
def test_a_bound_that_fits_no_branch_of_the_type_is_a_definition_error(annotation: Any):
    refusal = _refusal(annotation)
    assert refusal.field == "inputSchema.properties.x"
    assert "applies to" in refusal.problem


@pytest.mark.parametrize(
    ("annotation", "schema"),
    [
        (conint(ge=1, le=100), {"type": "integer", "minimum": 1, "maximum": 100}),
        (conint(gt=0, strict=True), {"type": "integer", "exclusiveMinimum": 0}),
        (constr(max_length=3), {"type": "string", "maxLength": 3}),
        (
            constr(pattern="^[a-z]+$", max_length=20),
            {"type": "string", "pattern": "^[a-z]+$", "maxLength": 20},
        ),
        (
            Annotated[str, StringConstraints(pattern="^[a-z]+$")],
            {"type": "string", "pattern": "^[a-z]+$"},
        ),
    ],
)
def test_pydantic_constrained_types_become_schema_bounds(annotation: Any, schema: Any):
    assert _probe(annotation).definition.input_schema["properties"]["x"] == schema


# Types the schema and the conversion must agree on


@dataclasses.dataclass
class Node:
    name: str
    children: list[Node] = dataclasses.field(default_factory=list)


class Tree(TypedDict):
    name: str
    kids: NotRequired[list[Tree]]


@pytest.mark.parametrize(
    ("annotation", "field"),
    [
        (Node, "inputSchema.properties.x.children.items"),
        (Tree, "inputSchema.properties.x.kids.items"),
        (list[Node] | None, "inputSchema.properties.x.items.children.items"),
    ],
)
def test_a_recursive_record_is_refused_where_it_recurs(annotation: Any, field: str):
    refusal = _refusal(annotation)
    assert refusal.field == field
    assert "recursive types are not supported" in refusal.problem


class Pair(enum.Enum):
    A = (1, 2)
    B = (3, 4)


@tool("types.pairs")
def pairs(pair: Pair, grid: set[Pair], nested: list[Pair] | None = None) -> list[str]:
    """Pick pairs."""
    return [pair.name, *sorted(p.name for p in grid), *(p.name for p in nested or ())]


def test_a_tuple_valued_enum_is_an_array_in_the_schema_and_a_member_in_the_function(
    kernel_factory,
):
    assert pairs.definition.input_schema["properties"]["pair"] == {"enum": [[1, 2], [3, 4]]}
    result = _call(kernel_factory(), pairs, {"pair": [1, 2], "grid": [[3, 4]], "nested": [[3, 4]]})
    assert result.status is Status.SUCCEEDED, result.safe_message
    assert result.structured_output == ["A", "B", "B"]


class Listed(enum.Enum):
    A = [1]  # noqa: RUF012  # the value under test


class Unencodable(enum.Enum):
    A = object()


@pytest.mark.parametrize("annotation", [Listed, Unencodable, list[Listed]])
def test_an_enum_whose_values_are_not_json_scalars_or_tuples_is_refused(annotation: Any):
    refusal = _refusal(annotation)
    assert refusal.field.startswith("inputSchema.properties.x")
    assert "JSON scalar" in refusal.problem


@pytest.mark.parametrize(
    ("annotation", "unhashable"),
    [
        (set[Any], "Any"),
        (set[int | list[int]], "list[int]"),
        (frozenset[tuple[int, list[int]]], "list[int]"),
    ],
)
def test_set_items_that_admit_unhashable_values_are_refused(annotation: Any, unhashable: str):
    refusal = _refusal(annotation)
    assert refusal.field == "inputSchema.properties.x.items"
    assert refusal.problem == f"set items must be hashable; {unhashable} is not"


@pydantic.dataclasses.dataclass
class Page:
    size: int = Field(ge=1, le=100)
    label: str = "all"
    step: int = Field(default=1, ge=1)


@tool("types.page")
def page(p: Page) -> list[Any]:
    """Read a page."""
    return [p.size, p.label, p.step]


@pytest.mark.parametrize(
    ("arguments", "code"),
    [({"p": {}}, ErrorCode.MISSING_PROPERTY), ({"p": {"size": 0}}, ErrorCode.OUT_OF_BOUNDS)],
)
def test_a_pydantic_dataclass_field_default_is_the_fields_constraints(
    kernel_factory, arguments: dict[str, Any], code: ErrorCode
):
    schema = page.definition.input_schema["properties"]["p"]
    assert schema["required"] == ["size"]
    assert schema["properties"]["size"] == {"type": "integer", "minimum": 1, "maximum": 100}
    assert schema["properties"]["step"] == {"type": "integer", "minimum": 1}
    kernel = kernel_factory()
    refused = _call(kernel, page, arguments)
    assert (refused.status, refused.error_code) == (Status.INVALID_ARGUMENTS, code)
    assert _call(kernel, page, {"p": {"size": 5}}).structured_output == [5, "all", 1]


# Callables and the context parameter


def search(client: object, query: str, limit: int = 10) -> list[Any]:
    """Search with a client.

    Args:
        query: what to find.
        limit: how many.
    """
    return [type(client).__name__, query, limit]


def test_a_partial_is_described_by_its_function_less_the_bound_arguments(kernel_factory):
    searcher = tool("types.partial")(functools.partial(search, object(), limit=3))
    schema = searcher.definition.input_schema
    assert schema == {
        "type": "object",
        "additionalProperties": False,
        "properties": {"query": {"description": "what to find.", "type": "string"}},
        "required": ["query"],
    }
    assert searcher.definition.description == "Search with a client."
    assert searcher.definition.safety.source.endswith(".search")
    result = _call(kernel_factory(), searcher, {"query": "q"})
    assert result.structured_output == ["object", "q", 3]


class Finder:
    """Find things."""

    async def __call__(self, query: str) -> str:
        return query.upper()


def test_a_callable_instance_is_a_tool_and_its_async_call_is_awaited(kernel_factory):
    finder = tool("types.finder")(Finder())
    assert finder.is_async
    assert finder.definition.description == "Find things."
    assert list(finder.definition.input_schema["properties"]) == ["query"]
    result = _call(kernel_factory(), finder, {"query": "q"})
    assert (result.status, result.structured_output) == (Status.SUCCEEDED, "Q")


def test_an_annotated_context_parameter_takes_the_context(kernel_factory):
    @tool("types.annotated_ctx")
    def annotated_ctx(ctx: Annotated[ToolContext, "from the runtime"], query: str) -> str:
        """Echo the call id."""
        return ctx.tool_call_id

    assert annotated_ctx.context_parameter == "ctx"
    assert list(annotated_ctx.definition.input_schema["properties"]) == ["query"]
    kernel = kernel_factory()
    kernel.register(annotated_ctx)
    result = kernel.call_sync(
        kernel.start_run(), "types.annotated_ctx", {"query": "q"}, tool_call_id="c9"
    )
    assert result.structured_output == "c9"


@pytest.mark.parametrize(
    ("annotation", "field"),
    [
        (ToolContext | int, "inputSchema.properties.x"),
        (list[ToolContext], "inputSchema.properties.x.items"),
    ],
)
def test_a_context_inside_another_type_is_refused_saying_so(annotation: Any, field: str):
    refusal = _refusal(annotation)
    assert refusal.field == field
    assert "ToolContext" in refusal.problem


def numbers(n: int) -> Iterator[int]:
    """Yield numbers."""
    yield from range(n)


async def numbers_async(n: int) -> AsyncIterator[int]:
    """Yield numbers."""
    for i in range(n):
        yield i


@pytest.mark.parametrize("function", [numbers, numbers_async])
def test_a_generator_function_is_refused_at_decoration(function: Any):
    with pytest.raises(DefinitionError) as info:
        tool("types.generator")(function)
    assert info.value.field == "outputContract"
    assert "not a generator" in info.value.problem


def _logged(function: Any) -> Any:
    @functools.wraps(function)
    def log(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    return log


@tool("types.wrapped_async")
@_logged
async def doubled(n: int) -> int:
    """An async tool behind a plain (sync) decorator."""
    return n * 2


def test_an_async_function_behind_a_sync_decorator_is_awaited(kernel_factory):
    assert doubled.is_async
    result = _call(kernel_factory(), doubled, {"n": 3})
    assert (result.status, result.structured_output) == (Status.SUCCEEDED, 6)


def test_a_single_string_for_tags_is_refused():
    with pytest.raises(DefinitionError) as info:
        tool("types.tags", tags="search")
    assert info.value.field == "tags"
    assert "list of strings" in info.value.problem


def test_a_pydantic_transform_that_is_asked_for_is_still_refused():
    refusal = _refusal(Annotated[str, StringConstraints(pattern="^a", to_lower=True)])
    assert "to_lower" in refusal.problem

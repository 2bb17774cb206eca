"""``@tool`` functions receive their arguments as the annotated Python types."""

from __future__ import annotations

import dataclasses
import enum
from typing import Annotated, Any, Literal, NotRequired, Optional, TypedDict

import pytest
from annotated_types import Ge

from toolkernel.codes import ErrorCode, Status
from toolkernel.context import ToolContext
from toolkernel.errors import DefinitionError, ToolFailed
from toolkernel.functions import tool
from toolkernel.ledger import EventType

pytestmark = pytest.mark.anyio


class Mode(enum.Enum):
    FAST = "fast"
    SAFE = "safe"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass
class Window:
    start: int
    size: int = 10
    mode: Mode = Mode.FAST


@dataclasses.dataclass
class Scan:
    window: Window
    windows: list[Window] = dataclasses.field(default_factory=list)
    label: str | None = None


@dataclasses.dataclass(frozen=True)
class ByName:
    name: str


@dataclasses.dataclass(frozen=True)
class ById:
    id: int


class Options(TypedDict):
    mode: Mode
    note: NotRequired[str]


@dataclasses.dataclass
class Checked:
    size: int

    def __post_init__(self) -> None:
        if self.size > 100:
            raise ValueError("size is too large")


@dataclasses.dataclass
class Refused:
    size: int

    def __post_init__(self) -> None:
        raise ToolFailed("size refused by the tool", code=ErrorCode.TOOL_ERROR)


def _received(kernel: Any, function: Any, arguments: dict[str, Any]) -> Any:
    """Register ``function``, call it through the kernel, return what it received."""
    kernel.register(function)
    run = kernel.start_run()
    result = kernel.call_sync(run, function.definition.name, arguments)
    assert result.status is Status.SUCCEEDED, result.safe_message
    return seen.pop()


seen: list[Any] = []


def test_enum_and_dataclass_arguments_arrive_as_members_and_instances_with_defaults(
    kernel_factory,
):
    @tool("args.scan")
    def scan(mode: Mode, level: Level, window: Window) -> None:
        """Scan."""
        seen.append((mode, level, window))

    mode, level, window = _received(
        kernel_factory(), scan, {"mode": "safe", "level": 2, "window": {"start": 5}}
    )
    assert mode is Mode.SAFE
    assert level is Level.HIGH
    assert window == Window(start=5, size=10, mode=Mode.FAST)


def test_nested_dataclasses_lists_and_optionals_are_converted_recursively(kernel_factory):
    @tool("args.nested")
    def nested(scan: Scan, extra: list[Window] | None = None) -> None:
        """Nested."""
        seen.append((scan, extra))

    scan, extra = _received(
        kernel_factory(),
        nested,
        {
            "scan": {"window": {"start": 1, "mode": "safe"}, "windows": [{"start": 2}]},
            "extra": [{"start": 3, "size": 4}],
        },
    )
    assert scan == Scan(window=Window(1, mode=Mode.SAFE), windows=[Window(2)])
    assert extra == [Window(3, 4)]


def test_sets_frozensets_and_tuples_arrive_as_such(kernel_factory):
    @tool("args.collections")
    def collections(
        tags: set[str],
        frozen: frozenset[Mode],
        pair: tuple[int, Mode],
        many: tuple[str, ...],
        bare: tuple,  # type: ignore[type-arg]
    ) -> None:
        """Collections."""
        seen.append((tags, frozen, pair, many, bare))

    tags, frozen, pair, many, bare = _received(
        kernel_factory(),
        collections,
        {
            "tags": ["a", "b"],
            "frozen": ["fast"],
            "pair": [1, "safe"],
            "many": ["x", "y"],
            "bare": [1, "z"],
        },
    )
    assert type(tags) is set
    assert tags == {"a", "b"}
    assert type(frozen) is frozenset
    assert frozen == frozenset({Mode.FAST})
    assert pair == (1, Mode.SAFE)
    assert many == ("x", "y")
    assert bare == (1, "z")


def test_optional_dataclass_left_out_or_null_stays_none(kernel_factory):
    @tool("args.optional")
    def optional(window: Window | None = None, mode: Mode | None = None) -> None:
        """Optional."""
        seen.append((window, mode))

    kernel = kernel_factory()
    assert _received(kernel, optional, {}) == (None, None)
    run = kernel.start_run()
    result = kernel.call_sync(run, "args.optional", {"window": None, "mode": None})
    assert result.status is Status.SUCCEEDED
    assert seen.pop() == (None, None)


def test_a_union_of_records_converts_with_the_option_the_value_fits(kernel_factory):
    @tool("args.union")
    def union(who: ByName | ById, whom: list[ByName | ById]) -> None:
        """Union."""
        seen.append((who, whom))

    who, whom = _received(
        kernel_factory(), union, {"who": {"id": 7}, "whom": [{"name": "a"}, {"id": 1}]}
    )
    assert who == ById(7)
    assert whom == [ByName("a"), ById(1)]


def test_typed_dicts_stay_dicts_with_their_values_converted(kernel_factory):
    @tool("args.typed_dict")
    def typed_dict(options: Options, by_key: dict[str, Mode]) -> None:
        """TypedDict."""
        seen.append((options, by_key))

    options, by_key = _received(
        kernel_factory(),
        typed_dict,
        {"options": {"mode": "safe", "note": "n"}, "by_key": {"a": "fast"}},
    )
    assert type(options) is dict
    assert options == {"mode": Mode.SAFE, "note": "n"}
    assert by_key == {"a": Mode.FAST}


def test_literal_enum_members_and_nested_whole_numbers_are_converted(kernel_factory):
    @tool("args.literal")
    def literal(mode: Literal[Mode.FAST], window: Window, counts: list[int]) -> None:
        """Literal."""
        seen.append((mode, window, counts))

    mode, window, counts = _received(
        kernel_factory(),
        literal,
        {"mode": "fast", "window": {"start": 2.0, "size": 3}, "counts": [1.0, 2]},
    )
    assert mode is Mode.FAST
    assert type(window.start) is int
    assert counts == [1, 2]
    assert all(type(c) is int for c in counts)


def test_an_integral_float_for_an_int_literal_arrives_as_the_int(kernel_factory):
    @tool("args.pick")
    def pick(n: Literal[1, 2, 3], names: list[Literal["a", 2]], flag: Literal[True, 1]) -> None:
        """Pick."""
        seen.append((n, names, flag))

    n, names, flag = _received(
        kernel_factory(), pick, {"n": 3.0, "names": ["a", 2.0], "flag": True}
    )
    assert (n, type(n)) == (3, int)
    assert names == ["a", 2]
    assert type(names[1]) is int
    assert flag is True  # a bool stays a bool, though True == 1


@pytest.mark.parametrize("annotation", ["ToolContext | None", "Optional[ToolContext]"])
def test_an_optional_context_parameter_takes_the_context(kernel_factory, annotation):
    namespace = {"ToolContext": ToolContext, "Optional": Optional}
    source = (
        f"def count(x: int, ctx: {annotation} = None) -> str:\n"
        "    return ctx.tool_call_id if ctx else 'no context'\n"
    )
    exec(source, namespace)  # the annotation under test, spelled both ways
    counted = tool("args.ctx", description="Count.")(namespace["count"])
    assert counted.context_parameter == "ctx"
    assert list(counted.definition.input_schema["properties"]) == ["x"]
    kernel = kernel_factory()
    kernel.register(counted)
    result = kernel.call_sync(kernel.start_run(), "args.ctx", {"x": 1}, tool_call_id="c7")
    assert result.structured_output == "c7"


def test_a_second_context_parameter_is_refused_at_decoration():
    def two(ctx: ToolContext, other: ToolContext) -> None:
        """Two contexts."""

    with pytest.raises(DefinitionError, match="only one parameter can take the ToolContext"):
        tool("args.two")(two)


def test_a_hint_that_only_type_checkers_can_resolve_is_a_definition_error():
    @dataclasses.dataclass
    class Later:
        when: Unresolvable  # type: ignore[name-defined]  # noqa: F821

    def later(item: Later) -> None:
        """Uses a record whose hint names nothing at run time."""

    with pytest.raises(DefinitionError, match="cannot be resolved"):
        tool("args.later")(later)


async def test_async_tools_receive_converted_arguments_too(kernel_factory):
    @tool("args.async")
    async def convert_async(mode: Mode, window: Window) -> dict[str, Any]:
        """Async."""
        return {"mode": mode.value, "end": window.start + window.size}

    kernel = kernel_factory()
    kernel.register(convert_async)
    assert convert_async.is_async
    run = kernel.start_run()
    result = await kernel.call(run, "args.async", {"mode": "fast", "window": {"start": 5}})
    assert result.status is Status.SUCCEEDED
    assert result.structured_output == {"mode": "fast", "end": 15}


def test_a_tool_with_only_plain_parameters_is_called_without_a_wrapper():
    def plain(text: str, limit: Annotated[int, Ge(1)] = 1, maybe: int | None = None) -> str:
        """Plain."""
        return text

    plain_tool = tool("args.plain")(plain)
    assert plain_tool.function is plain
    assert plain_tool.wrapped is None


def test_calling_the_decorated_tool_directly_calls_the_function_unconverted():
    @tool("args.direct")
    def direct(mode: Mode, window: Window) -> tuple[Mode, Window]:
        """Direct."""
        return mode, window

    assert direct(Mode.SAFE, Window(1)) == (Mode.SAFE, Window(1))
    assert direct.function(mode="safe", window={"start": 1}) == (Mode.SAFE, Window(1))


def test_a_failed_conversion_is_a_tool_error_whose_traceback_names_the_argument(
    kernel_factory,
):
    @tool("args.checked")
    def checked(item: Checked) -> None:
        """Checked."""

    kernel = kernel_factory()
    kernel.register(checked)
    run = kernel.start_run()
    result = kernel.call_sync(run, "args.checked", {"item": {"size": 500}})
    assert result.status is Status.FAILED
    assert result.error_code is ErrorCode.TOOL_ERROR
    traceback = next(
        e.payload["internal"]["traceback"]
        for e in kernel.ledger.events(run.id)
        if e.type is EventType.TOOL_CALL_RESULT
    )
    assert "argument 'item' could not be converted to Checked" in traceback
    assert "size is too large" in traceback


def test_a_tool_signal_raised_while_converting_is_kept(kernel_factory):
    @tool("args.refused")
    def refused(item: Refused) -> None:
        """Refused."""

    kernel = kernel_factory()
    kernel.register(refused)
    run = kernel.start_run()
    result = kernel.call_sync(run, "args.refused", {"item": {"size": 1}})
    assert result.error_code is ErrorCode.TOOL_ERROR
    assert result.safe_message == "size refused by the tool"


def test_set_items_that_cannot_be_hashed_are_refused_at_decoration():
    with pytest.raises(DefinitionError, match=r"inputSchema\.properties\.windows\.items"):

        @tool("args.unhashable")
        def unhashable(windows: set[Window]) -> None:
            """Unhashable."""

"""Tool output that is not plain JSON but has one obvious JSON form gets that form."""

from __future__ import annotations

import dataclasses
import enum
import uuid
from datetime import UTC, datetime

import pydantic
import pytest

from toolkernel.calls import ArtifactRef
from toolkernel.codes import ErrorCode, Status
from toolkernel.context import ToolContext
from toolkernel.dispatch import ToolOutput
from toolkernel.functions import tool
from toolkernel.run import ToolCall

pytestmark = pytest.mark.anyio


class Mode(enum.Enum):
    FAST = "fast"
    SAFE = "safe"


@dataclasses.dataclass
class Query:
    text: str
    mode: Mode = Mode.SAFE
    tags: frozenset[str] = frozenset()


class Hit(pydantic.BaseModel):
    path: str
    line: int


async def test_dataclasses_enums_sets_uuids_times_and_models_become_json(kernel_factory):
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

    @tool("repo.odd")
    def odd() -> object:
        """Return values with a JSON form."""
        return {
            "query": Query("x", tags=frozenset({"b", "a"})),
            "mode": Mode.FAST,
            "ids": {3, 1, 2},
            "id": ident,
            "at": when,
            "hits": [Hit(path="src/a.py", line=3)],
            "pair": (1, Mode.SAFE),
        }

    kernel = kernel_factory()
    kernel.register(odd)
    result = await kernel.call(kernel.start_run(), "repo.odd", {})
    assert result.status is Status.SUCCEEDED
    assert result.structured_output == {
        "query": {"text": "x", "mode": "safe", "tags": ["a", "b"]},
        "mode": "fast",
        "ids": [1, 2, 3],
        "id": "12345678-1234-5678-1234-567812345678",
        "at": "2026-01-02T03:04:05+00:00",
        "hits": [{"path": "src/a.py", "line": 3}],
        "pair": [1, "safe"],
    }


@pytest.mark.parametrize(
    ("schema", "status", "shown"),
    [
        ({"type": "object", "additionalProperties": {"type": "integer"}}, Status.SUCCEEDED, 3),
        ({"type": "object", "required": ["81"]}, Status.FAILED, None),
    ],
)
async def test_an_output_schema_judges_the_json_of_a_dict_with_integer_keys(
    kernel_factory, schema, status, shown
):
    """JSON writes the keys as strings: the schema sees what the model will see, and a
    mismatch is the tool's contract broken, not the runtime's failure."""

    @tool("repo.counts", output_schema=schema)
    def counts() -> dict[int, int]:
        """Count lines by length."""
        return {80: 3, 120: 1}

    kernel = kernel_factory()
    kernel.register(counts)
    result = await kernel.call(kernel.start_run(), "repo.counts", {})
    assert result.status is status
    if status is Status.SUCCEEDED:
        assert result.structured_output == {"80": shown, "120": 1}
    else:
        assert result.error_code is ErrorCode.OUTPUT_CONTRACT_VIOLATION


async def test_a_tool_can_return_the_dataclass_it_was_given(kernel_factory):
    @tool("repo.echo")
    def echo(query: Query) -> Query:
        """Return the query."""
        assert isinstance(query, Query)
        return query

    kernel = kernel_factory()
    kernel.register(echo)
    result = await kernel.call(
        kernel.start_run(), "repo.echo", {"query": {"text": "x", "mode": "fast"}}
    )
    assert result.status is Status.SUCCEEDED
    assert result.structured_output == {"text": "x", "mode": "fast", "tags": []}


@pytest.mark.parametrize(
    "value",
    [b"\x00\xff", object(), {"k": [object()]}],
    ids=["bytes", "object", "nested-object"],
)
async def test_what_has_no_json_form_is_still_an_output_contract_violation(kernel_factory, value):
    @tool("repo.raw")
    def raw() -> object:
        """Return something JSON cannot carry."""
        return value

    kernel = kernel_factory()
    kernel.register(raw)
    result = await kernel.call(kernel.start_run(), "repo.raw", {})
    assert result.error_code is ErrorCode.OUTPUT_CONTRACT_VIOLATION


@dataclasses.dataclass
class Lazy:
    ready: bool = dataclasses.field(init=False)  # never set


class Exploding(pydantic.BaseModel):
    value: int = 1

    def model_dump(self, **kwargs: object) -> dict[str, object]:
        raise RuntimeError("serializer failed")


@pytest.mark.parametrize(
    "value",
    [
        Lazy(),
        Exploding(),
        {Mode.FAST: 1, "fast": 2},
        {uuid.UUID(int=1): "a", str(uuid.UUID(int=1)): "b"},
    ],
    ids=["unset-dataclass-field", "raising-model-dump", "enum-key-collision", "uuid-key-collision"],
)
async def test_output_whose_conversion_fails_or_loses_an_entry_is_refused_alone(
    kernel_factory, value
):
    @tool("repo.odd")
    def odd() -> object:
        """Return something whose JSON form cannot be made without loss."""
        return value

    kernel = kernel_factory()
    kernel.register(odd)
    run = kernel.start_run()
    results = await kernel.call_many(
        run, [ToolCall("repo.odd", {}), ToolCall("repo.lookup", {"query": "q"})]
    )
    assert [r.error_code for r in results] == [ErrorCode.OUTPUT_CONTRACT_VIOLATION, None]


async def test_an_artifacts_type_and_description_are_redacted_like_its_output(kernel_factory):
    """An artifact reference is shown to the model too: a secret or host path in its
    media type or description (a remote server chose them) is masked."""
    token = "ghp_" + "Q7r8S9t0U1v2W3x4Y5z6A7b8C9d0E1f2G3h4"

    @tool("job.export")
    async def export(ctx: ToolContext) -> ToolOutput:
        """Export a file."""
        assert ctx.kernel is not None
        ref = ctx.kernel.artifacts.put(
            b"data",
            media_type=f"text/plain; token={token}",
            description="copied from /home/alice/private/export.txt",
            producer=ctx.tool_call_id,
        )
        return ToolOutput({"ok": True}, "exported", (ref,))

    kernel = kernel_factory()
    kernel.register(export)
    result = await kernel.call(kernel.start_run(), "job.export", {})
    shown = str(result.projection())
    assert result.status is Status.SUCCEEDED
    assert token not in shown
    assert "/home/alice" not in shown
    assert {n.where for n in result.redactions} == {"artifacts"}
    assert isinstance(result.artifacts[0], ArtifactRef)


async def test_a_plain_function_that_returns_a_coroutine_gets_it_awaited(kernel_factory):
    """A handler given as data may be a plain callable around an async function (a
    lambda): its coroutine is run, not reported as an output that is not JSON."""

    async def lookup(q: str) -> dict[str, str]:
        return {"found": q}

    definition = {
        "name": "repo.wrapped",
        "version": "1",
        "description": "Look something up.",
        "executionMode": "NATIVE",
        "inputSchema": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"q": {"type": "string"}},
            "required": ["q"],
        },
    }
    kernel = kernel_factory()
    kernel.register(definition, handler=lambda q: lookup(q))
    result = await kernel.call(kernel.start_run(), "repo.wrapped", {"q": "x"})
    assert result.status is Status.SUCCEEDED
    assert result.structured_output == {"found": "x"}

"""After dispatch: normalize → artifactize → redact, a chain of plain callables.

Each stage takes an ``Outcome`` and the ``Finishing`` context and returns an Outcome.
The chain is data (``DEFAULT_CHAIN``) so that later stages can be added, but the
kernel always runs it between dispatch and the RESULT event.

``normalize`` refuses output nested deeper than ``MAX_OUTPUT_DEPTH`` before anything
else walks it: the encoders, the output schema's validator and ``shrink`` recurse, and
a tool's odd output must end as its own FAILED result, not as an exception that takes
the other calls of the turn with it. It also refuses an artifact ref whose id the
artifact store did not issue: the model passes an id back to ``artifact.read`` as it is,
so it cannot be masked, and a store's id (a sha256 digest) holds nothing to mask.

``artifactize`` cuts output over the projection budget before ``redact`` sees it, so it
cuts strings with ``Redactor.clip``: a secret the cut goes through, or whose keyword it
cuts off, is masked whole and counted with the output's redactions.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, is_dataclass, replace
from dataclasses import fields as dataclass_fields
from datetime import date, datetime, time
from enum import Enum
from typing import Any, Final
from uuid import UUID

from toolkernel.arguments import DEFAULT_MAX_DEPTH
from toolkernel.artifacts import ArtifactStore
from toolkernel.calls import ArtifactRef, RedactionNotice
from toolkernel.canonical import canonical_json
from toolkernel.codes import ErrorCode, Status, safe_message
from toolkernel.dispatch import Outcome
from toolkernel.errors import UsageError
from toolkernel.redaction import Redactor, new_counts
from toolkernel.registry import RegisteredTool

__all__ = [
    "DEFAULT_CHAIN",
    "MAX_OUTPUT_DEPTH",
    "Finishing",
    "Processor",
    "artifactize",
    "normalize",
    "redact",
    "redaction_notices",
    "shrink",
]


@dataclass(slots=True)
class Finishing:
    """What the post-processing stages need to know about the call.

    ``encoded`` is the canonical JSON of the output as it stands (``normalize`` sets it,
    ``artifactize`` stores it); a stage that replaces the output must set it to None.
    ``clipped`` counts, by kind, what ``artifactize`` masked where it cut the output;
    ``redact`` adds what it masks in the output and reports the sum.
    """

    tool: RegisteredTool
    tool_call_id: str
    artifacts: ArtifactStore
    redactor: Redactor
    redactions: list[RedactionNotice] = field(default_factory=list)
    encoded: bytes | None = None
    clipped: Counter[str] = field(default_factory=new_counts)


Processor = Callable[[Outcome, Finishing], Outcome]

MAX_OUTPUT_DEPTH: Final = 2 * DEFAULT_MAX_DEPTH
"""Levels of nesting an output may have, counted as for arguments: twice what
arguments may have, so that a tool can wrap what it was given and still answer."""
_CONTAINERS: Final = (dict, list, tuple)
_SCALARS: Final = frozenset((str, int, float, bool, type(None)))


def normalize(outcome: Outcome, fin: Finishing) -> Outcome:
    """Make the output plain JSON and hold it to the tool's output schema."""
    name = fin.tool.name
    if isinstance(outcome.output, _CONTAINERS) and _nested_deeper(outcome.output, MAX_OUTPUT_DEPTH):
        why = f"output is nested more than {MAX_OUTPUT_DEPTH} levels deep"
        return _contract_violation(outcome, fin, why, shown=f"Its {why}.")
    replayed = "replayedFrom" in outcome.internal  # served as recorded, refs and all
    if (
        outcome.artifacts
        and not replayed
        and (foreign := _foreign_ref(outcome.artifacts, fin.artifacts))
    ):
        return _contract_violation(outcome, fin, foreign, shown=f"Its {foreign}.")
    try:
        fin.encoded = canonical_json(outcome.output)
    except TypeError:
        # Not plain JSON: what has one obvious JSON form (a dataclass, an Enum, a set,
        # a UUID, a datetime, a pydantic model) gets it; anything else is refused.
        try:
            outcome.output = _jsonable(outcome.output, MAX_OUTPUT_DEPTH)
            fin.encoded = canonical_json(outcome.output)
        except Exception:  # noqa: BLE001 - the tool's objects: whatever they raise, refused
            return _contract_violation(outcome, fin, "output is not JSON-serializable")
    except ValueError:
        return _contract_violation(outcome, fin, "output is not JSON-serializable")
    validator = fin.tool.output_validator
    if validator is not None and outcome.status in (Status.SUCCEEDED, Status.PARTIAL):
        try:
            valid = validator.is_valid(outcome.output)
        except ValueError:
            # Keys JSON writes as strings ({80: 3}): the schema judges, and the model
            # sees, the JSON the output is, not the Python value it was made from.
            outcome.output = json.loads(canonical_json(outcome.output))
            valid = validator.is_valid(outcome.output)
        if not valid:
            errors = validator.errors(outcome.output, limit=3)
            return _contract_violation(outcome, fin, "; ".join(e.message[:200] for e in errors))
    if not outcome.message:
        outcome.message = f"{name} succeeded." if outcome.status is Status.SUCCEEDED else ""
    return outcome


def _jsonable(value: Any, depth: int) -> Any:
    """``value`` with the types that have one obvious JSON form converted to it.

    Raises:
        ValueError: nested deeper than ``depth`` once converted.
    """
    if type(value) in _SCALARS:
        return value
    if depth <= 0:
        raise ValueError("nested too deeply")
    if isinstance(value, Enum):
        return _jsonable(value.value, depth)
    if isinstance(value, dict):
        converted: dict[Any, Any] = {}
        for key, item in value.items():
            name = key if isinstance(key, str) else _jsonable(key, depth)
            if name in converted:  # {Kind.FILE: 1, "file": 2}: one would be lost
                raise TypeError(f"two keys of the output read as {name!r}")
            converted[name] = _jsonable(item, depth - 1)
        return converted
    if isinstance(value, list | tuple):
        return [_jsonable(item, depth - 1) for item in value]
    if isinstance(value, set | frozenset):
        items = [_jsonable(item, depth - 1) for item in value]
        try:
            return sorted(items)  # a set has no order: give it a stable one
        except TypeError:
            return items
    if is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclass_fields(value)}
        return _jsonable(fields, depth)
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    dump = getattr(value, "model_dump", None)  # pydantic v2 models
    if callable(dump) and not isinstance(value, type):
        return _jsonable(dump(mode="json"), depth - 1)
    return value  # left for the encoder to refuse


def _nested_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` containers deep (a cycle does)."""
    if not isinstance(value, _CONTAINERS):
        return False
    # Depth first with an explicit stack: a cycle is followed down to ``limit`` at
    # once, where level by level its copies could multiply first.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        for child in item.values() if isinstance(item, dict) else item:
            if type(child) in _SCALARS or not isinstance(child, _CONTAINERS):
                continue
            if depth == limit:
                return True
            stack.append((child, depth + 1))
    return False


def _foreign_ref(refs: Sequence[ArtifactRef], store: ArtifactStore) -> str | None:
    """Why a ref cannot be shown: its id is not one ``store`` issued (None: all are).

    The id itself is not quoted: it is the tool's text, not the store's.
    """
    for number, ref in enumerate(refs, start=1):
        try:
            store.metadata(ref.id)
        except UsageError:
            return (
                f"artifact ref {number} of {len(refs)} has an id the artifact store did not issue"
            )
    return None


def _contract_violation(outcome: Outcome, fin: Finishing, why: str, *, shown: str = "") -> Outcome:
    """FAILED/OUTPUT_CONTRACT_VIOLATION; ``why`` goes to the ledger, ``shown`` to the model
    too (only text that holds nothing of the output)."""
    fin.encoded = None
    internal = {**outcome.internal, "contractViolation": why}
    message = safe_message(ErrorCode.OUTPUT_CONTRACT_VIOLATION, tool=fin.tool.name)
    return Outcome(
        Status.FAILED,
        ErrorCode.OUTPUT_CONTRACT_VIOLATION,
        f"{message} {shown}" if shown else message,
        attempts=outcome.attempts,
        duration_ms=outcome.duration_ms,
        internal=internal,
    )


MAX_MESSAGE_CHARS: Final = 2_000
"""The longest safe message shown whole. A longer one (a tool that puts a build log in
its ``ToolFailed``) is kept whole as an artifact, and the model sees its start and end."""
_MESSAGE_HEAD: Final = 1_400
_MESSAGE_TAIL: Final = 400


def artifactize(outcome: Outcome, fin: Finishing) -> Outcome:
    """Keep the full output, and a message too long to show, as artifacts when they
    exceed the projection budget."""
    if len(outcome.message) > MAX_MESSAGE_CHARS:
        _cut_message(outcome, fin)
    budget = fin.tool.definition.output_contract.max_bytes
    encoded = fin.encoded if fin.encoded is not None else canonical_json(outcome.output)
    if len(encoded) <= budget:
        return outcome
    ref = fin.artifacts.put(
        encoded,
        media_type="application/json",
        description=f"Full output of {fin.tool.name}",
        producer=fin.tool_call_id,
    )
    outcome.artifacts = (*outcome.artifacts, ref)
    outcome.output = shrink(outcome.output, budget, redactor=fin.redactor, counts=fin.clipped)
    fin.encoded = None
    if outcome.status is Status.SUCCEEDED:
        outcome.status = Status.PARTIAL
        outcome.code = ErrorCode.OUTPUT_TRUNCATED
        outcome.message = safe_message(
            ErrorCode.OUTPUT_TRUNCATED, summary=outcome.message, artifact=ref.id
        )
    return outcome


def _cut_message(outcome: Outcome, fin: Finishing) -> None:
    """Show the start and end of ``outcome.message``, the whole of it in an artifact.
    Cut with ``clip``: a secret the cuts go through is masked, not left in part."""
    message = outcome.message
    ref = fin.artifacts.put(
        message.encode("utf-8", "surrogatepass"),
        media_type="text/plain; charset=utf-8",
        description=f"Full message of {fin.tool.name}",
        producer=fin.tool_call_id,
    )
    masked = new_counts()
    clip = fin.redactor.clip
    head = clip(message, 0, _MESSAGE_HEAD, masked)
    tail = clip(message, len(message) - _MESSAGE_TAIL, len(message), masked)
    left_out = len(message) - _MESSAGE_HEAD - _MESSAGE_TAIL
    outcome.message = (
        f"{head}\n… [{left_out} characters left out; the whole message is in artifact "
        f"{ref.id} (read it with artifact.read)] …\n{tail}"
    )
    outcome.artifacts = (*outcome.artifacts, ref)
    if masked:
        fin.redactions.extend(redaction_notices(masked, "safeMessage"))


def redact(outcome: Outcome, fin: Finishing) -> Outcome:
    """Mask secrets and host paths in everything the model will see."""
    redactor = fin.redactor
    counts = new_counts()
    outcome.message = redactor.redact(outcome.message, counts)
    if counts:
        fin.redactions.extend(redaction_notices(counts, "safeMessage"))
    counts = fin.clipped  # what artifactize masked at its cuts, and what is masked now
    outcome.output = redactor.redact(outcome.output, counts)
    if counts:
        fin.redactions.extend(redaction_notices(counts, "structuredOutput"))
        fin.encoded = None
    if outcome.artifacts:  # their fields are shown too
        outcome.artifacts = _redacted_refs(outcome.artifacts, fin)
    if not fin.redactions:
        return outcome
    withheld: Counter[str] = Counter()
    for notice in fin.redactions:
        if notice.kind != "workspace-path":  # made relative, not withheld
            withheld[notice.kind] += notice.count
    if withheld:
        # The model is told that something was withheld, and what kind: it should not
        # retry to get it, nor treat the masks as the real values.
        shown = ", ".join(f"{count} {kind}" for kind, count in sorted(withheld.items()))
        outcome.message = f"{outcome.message} [Redacted from this result: {shown}.]".lstrip()
    return outcome


def _redacted_refs(refs: tuple[ArtifactRef, ...], fin: Finishing) -> tuple[ArtifactRef, ...]:
    """The refs with their text fields redacted; the id too, for a chain that leaves out
    ``normalize`` (a store's id is a digest, which redaction leaves as it is)."""
    counts: Counter[str] = Counter()
    shown = []
    text = fin.redactor.redact_text
    for ref in refs:
        fields = (ref.id, ref.media_type, ref.description)
        redacted = tuple(text(value, counts) for value in fields)
        if redacted != fields:
            ref = replace(ref, id=redacted[0], media_type=redacted[1], description=redacted[2])
        shown.append(ref)
    if counts:
        fin.redactions.extend(redaction_notices(counts, "artifacts"))
    return tuple(shown)


def redaction_notices(counts: Counter[str], where: str) -> list[RedactionNotice]:
    """One notice per kind of redaction in ``counts``, found in ``where``."""
    return [RedactionNotice(kind, count, where) for kind, count in sorted(counts.items())]


DEFAULT_CHAIN: Final[Sequence[Processor]] = (normalize, artifactize, redact)

_LEVELS: Final = ((2000, 100), (500, 50), (200, 20), (80, 10), (20, 3), (8, 1))


def shrink(value: Any, max_bytes: int, *, redactor: Redactor, counts: Counter[str]) -> Any:
    """A bounded copy of a JSON value: long strings and lists cut, level by level.

    A string is cut with ``redactor.clip``, so no secret is left in part at the cut;
    what that masks in the copy returned is counted in ``counts``.
    """
    for text_limit, item_limit in _LEVELS:
        masked: Counter[str] = Counter()
        candidate = _cut(value, text_limit, item_limit, redactor, masked)
        if len(canonical_json(candidate)) <= max_bytes:
            counts.update(masked)
            return candidate
    return None


def _cut(
    value: Any, text_limit: int, item_limit: int, redactor: Redactor, counts: Counter[str]
) -> Any:
    if isinstance(value, str):
        if len(value) <= text_limit:
            return value
        return redactor.clip(value, 0, text_limit, counts) + "…[truncated]"
    if isinstance(value, list):
        return [_cut(v, text_limit, item_limit, redactor, counts) for v in value[:item_limit]]
    if isinstance(value, dict):
        return {
            k: _cut(v, text_limit, item_limit, redactor, counts)
            for k, v in list(value.items())[: item_limit * 2]
        }
    return value

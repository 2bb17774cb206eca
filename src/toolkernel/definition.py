"""Tool definitions: the contract every tool declares before it can be called.

A definition is data. It arrives as a camelCase mapping (from JSON or TOML files, from
an MCP server, from the ``@tool`` decorator) and becomes a frozen ``ToolDefinition``
only after it passed the definition schema and the consistency rules below; an
invalid one raises ``DefinitionError`` naming the field.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Any, Final

from toolkernel.canonical import sha256_of
from toolkernel.codes import ErrorCode
from toolkernel.errors import DefinitionError
from toolkernel.schema import SchemaCompileError, SchemaError, compile_schema, iter_subschemas

__all__ = [
    "ConcurrencyGroup",
    "ExecutionMode",
    "OutputContract",
    "Permissions",
    "RetryPolicy",
    "Safety",
    "ToolDefinition",
    "TrustLevel",
    "load_definitions",
    "parse_definition_json",
]

DEFAULT_TIMEOUT_MS: Final = 30_000
DEFAULT_OUTPUT_BYTES: Final = 16_384


class ExecutionMode(StrEnum):
    """Where and how a tool runs; each mode has its own adapter and its own risk."""

    NATIVE = "NATIVE"
    SANDBOX_READ_ONLY = "SANDBOX_READ_ONLY"
    SANDBOX_WRITE = "SANDBOX_WRITE"
    PROCESS = "PROCESS"
    REMOTE_MCP = "REMOTE_MCP"
    EXTERNAL_API = "EXTERNAL_API"


class ConcurrencyGroup(StrEnum):
    """READ_ONLY calls may run in parallel; the others run one at a time per run."""

    READ_ONLY = "READ_ONLY"
    WORKSPACE_MUTATION = "WORKSPACE_MUTATION"
    COMMAND_EXECUTION = "COMMAND_EXECUTION"
    EXTERNAL_MUTATION = "EXTERNAL_MUTATION"


class TrustLevel(StrEnum):
    """How far the runtime believes what a tool says about itself."""

    BUILTIN = "builtin"
    TRUSTED = "trusted"
    UNTRUSTED = "untrusted"


@dataclass(frozen=True, slots=True)
class Permissions:
    """What a tool needs (in a definition) or what a run grants (in a profile)."""

    read_workspace: bool = False
    write_workspace: bool = False
    execute_command: bool = False
    network: bool = False

    def missing_from(self, granted: Permissions) -> list[str]:
        """The camelCase names of the permissions this requirement needs and ``granted`` lacks."""
        return [
            wire
            for attr, wire in _PERMISSION_NAMES
            if getattr(self, attr) and not getattr(granted, attr)
        ]

    def to_dict(self) -> dict[str, bool]:
        return {wire: getattr(self, attr) for attr, wire in _PERMISSION_NAMES}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Permissions:
        return cls(**{attr: bool(data.get(wire, False)) for attr, wire in _PERMISSION_NAMES})


_PERMISSION_NAMES: Final = (
    ("read_workspace", "readWorkspace"),
    ("write_workspace", "writeWorkspace"),
    ("execute_command", "executeCommand"),
    ("network", "network"),
)


@dataclass(frozen=True, slots=True)
class Safety:
    """The tool's risk profile and where it came from."""

    mutating: bool = False
    destructive: bool = False
    external: bool = False
    trust: TrustLevel = TrustLevel.TRUSTED
    source: str = "native"

    def to_dict(self) -> dict[str, Any]:
        return {
            "mutating": self.mutating,
            "destructive": self.destructive,
            "external": self.external,
            "trust": str(self.trust),
            "source": self.source,
        }


@dataclass(frozen=True, slots=True)
class OutputContract:
    """The output schema (optional) and the byte budget of the model projection."""

    schema: Mapping[str, Any] | None = None
    max_bytes: int = DEFAULT_OUTPUT_BYTES

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"maxBytes": self.max_bytes}
        if self.schema is not None:
            data["schema"] = self.schema
        return data


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a failed call is tried again, and after which error codes."""

    attempts: int = 1
    backoff_ms: int = 200
    multiplier: float = 2.0
    max_backoff_ms: int = 5_000
    on: frozenset[ErrorCode] = frozenset()

    def delay_s(self, attempt: int) -> float:
        """Seconds to wait before try number ``attempt + 1`` (``attempt`` starts at 1)."""
        delay = self.backoff_ms * self.multiplier ** (attempt - 1)
        return min(delay, self.max_backoff_ms) / 1000

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "backoffMs": self.backoff_ms,
            "multiplier": self.multiplier,
            "maxBackoffMs": self.max_backoff_ms,
            "on": sorted(self.on),
        }


@dataclass(frozen=True)
class ToolDefinition:
    """Every field of the ToolDefinition contract (DESIGN.md), snake_case in Python."""

    name: str
    version: str
    title: str
    description: str
    input_schema: Mapping[str, Any]
    output_contract: OutputContract = field(default_factory=OutputContract)
    execution_mode: ExecutionMode = ExecutionMode.NATIVE
    permissions: Permissions = field(default_factory=Permissions)
    safety: Safety = field(default_factory=Safety)
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    idempotent: bool = False
    tags: frozenset[str] = frozenset()
    concurrency_group: ConcurrencyGroup = ConcurrencyGroup.READ_ONLY

    def to_dict(self) -> dict[str, Any]:
        """The camelCase wire form; ``from_dict(to_dict())`` round-trips."""
        return {
            "name": self.name,
            "version": self.version,
            "title": self.title,
            "description": self.description,
            "inputSchema": self.input_schema,
            "outputContract": self.output_contract.to_dict(),
            "executionMode": str(self.execution_mode),
            "permissions": self.permissions.to_dict(),
            "safety": self.safety.to_dict(),
            "timeoutMs": self.timeout_ms,
            "retry": self.retry.to_dict(),
            "idempotent": self.idempotent,
            "tags": sorted(self.tags),
            "concurrencyGroup": str(self.concurrency_group),
        }

    @cached_property
    def hash(self) -> str:
        """Canonical hash of the whole definition, as recorded in TOOLS_EXPOSED."""
        return sha256_of(self.to_dict())

    @property
    def read_only(self) -> bool:
        """Neither mutates nor executes nor reaches the network."""
        p = self.permissions
        return not (self.safety.mutating or p.write_workspace or p.execute_command or p.network)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolDefinition:
        """Build a definition from its camelCase mapping.

        Raises:
            DefinitionError: the mapping breaks the contract; the error names the field.
        """
        _check_against_schema(data)
        name = str(data["name"])
        try:
            compile_schema(data["inputSchema"])
        except SchemaCompileError as exc:
            raise DefinitionError(
                name, _join("inputSchema", exc.pointer), f"not a valid JSON Schema: {exc}"
            ) from exc
        unsatisfiable = _unsatisfiable_required(data["inputSchema"])
        if unsatisfiable is not None:
            where, missing = unsatisfiable
            raise DefinitionError(
                name,
                _join("inputSchema", where),
                f"names '{missing[:100]}', which is not among the properties of an object "
                "that allows no other: no call could satisfy it",
            )
        contract = data.get("outputContract", {})
        if "schema" in contract:
            try:
                compile_schema(contract["schema"])
            except SchemaCompileError as exc:
                raise DefinitionError(
                    name, _join("outputContract.schema", exc.pointer), f"invalid: {exc}"
                ) from exc
        safety_data = data.get("safety", {})
        safety = Safety(
            mutating=bool(safety_data.get("mutating", False)),
            destructive=bool(safety_data.get("destructive", False)),
            external=bool(safety_data.get("external", False)),
            trust=TrustLevel(safety_data.get("trust", TrustLevel.TRUSTED)),
            source=str(safety_data.get("source", "native")),
        )
        mode = ExecutionMode(data["executionMode"])
        permissions = Permissions.from_dict(data.get("permissions", {}))
        retry_data = data.get("retry", {})
        definition = cls(
            name=name,
            version=str(data["version"]),
            title=str(data.get("title") or name),
            description=str(data["description"]),
            input_schema=data["inputSchema"],
            output_contract=OutputContract(
                schema=contract.get("schema"),
                max_bytes=int(contract.get("maxBytes", DEFAULT_OUTPUT_BYTES)),
            ),
            execution_mode=mode,
            permissions=permissions,
            safety=safety,
            timeout_ms=int(data.get("timeoutMs", DEFAULT_TIMEOUT_MS)),
            retry=RetryPolicy(
                attempts=int(retry_data.get("attempts", 1)),
                backoff_ms=int(retry_data.get("backoffMs", 200)),
                multiplier=float(retry_data.get("multiplier", 2.0)),
                max_backoff_ms=int(retry_data.get("maxBackoffMs", 5_000)),
                on=frozenset(ErrorCode(code) for code in retry_data.get("on", ())),
            ),
            idempotent=bool(data.get("idempotent", False)),
            tags=frozenset(data.get("tags", ())),
            concurrency_group=ConcurrencyGroup(
                data.get("concurrencyGroup") or _default_group(mode, safety, permissions)
            ),
        )
        _check_consistency(definition)
        _check_encodable(definition)
        return definition


def _default_group(
    mode: ExecutionMode, safety: Safety, permissions: Permissions
) -> ConcurrencyGroup:
    if mode is ExecutionMode.PROCESS or permissions.execute_command:
        return ConcurrencyGroup.COMMAND_EXECUTION
    if safety.mutating and (safety.external or mode is ExecutionMode.REMOTE_MCP):
        return ConcurrencyGroup.EXTERNAL_MUTATION
    if safety.mutating or mode is ExecutionMode.SANDBOX_WRITE:
        return ConcurrencyGroup.WORKSPACE_MUTATION
    return ConcurrencyGroup.READ_ONLY


def _check_consistency(d: ToolDefinition) -> None:
    """Rules that one field alone cannot express."""
    writes = d.permissions.write_workspace or d.execution_mode is ExecutionMode.SANDBOX_WRITE
    if writes and not d.safety.mutating:
        raise DefinitionError(
            d.name, "safety.mutating", "a tool that writes the workspace must be mutating"
        )
    if d.safety.destructive and not d.safety.mutating:
        raise DefinitionError(d.name, "safety.mutating", "a destructive tool must be mutating")
    changes_things = d.safety.mutating or d.permissions.execute_command
    if d.concurrency_group is ConcurrencyGroup.READ_ONLY and changes_things:
        raise DefinitionError(
            d.name,
            "concurrencyGroup",
            "a tool that mutates or executes commands cannot be in the READ_ONLY group",
        )
    if d.retry.attempts > 1 and not d.idempotent and not d.retry.on:
        raise DefinitionError(
            d.name,
            "retry.on",
            "a tool that is not idempotent may only be retried on listed error codes",
        )


def _check_encodable(d: ToolDefinition) -> None:
    """The definition has a canonical form to hash (what TOOLS_EXPOSED records): no
    NaN or infinity (a TOML ``inf`` default), nothing JSON cannot carry."""
    try:
        d.hash  # noqa: B018 - computed now, and kept, so that no call meets the failure
    except (ValueError, TypeError) as exc:
        where, value = _unencodable_at(d.to_dict(), "") or ("(root)", exc)
        raise DefinitionError(
            d.name, where.lstrip("."), f"holds {_shown(value)}, which JSON cannot carry"
        ) from exc


def _unencodable_at(value: Any, path: str) -> tuple[str, Any] | None:
    """The dotted path of the first value in ``value`` with no JSON form, and that value."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    if value is None or isinstance(value, str | int):
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _unencodable_at(item, f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _unencodable_at(item, f"{path}.{index}")
            if found is not None:
                return found
        return None
    return path, value


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)  # nan, inf, -inf
    return f"a {type(value).__name__}"


def _unsatisfiable_required(schema: Any) -> tuple[str, str] | None:
    """(pointer, name) of a required property that a closed object schema does not
    declare: no call can satisfy it (a typo, usually)."""
    for node, pointer in iter_subschemas(schema, ""):
        required = node.get("required")
        properties = node.get("properties")
        closed = node.get("additionalProperties") is False and not node.get("patternProperties")
        if closed and isinstance(required, list):
            declared = properties if isinstance(properties, Mapping) else {}
            for name in required:
                if isinstance(name, str) and name not in declared:
                    return f"{pointer}/required", name
    return None


def _join(base: str, pointer: str) -> str:
    parts = [p for p in pointer.split("/") if p]
    return ".".join([base, *parts])


def _check_against_schema(data: Mapping[str, Any]) -> None:
    if not isinstance(data, Mapping):
        raise DefinitionError("", "(root)", "a tool definition must be an object")
    name = data.get("name")
    tool = name if isinstance(name, str) else ""
    foreign = _not_json(data, ())
    if foreign is not None:  # a TOML date, a Python set: the validator cannot read it
        where, value = foreign
        what = f"is a {type(value).__name__}, which JSON cannot hold (write it as a string)"
        raise DefinitionError(tool, ".".join(where) or "(root)", what)
    errors = _DEFINITION_VALIDATOR.errors(data, limit=1)
    if errors:
        raise DefinitionError(tool, *_describe(errors[0]))


def _not_json(value: Any, where: tuple[str, ...]) -> tuple[tuple[str, ...], Any] | None:
    """The first value in ``value`` that is not JSON, with its path; None if none is."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _not_json(item, (*where, str(key)))
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _not_json(item, (*where, str(index)))
            if found is not None:
                return found
        return None
    if value is None or isinstance(value, str | int | float):  # bool is an int
        return None
    return where, value


def _describe(error: SchemaError) -> tuple[str, str]:
    path = [str(p) for p in error.instance_path]
    where = ".".join(path) or "(root)"
    details = error.details
    if error.keyword == "required":
        missing = str(details.get("property", "?"))
        return ".".join([*path, missing]), "is required"
    if error.keyword == "additionalProperties":
        unexpected = details.get("unexpected") or ["?"]
        return ".".join([*path, str(unexpected[0])]), "is not a known field"
    return where, _problem(error)


def _problem(error: SchemaError) -> str:
    messages = {
        "type": "has the wrong type (expected {expected})",
        "enum": "must be one of {options}",
        "pattern": "does not match the required pattern {pattern}",
        "const": "must be {expected_value}",
        "minimum": "is below the minimum {limit}",
        "maximum": "is above the maximum {limit}",
        "minLength": "is too short",
        "maxLength": "is too long (max {limit})",
    }
    template = messages.get(error.keyword)
    if template is None:
        return f"is invalid ({error.keyword})"
    try:
        return template.format(**error.details)
    except (KeyError, IndexError):
        return f"is invalid ({error.keyword})"


_NAME_PATTERN: Final = r"^[A-Za-z][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)+$"

DEFINITION_SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "version", "description", "inputSchema", "executionMode"],
    "properties": {
        "name": {"type": "string", "maxLength": 128, "pattern": _NAME_PATTERN},
        "version": {"type": "string", "pattern": r"^[0-9A-Za-z.+_-]{1,32}$"},
        "title": {"type": "string", "maxLength": 200},
        "description": {"type": "string", "minLength": 1, "maxLength": 4000},
        "inputSchema": {
            "type": "object",
            "required": ["type", "additionalProperties"],
            "properties": {
                "type": {"const": "object"},
                "additionalProperties": {"const": False},
                "properties": {"type": "object"},
                "required": {"type": "array", "items": {"type": "string"}},
            },
        },
        "outputContract": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "schema": {"type": ["object", "boolean"]},
                "maxBytes": {"type": "integer", "minimum": 256, "maximum": 1_048_576},
            },
        },
        "executionMode": {"enum": [m.value for m in ExecutionMode]},
        "permissions": {
            "type": "object",
            "additionalProperties": False,
            "properties": {wire: {"type": "boolean"} for _, wire in _PERMISSION_NAMES},
        },
        "safety": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "mutating": {"type": "boolean"},
                "destructive": {"type": "boolean"},
                "external": {"type": "boolean"},
                "trust": {"enum": [t.value for t in TrustLevel]},
                "source": {"type": "string", "maxLength": 500},
            },
        },
        "timeoutMs": {"type": "integer", "minimum": 1, "maximum": 3_600_000},
        "retry": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "attempts": {"type": "integer", "minimum": 1, "maximum": 10},
                "backoffMs": {"type": "integer", "minimum": 0, "maximum": 60_000},
                "multiplier": {"type": "number", "minimum": 1, "maximum": 10},
                "maxBackoffMs": {"type": "integer", "minimum": 0, "maximum": 300_000},
                "on": {"type": "array", "items": {"enum": [c.value for c in ErrorCode]}},
            },
        },
        "idempotent": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 64}, "maxItems": 32},
        "concurrencyGroup": {"enum": [g.value for g in ConcurrencyGroup]},
    },
}

_DEFINITION_VALIDATOR: Final = compile_schema(DEFINITION_SCHEMA)


def parse_definition_json(text: str) -> Any:
    """Parse a definition document's JSON, refusing an object that repeats a key: one
    reader keeps the first copy and another the last, so what is checked and what a
    client shows the model could differ.

    Raises:
        ValueError: not JSON (a ``JSONDecodeError``), or a key repeated in one object.
    """
    return json.loads(text, object_pairs_hook=_once_each)


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"key {key[:60]!r} appears twice in one object")
        data[key] = value
    return data


def load_definitions(path: Path) -> list[ToolDefinition]:
    """Load one definition or a list of them from a ``.json`` or ``.toml`` file.

    A TOML file holds either one definition at the top level or a ``[[tools]]`` array.

    Raises:
        DefinitionError: the file cannot be read or a definition in it is invalid.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DefinitionError("", str(path), f"cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        where = f"not UTF-8 text (byte {exc.start})"
        raise DefinitionError("", path.name, where) from exc
    try:
        if path.suffix == ".toml":
            data: Any = tomllib.loads(text)
            data = data.get("tools", data)
        else:
            data = parse_definition_json(text)
    except ValueError as exc:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise DefinitionError("", path.name, f"not valid {path.suffix[1:].upper()}: {exc}") from exc
    except RecursionError as exc:
        raise DefinitionError("", path.name, "nested too deeply to read") from exc
    items: Iterable[Any] = data if isinstance(data, list) else [data]
    return [ToolDefinition.from_dict(item) for item in items]

"""``toolkernel.toml``: workspace, forbidden paths, exposure rules, policy, budgets,
rate limits and the ledger's location, checked against its own JSON Schema
(``config.schema.json`` in this package; ``toolkernel config schema`` prints it).

With no file, the defaults are: the workspace is the current directory, the ledger
lives in the workspace's state directory, read-only tools are exposed, and network
and writes are denied.
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import shutil
import stat
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from toolkernel.context import ApprovalState, RunState, VerificationStatus
from toolkernel.definition import Permissions
from toolkernel.errors import ConfigError, UsageError
from toolkernel.exposure import DEFAULT_EXPOSURE, ExposureRule
from toolkernel.globs import compile_globs, read_otherwise_by_ripgrep, workspace_pattern
from toolkernel.pathguard import DEFAULT_FORBIDDEN
from toolkernel.policy import (
    BUILTIN_PROFILES,
    Action,
    ApprovalDefaults,
    Budget,
    Policy,
    PolicyRule,
    RateLimit,
)
from toolkernel.schema import compile_schema
from toolkernel.terminal import printable

if TYPE_CHECKING:
    from toolkernel.mcp.servers import ServerConfig

__all__ = ["CONFIG_FILENAME", "Config", "LedgerConfig", "load_config"]

CONFIG_FILENAME: Final = "toolkernel.toml"
STATE_DIRNAME: Final = ".toolkernel"
# No configuration nests this deep; the schema validator gives up at about 250 levels.
_MAX_DEPTH: Final = 64
_SHOWN: Final = 200  # characters of a path a message shows
_BINARIES: Final = ("bwrap", "rg")
_MAX_LINKS: Final = 40  # Linux follows no more in one lookup
# [sandbox.limits] keys that every command gets as resource limits.
_RLIMITS: Final = {
    "cpu_seconds": resource.RLIMIT_CPU,
    "memory_bytes": resource.RLIMIT_AS,
    "max_processes": resource.RLIMIT_NPROC,
    "file_size_bytes": resource.RLIMIT_FSIZE,
}


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    backend: Literal["sqlite", "postgres"] = "sqlite"
    path: Path | None = None
    dsn: str | None = None
    synchronous: Literal["normal", "full"] = "normal"
    commit: Literal["each", "group"] = "each"
    schema: str = "toolkernel"


_MIB: Final = 1024 * 1024
DEFAULT_ARTIFACTS_MIB: Final = 2048


@dataclass(frozen=True, slots=True)
class Config:
    """The runtime's configuration, resolved to absolute paths."""

    workspace: Path
    state_dir: Path
    forbidden_paths: tuple[str, ...] = DEFAULT_FORBIDDEN
    max_argument_bytes: int = 256 * 1024
    ledger: LedgerConfig = field(default_factory=LedgerConfig)
    # The artifact store's bound ([artifacts] max_mib); None keeps every artifact.
    artifacts_max_bytes: int | None = DEFAULT_ARTIFACTS_MIB * _MIB
    exposure: tuple[ExposureRule, ...] = DEFAULT_EXPOSURE
    policy: Policy = field(default_factory=Policy)
    max_parallel_reads: int = 4
    run_state: RunState = RunState.PLANNING
    profile: str = "read-only"
    verification: VerificationStatus = VerificationStatus.UNKNOWN
    tool_modules: tuple[str, ...] = ()
    tool_definitions: tuple[Path, ...] = ()
    sandbox: Mapping[str, Any] = field(default_factory=dict)
    mcp_servers: tuple[ServerConfig, ...] = ()
    source: Path | None = None

    @property
    def ledger_path(self) -> Path:
        return self.ledger.path or self.state_dir / "ledger.db"

    @classmethod
    def default(cls, workspace: Path | None = None) -> Config:
        root = (workspace or Path.cwd()).resolve()
        return cls(workspace=root, state_dir=root / STATE_DIRNAME)


def _schema() -> dict[str, Any]:
    text = resources.files("toolkernel").joinpath("config.schema.json").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


CONFIG_SCHEMA: Final = _schema()
_VALIDATOR: Final = compile_schema(CONFIG_SCHEMA)


def load_config(path: Path | None = None, *, workspace: Path | None = None) -> Config:
    """Load ``path`` (or ``./toolkernel.toml`` when present), else the defaults.

    Args:
        path: the configuration file; ``None`` looks for toolkernel.toml in the
            workspace (or the current directory). Only a name that is not there at
            all means the defaults: a dangling link or a directory is an error.
        workspace: overrides the file's ``workspace``.

    Raises:
        ConfigError: the file is unreadable or not a regular file, not TOML, or
            breaks the schema, or a path in it (or ``workspace``) is one the system
            cannot use; the message names the file and the key.
    """
    if workspace is not None:
        _directory(workspace, "workspace: ")
    if path is None:
        candidate = (workspace or Path.cwd()) / CONFIG_FILENAME
        try:
            candidate.lstat()
        except (FileNotFoundError, NotADirectoryError):
            return Config.default(workspace)
        except OSError:
            pass  # reported below, naming the file
        path = candidate
    _check_regular_file(path)
    try:
        # A byte-order mark (Windows editors write one) is not part of the TOML.
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the configuration ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: the configuration is not UTF-8 text") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: the TOML is nested too deeply to read") from exc
    return from_mapping(data, base=path.parent.resolve(), source=path, workspace=workspace)


def from_mapping(
    data: Mapping[str, Any],
    *,
    base: Path,
    source: Path | None = None,
    workspace: Path | None = None,
) -> Config:
    """Build a Config from already-parsed TOML data.

    ``workspace``, ``tools.definitions`` and the ``[sandbox]`` binaries are relative
    to ``base`` (the file's directory); ``state_dir``, ``ledger.path`` and a server's
    ``cwd`` to the workspace; ``~`` is expanded in each.

    Raises:
        ConfigError: the data breaks the configuration schema, or names a path, a
            binary or a profile that cannot be used.
    """
    label = str(source) if source else "configuration"
    _check_values(data, label)
    errors = _VALIDATOR.errors(data, limit=1)
    if errors:
        error = errors[0]
        key = ".".join(str(p) for p in error.instance_path)
        if error.keyword == "required":
            key = ".".join(filter(None, [key, str(error.details.get("property", ""))]))
        elif error.keyword == "additionalProperties":
            unexpected = error.details.get("unexpected") or ["?"]
            key = ".".join(filter(None, [key, str(unexpected[0])]))
            known = _subschema(error.schema_path[:-1]).get("properties", {})
            raise ConfigError(f"{label}: key '{_cut(key)}': unknown key{_takes(known)}")
        elif error.keyword == "enum":
            # The validator's own message names two choices and counts the rest.
            value = json.dumps(_subschema(error.instance_path, data), default=repr)
            raise ConfigError(
                f"{label}: key '{_cut(key)}': {_cut(value, 60)} is not one of "
                f"{_choices(error.details.get('options', []))}"
            )
        # The message quotes the value (a 1e300 written out in 301 digits): its middle goes.
        raise ConfigError(f"{label}: key '{_cut(key) or '(root)'}': {_cut(error.message, 160)}")
    where = f"{label}: key "
    if workspace is not None:
        root = _directory(workspace, "workspace: ")
    else:
        named = f"{where}'workspace': "
        root = _directory(_resolve(base, data.get("workspace", "."), named), named)
    data = _workspace_globs(data, label, root)
    state_dir = _resolve(root, data.get("state_dir", STATE_DIRNAME), f"{where}'state_dir': ")
    ledger = data.get("ledger", {})
    ledger_path = (
        _resolve(root, ledger["path"], f"{where}'ledger.path': ") if "path" in ledger else None
    )
    run = data.get("run", {})
    tools = data.get("tools", {})
    forbidden = tuple(data.get("forbidden_paths", DEFAULT_FORBIDDEN))
    forbidden += tuple(data.get("extra_forbidden_paths", ()))
    if ledger.get("backend") == "postgres" and not ledger.get("dsn"):
        raise ConfigError(f"{label}: key 'ledger.dsn': the postgres backend needs a DSN")
    _check_backend_keys(ledger, label)
    profile = run.get("profile", "read-only")
    policy = _policy(data.get("policy", {}), data.get("budget", {}), data.get("rate_limits", {}))
    _check_profiles(data, policy.profiles, label)
    exposure = (
        tuple(_exposure_rule(r) for r in data["exposure"])
        if "exposure" in data
        else (DEFAULT_EXPOSURE)
    )
    return Config(
        workspace=root,
        state_dir=state_dir,
        forbidden_paths=forbidden,
        max_argument_bytes=int(data.get("max_argument_bytes", 256 * 1024)),
        artifacts_max_bytes=_artifacts_bound(data.get("artifacts", {})),
        ledger=LedgerConfig(
            backend=ledger.get("backend", "sqlite"),
            path=ledger_path,
            dsn=ledger.get("dsn"),
            synchronous=ledger.get("synchronous", "normal"),
            commit=ledger.get("commit", "each"),
            schema=ledger.get("schema", "toolkernel"),
        ),
        exposure=exposure,
        policy=policy,
        max_parallel_reads=int(data.get("concurrency", {}).get("max_parallel_reads", 4)),
        run_state=RunState(run.get("state", RunState.PLANNING)),
        profile=profile,
        verification=VerificationStatus(run.get("verification", VerificationStatus.UNKNOWN)),
        tool_modules=tuple(tools.get("modules", ())),
        tool_definitions=tuple(
            _resolve(base, p, f"{where}'tools.definitions.{i}': ")
            for i, p in enumerate(tools.get("definitions", ()))
        ),
        sandbox=_sandbox(data.get("sandbox", {}), base, root, label),
        mcp_servers=_mcp_servers(data.get("mcp"), root, label),
        source=source,
    )


def _artifacts_bound(artifacts: Mapping[str, Any]) -> int | None:
    mib = int(artifacts.get("max_mib", DEFAULT_ARTIFACTS_MIB))
    return mib * _MIB if mib else None  # 0: keep every artifact


def _check_regular_file(path: Path) -> None:
    """Refuse what is there but cannot be the configuration: it is never skipped."""
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError) as exc:
        why = _why(exc)
        if _is_symlink(path):
            why = f"a symbolic link to a missing file: {why}"
        raise ConfigError(f"{_shown(path)}: cannot read the configuration ({why})") from exc
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{path}: cannot read the configuration (not a regular file)")


# The [ledger] keys only one backend reads: set for the other, they would be ignored
# (a DSN without backend = "postgres" left the events in SQLite).
_BACKEND_KEYS: Final = {"sqlite": ("path", "synchronous"), "postgres": ("dsn", "schema")}


def _check_backend_keys(ledger: Mapping[str, Any], label: str) -> None:
    backend = ledger.get("backend", "sqlite")
    for other, keys in _BACKEND_KEYS.items():
        for key in keys:
            if other != backend and key in ledger:
                raise ConfigError(
                    f"{label}: key 'ledger.{key}': only the {other} backend reads it, and "
                    f"ledger.backend is '{backend}'"
                    + (" (the default)" if "backend" not in ledger else "")
                    + f'; set backend = "{other}" or remove the key'
                )


def _subschema(path: Sequence[str | int], document: Any = CONFIG_SCHEMA) -> Any:
    """What is at ``path`` (a validation error's) in ``document``: the configuration
    schema, or the data it validated."""
    for step in path:
        document = document[step]
    return document


def _takes(properties: Mapping[str, Any]) -> str:
    names = ", ".join(f"'{name}'" for name in properties)
    return f" (this table takes {names})" if names else " (this table takes no keys)"


def _choices(options: Sequence[Any]) -> str:
    quoted = [json.dumps(option) for option in options]
    if len(quoted) < 2:
        return "".join(quoted)
    return f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _cut(text: str, limit: int = 100) -> str:
    """``text`` printable and at most about ``limit`` characters: its start and end."""
    text = printable(text)
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}…{text[-half:]}"


# Glob lists, compiled when a call needs them: a bad one is named here, not found later
# as POLICY_ERROR on every call that takes a path.
_GLOB_KEYS: Final = (
    ("forbidden_paths",),
    ("extra_forbidden_paths",),
    ("policy", "write_scope"),
    ("policy", "path_allow"),
    ("policy", "path_deny"),
)


def _workspace_globs(data: Mapping[str, Any], label: str, workspace: Path) -> dict[str, Any]:
    """``data`` with every glob list checked and spelt as ``workspace_pattern`` has it:
    the guard, the policy and ripgrep all match the pattern as the file meant it."""
    normalized = dict(data)
    policy = dict(data.get("policy", {}))
    for keys in _GLOB_KEYS:
        holder = policy if keys[0] == "policy" else normalized
        if keys[-1] in holder:
            named = ".".join(keys)
            holder[keys[-1]] = [
                _workspace_glob(pattern, f"{label}: key '{named}.{index}'", workspace)
                for index, pattern in enumerate(holder[keys[-1]])
            ]
    if policy:
        normalized["policy"] = policy
    return normalized


def _workspace_glob(pattern: str, where: str, workspace: Path) -> str:
    where = f"{where}: {printable(pattern)[:80]!r}"
    try:
        normalized = workspace_pattern(pattern, str(workspace))
    except UsageError as exc:
        raise ConfigError(f"{where} is not a workspace pattern ({exc})") from exc
    try:
        compile_globs((normalized,))
    except UsageError as exc:
        cause = exc.__cause__
        why = str(exc)
        if isinstance(cause, re.error):
            why = f"{cause.msg}; escape a literal '[' or '{{' as '[[]' or '[{{]'"
        raise ConfigError(f"{where} is not a valid glob ({why})") from exc
    if (otherwise := read_otherwise_by_ripgrep(normalized)) is not None:
        raise ConfigError(
            f"{where} is not a valid glob ({otherwise}: write one pattern per "
            "alternative, and a literal '[', '{' or '}' as '[[]', '[{]' or '[}]')"
        )
    return normalized


def _check_values(data: Mapping[str, Any], label: str) -> None:
    """Refuse what JSON cannot say before the schema sees it (its validator would call
    NaN null, and fail on dates and on deep nesting), naming the key."""
    pending: list[tuple[tuple[str, ...], Any]] = [((), data)]
    while pending:
        keys, value = pending.pop()
        if len(keys) > _MAX_DEPTH:
            raise ConfigError(f"{label}: key '{_cut(keys[0])}': nested more than {_MAX_DEPTH} deep")
        if keys and "\0" in keys[-1]:
            named = ".".join(keys).replace("\0", "\\u0000")
            raise ConfigError(f"{label}: key '{_cut(named)}': a NUL character is not allowed")
        if isinstance(value, str) and "\0" in value:
            raise ConfigError(
                f"{label}: key '{_cut('.'.join(keys))}': a NUL character is not allowed"
            )
        if isinstance(value, Mapping):
            pending.extend(((*keys, str(k)), v) for k, v in value.items())
        elif isinstance(value, list):
            pending.extend(((*keys, str(i)), v) for i, v in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{label}: key '{_cut('.'.join(keys))}': not a finite number")
        elif isinstance(value, date | time):
            raise ConfigError(
                f"{label}: key '{_cut('.'.join(keys))}': a date or time is not allowed"
            )


def _mcp_servers(
    data: Mapping[str, Any] | None, base: Path, label: str
) -> tuple[ServerConfig, ...]:
    if not data:
        return ()
    from toolkernel.mcp.servers import parse_servers  # the mcp package imports the kernel

    try:
        return tuple(parse_servers(data, base=base))
    except ConfigError as exc:
        raise ConfigError(f"{label}: {exc}") from None


def _sandbox(section: Mapping[str, Any], base: Path, workspace: Path, label: str) -> dict[str, Any]:
    """The ``[sandbox]`` section, its ``bwrap`` and ``rg`` found as ``_binary`` says."""
    _check_limits(section.get("limits", {}), label)
    found = dict(section)
    for name in _BINARIES:
        if name in section:
            where = f"{label}: key 'sandbox.{name}': "
            found[name] = _binary(section[name], base, workspace, where)
    return found


def _check_limits(limits: Mapping[str, int], label: str) -> None:
    """Refuse a limit above this process's hard limit: no command could start, as an
    unprivileged process (and any in the sandbox) may lower a hard limit, not raise it."""
    for name, which in _RLIMITS.items():
        hard = resource.getrlimit(which)[1]
        if name in limits and hard != resource.RLIM_INFINITY and limits[name] > hard:
            raise ConfigError(
                f"{label}: key 'sandbox.limits.{name}': {limits[name]} is above the hard "
                f"limit here ({hard}), which commands cannot raise"
            )


def _binary(value: str, base: Path, workspace: Path, where: str) -> str:
    """A configured binary: a path (``~`` expanded, relative to ``base``, not to the
    current directory) or a bare name looked up on PATH. It must name an executable
    file (when one is configured nothing else is tried, so a wrong one would refuse
    every sandboxed call) outside the workspace: both binaries run on the host, and a
    command that may write the workspace could put its own program in their place."""
    command = str(_resolve(base, value, where)) if "/" in value or value[:1] == "~" else value
    found = shutil.which(command)
    if found is None:
        raise ConfigError(f"{where}'{_shown(command)}' is not an executable file")
    if any(hop.is_relative_to(workspace) for hop in _hops(found)):
        raise ConfigError(
            f"{where}'{_shown(command)}' is in the workspace, where a command could replace "
            "it with a program that then runs outside the sandbox: install it elsewhere"
        )
    return command


def _hops(path: str) -> Iterator[Path]:
    """Every name that resolving ``path`` goes through, as written and in its real
    directory: the path, each symbolic link on the way, the file. A command could
    replace any of them, or a directory link on the way."""
    hop = Path(path).absolute()
    for _ in range(_MAX_LINKS):
        yield Path(os.path.normpath(hop))
        hop = hop.parent.resolve() / hop.name
        yield hop
        if not hop.is_symlink():
            return
        hop = hop.parent / hop.readlink()


def _resolve(root: Path, value: str, where: str) -> Path:
    """``value`` from the configuration: ``~`` expanded, relative to ``root``, and
    checked by ``_usable`` (``where`` names the key)."""
    try:
        path = Path(value).expanduser()
    except RuntimeError as exc:  # ~user with no such user (or no home at all)
        home = value.partition("/")[0]
        why = f"no home directory for '{_shown(home)}'"
        raise ConfigError(f"{where}cannot use '{_shown(value)}' ({why})") from exc
    path = path if path.is_absolute() else root / path
    _usable(path, where)
    return path


def _directory(path: Path, where: str) -> Path:
    """``path`` resolved (see ``_usable``), which must be an existing directory: the
    workspace, which every call's paths and the state's default place are taken from."""
    resolved = _usable(path, where)
    if not resolved.is_dir():
        why = "not a directory" if resolved.exists() else "no such directory"
        raise ConfigError(f"{where}cannot use '{_shown(path)}' ({why})")
    return resolved


def _usable(path: Path, where: str) -> Path:
    """``path`` resolved, if the system can look it up: one that is not there yet is
    fine (the runtime creates it, or the caller says it is missing), one that never
    could be (a NUL, a name too long, a regular file or a symbolic link loop on the
    way) is refused here, naming the key (``where``), not deep in the runtime."""
    try:
        resolved = path.resolve()  # ValueError: a NUL; RuntimeError: a symbolic link loop
        resolved.stat()
    except FileNotFoundError:
        pass
    except (OSError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"{where}cannot use '{_shown(path)}' ({_why(exc)})") from exc
    return resolved


def _why(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if isinstance(exc, ValueError):
        return "a NUL character is not allowed"
    return "a symbolic link loop"


def _is_symlink(path: Path) -> bool:
    try:
        return stat.S_ISLNK(path.lstat().st_mode)
    except (OSError, ValueError):
        return False


def _shown(path: Path | str) -> str:
    """``path`` for a message: control characters escaped, a long one clipped."""
    text = printable(str(path), one_line=False)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


def _check_profiles(data: Mapping[str, Any], known: Mapping[str, Any], label: str) -> None:
    """Refuse a profile name that is neither built in nor defined: a rule that names
    only such profiles never applies, so a deny rule with a misspelt one is off."""
    named = [("run.profile", data.get("run", {}).get("profile", "read-only"))]
    sections = {
        "exposure": data.get("exposure", ()),
        "policy.rules": data.get("policy", {}).get("rules", ()),
    }
    for section, rules in sections.items():
        for i, rule in enumerate(rules):
            profiles = rule.get("profiles", ())
            named += [(f"{section}.{i}.profiles.{j}", name) for j, name in enumerate(profiles)]
    for key, name in named:
        if name not in known:
            choices = _cut(", ".join(sorted(known)), 200)
            raise ConfigError(
                f"{label}: key '{key}': no profile named '{_cut(name)}' (known: {choices})"
            )


def _set(values: Any, kind: type[Any]) -> frozenset[Any] | None:
    return None if values is None else frozenset(kind(v) for v in values)


def _exposure_rule(data: Mapping[str, Any]) -> ExposureRule:
    return ExposureRule(
        tools=tuple(data.get("tools", ("*",))),
        states=_set(data.get("states"), RunState),
        profiles=_set(data.get("profiles"), str),
        verification=_set(data.get("verification"), VerificationStatus),
        approval=_set(data.get("approval"), ApprovalState),
        read_only=data.get("read_only"),
    )


def _policy(
    data: Mapping[str, Any], budget: Mapping[str, Any], limits: Mapping[str, Any]
) -> Policy:
    profiles = dict(BUILTIN_PROFILES)
    for name, grants in data.get("profiles", {}).items():
        profiles[name] = Permissions(**{k: bool(v) for k, v in grants.items()})
    approval = data.get("approval", {})
    return Policy(
        profiles=profiles,
        network=Action(data.get("network", "deny")),
        write_scope=tuple(data.get("write_scope", ())),
        path_allow=tuple(data.get("path_allow", ())),
        path_deny=tuple(data.get("path_deny", ())),
        approval=ApprovalDefaults(**{k: Action(v) for k, v in approval.items()}),
        rules=tuple(
            PolicyRule(
                tools=tuple(rule["tools"]),
                action=Action(rule["action"]),
                states=_set(rule.get("states"), RunState),
                profiles=_set(rule.get("profiles"), str),
                verification=_set(rule.get("verification"), VerificationStatus),
                reason=rule.get("reason", ""),
            )
            for rule in data.get("rules", ())
        ),
        budget=Budget(
            max_cost=budget.get("max_cost"),
            max_calls=budget.get("max_calls"),
            default_cost=float(budget.get("default_cost", 1.0)),
            costs={k: float(v) for k, v in budget.get("costs", {}).items()},
        ),
        rate_limits={
            pattern: RateLimit(int(v["calls"]), float(v["per_seconds"]))
            for pattern, v in limits.items()
        },
    )

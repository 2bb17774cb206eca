"""Downstream MCP servers as configured in ``toolkernel.toml``::

    [[mcp.servers]]
    name = "git"                          # namespace of its tools: git.status
    command = ["uvx", "mcp-server-git"]   # stdio; or url = "http://127.0.0.1:8000/mcp"
    cwd = "."                             # where it runs: relative to the workspace
    env_allow = ["HOME"]                  # names passed through from our environment
    env = { GIT_AUTHOR_NAME = "bot" }     # values set for the child
    timeout_ms = 30000                    # per call (becomes the tools' timeoutMs)
    tools = ["git_status", "git_diff"]    # allowlist of remote names; absent = all
    trust = "untrusted"                   # "trusted": annotations are believed
    pin = "tofu"                          # "strict": new tools wait for approval
    sandbox = "read-only"                 # run it in bubblewrap ("workspace": writable)
    network = false                       # in the sandbox: share the host network
    ro_binds = ["/opt/git-tools"]         # in the sandbox: more host paths, read-only

Starting a server (spawn and ``initialize``) and listing its tools are bounded by its
``timeout_ms`` too, but never by less than 10 s: a process needs time to start even
when its calls are quick (see ``ServerConfig.start_timeout_s``).

A stdio child gets a small base environment from the SDK (HOME, LOGNAME, PATH, SHELL,
TERM, USER), the variables named in ``env_allow`` that are set here, and ``env``;
nothing else of ours leaks to it. A sandboxed server (``sandbox``, see
``toolkernel.mcp.sandboxed``) runs inside bubblewrap, as shell commands do.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import urlsplit, urlunsplit

from toolkernel.definition import TrustLevel
from toolkernel.errors import ConfigError
from toolkernel.schema import compile_schema
from toolkernel.terminal import printable

# A variable whose name ends in or holds one of these words carries a secret.
_SECRET_NAME: Final = re.compile(
    r"(?:^|_)(?:API_?KEY|KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASS|AUTH|CREDENTIALS?|COOKIE|"
    r"PRIVATE|DSN|CONNECTION_STRING)(?:_|$)|PASSWORD|TOKEN|SECRET",
    re.IGNORECASE,
)

__all__ = [
    "MCP_CONFIG_SCHEMA",
    "PinMode",
    "SandboxMode",
    "ServerConfig",
    "ad_hoc_server",
    "parse_servers",
    "server_from_mapping",
]

PinMode = Literal["tofu", "strict"]
SandboxMode = Literal["none", "read-only", "workspace"]

DEFAULT_TIMEOUT_MS: Final = 30_000
MIN_START_TIMEOUT_MS: Final = 10_000
"""The least time a server is given to start, whatever its ``timeout_ms``."""
AD_HOC_NAME: Final = "server"
"""The name of a server given on the command line without one."""
SERVER_NAME_PATTERN: Final = r"^[A-Za-z][A-Za-z0-9_-]{0,31}$"
_ENV_NAME: Final = "^[A-Za-z_][A-Za-z0-9_]*$"

_SERVER_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": SERVER_NAME_PATTERN},
        "command": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "minItems": 1,
            "description": "argv of a stdio server.",
        },
        "url": {
            "type": "string",
            "pattern": "^https?://",
            "description": "Endpoint of a streamable HTTP server.",
        },
        "cwd": {
            "type": "string",
            "description": "Working directory of a stdio server, relative to the workspace "
            "(default: the workspace).",
        },
        "env_allow": {"type": "array", "items": {"type": "string", "pattern": _ENV_NAME}},
        "env": {
            "type": "object",
            "propertyNames": {"type": "string", "pattern": _ENV_NAME},
            "additionalProperties": {"type": "string"},
        },
        "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 3_600_000},
        "start_timeout_ms": {"type": "integer", "minimum": 1, "maximum": 3_600_000},
        "tools": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "trust": {"enum": ["trusted", "untrusted"]},
        "pin": {
            "enum": ["tofu", "strict"],
            "description": (
                "'tofu' (default): the tools of the server's first listing are pinned and "
                "exposed; a tool added later, or a changed definition, waits for "
                "`toolkernel mcp approve`. 'strict': every tool waits for approval, the "
                "first ones too."
            ),
        },
        "sandbox": {
            "enum": ["none", "read-only", "workspace"],
            "description": "Run a stdio server in bubblewrap: the workspace read-only, or "
            "writable ('workspace'); state and forbidden files hidden; no network.",
        },
        "network": {
            "type": "boolean",
            "description": "A sandboxed server may use the network.",
        },
        "ro_binds": {
            "type": "array",
            "items": {"type": "string", "pattern": "^/"},
            "description": "Host paths a sandboxed server may read (its code, if it lives "
            "outside the workspace and the system directories).",
        },
    },
}

MCP_CONFIG_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "additionalProperties": False,
    "description": "Downstream MCP servers bridged into the kernel (REMOTE_MCP tools).",
    "properties": {"servers": {"type": "array", "items": _SERVER_SCHEMA}},
}
"""The ``mcp`` property of ``config.schema.json``."""

_VALIDATOR: Final = compile_schema(MCP_CONFIG_SCHEMA)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One downstream server: how to reach it and how far to believe it.

    ``timeout_ms`` bounds each call of its tools (it becomes their ``timeoutMs``).
    ``start_timeout_ms`` bounds each step of connecting: starting the server (spawn
    and ``initialize``) and listing its tools; when None, ``timeout_ms`` does, but
    never less than ``MIN_START_TIMEOUT_MS`` (10 s), since a process needs time to
    start even when its calls are quick.
    """

    name: str
    command: tuple[str, ...] = ()
    url: str | None = None
    cwd: Path | None = None
    env_allow: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    start_timeout_ms: int | None = None
    tools: frozenset[str] | None = None
    trust: TrustLevel = TrustLevel.UNTRUSTED
    pin: PinMode = "tofu"
    sandbox: SandboxMode = "none"
    network: bool = False
    ro_binds: tuple[str, ...] = ()

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "http" if self.url else "stdio"

    @property
    def source(self) -> str:
        """The ``safety.source`` label of this server's tools."""
        return f"mcp:{self.name}"

    @property
    def start_timeout_s(self) -> float:
        """The bound, in seconds, on starting the server and on listing its tools."""
        if self.start_timeout_ms is not None:
            return self.start_timeout_ms / 1000
        return max(self.timeout_ms, MIN_START_TIMEOUT_MS) / 1000

    @property
    def trusted(self) -> bool:
        return self.trust is TrustLevel.TRUSTED

    def allows(self, remote_name: str) -> bool:
        """Whether the allowlist admits the remote tool (no allowlist admits all)."""
        return self.tools is None or remote_name in self.tools

    def child_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """What a stdio child gets on top of the SDK's base set."""
        environ = os.environ if environ is None else environ
        passed = {key: environ[key] for key in self.env_allow if key in environ}
        return passed | dict(self.env)

    def secrets(self, environ: Mapping[str, str] | None = None) -> list[str]:
        """The values of :meth:`child_env` whose names say they are secrets (``API_KEY``,
        ``GITHUB_TOKEN``, ``DB_PASSWORD``, ``PGPASSWORD``, …): the server may echo them
        in what it returns, and the model must not see them."""
        return [value for key, value in self.child_env(environ).items() if _SECRET_NAME.search(key)]

    def describe(self) -> str:
        """The server's target, for messages: the command, or the URL without its
        user info and query (where credentials tend to be)."""
        if self.url is None:
            return " ".join(self.command)
        parts = urlsplit(self.url)
        return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


_STDIO_ONLY: Final = ("env", "env_allow", "cwd", "network", "ro_binds")


def parse_servers(
    data: Mapping[str, Any] | None, *, base: Path | None = None
) -> list[ServerConfig]:
    """The servers of an ``[mcp]`` table (already parsed from TOML).

    Args:
        data: the value of the ``mcp`` key, or None when the file has none.
        base: the workspace: where a stdio server runs without a ``cwd``, and what a
            relative one is taken from. Without it, our current directory.

    Raises:
        ConfigError: the table breaks the schema or names a server twice; the message
            names the key, e.g. ``mcp.servers[1].timeout_ms``.
    """
    if data is None:
        return []
    errors = _VALIDATOR.errors(data, limit=1)
    if errors:
        error = errors[0]
        key = _key(error.instance_path)
        if error.keyword == "additionalProperties":
            unexpected = error.details.get("unexpected") or ["?"]
            raise ConfigError(f"key '{key}.{unexpected[0]}': unknown key")
        if error.keyword == "required":
            raise ConfigError(f"key '{key}.{error.details.get('property')}': is required")
        raise ConfigError(f"key '{key}': {error.message[:200]}")
    servers: list[ServerConfig] = []
    seen: set[str] = set()
    for index, raw in enumerate(data.get("servers", ())):
        key = f"mcp.servers[{index}]"
        server = server_from_mapping(raw, key=key, base=base)
        if server.name in seen:
            raise ConfigError(f"key '{key}.name': server '{server.name}' is configured twice")
        seen.add(server.name)
        servers.append(server)
    return servers


def server_from_mapping(
    raw: Mapping[str, Any], *, key: str = "mcp.servers[0]", base: Path | None = None
) -> ServerConfig:
    """One server table, already checked against the schema; ``base`` is the
    workspace, as for :func:`parse_servers`.

    Raises:
        ConfigError: neither or both of ``command`` and ``url`` are given, or ``cwd``
            names the home of a user there is none of.
    """
    if ("command" in raw) == ("url" in raw):
        raise ConfigError(f"key '{key}': give exactly one of 'command' (stdio) or 'url' (http)")
    sandbox = raw.get("sandbox", "none")
    if "url" in raw:
        # Accepted, they would do nothing: an ``env`` that never reaches the server.
        if sandbox != "none":
            raise ConfigError(
                f"key '{key}.sandbox': only a stdio server (command) can be sandboxed"
            )
        for option in _STDIO_ONLY:
            if option in raw:
                raise ConfigError(
                    f"key '{key}.{option}': only a stdio server (command) takes '{option}'; "
                    "an http server (url) runs elsewhere"
                )
    return ServerConfig(
        name=raw["name"],
        command=tuple(raw.get("command", ())),
        url=raw.get("url"),
        cwd=_cwd(raw.get("cwd"), base, f"{key}.cwd") if "command" in raw else None,
        env_allow=tuple(raw.get("env_allow", ())),
        env=tuple(sorted(raw.get("env", {}).items())),
        timeout_ms=int(raw.get("timeout_ms", DEFAULT_TIMEOUT_MS)),
        start_timeout_ms=int(raw["start_timeout_ms"]) if "start_timeout_ms" in raw else None,
        tools=frozenset(raw["tools"]) if "tools" in raw else None,
        trust=TrustLevel(raw.get("trust", TrustLevel.UNTRUSTED)),
        pin=raw.get("pin", "tofu"),
        sandbox=sandbox,
        network=bool(raw.get("network", False)),
        ro_binds=tuple(raw.get("ro_binds", ())),
    )


def ad_hoc_server(target: Sequence[str] | str, *, name: str = AD_HOC_NAME) -> ServerConfig:
    """A server given on the command line (``mcp inspect -- COMMAND…`` or a URL)."""
    if not re.match(SERVER_NAME_PATTERN, name):
        raise ConfigError(f"server name '{name[:40]}' must match {SERVER_NAME_PATTERN}")
    if isinstance(target, str):
        return ServerConfig(name=name, url=target)
    if not target:
        raise ConfigError("give the server's command or URL")
    return ServerConfig(name=name, command=tuple(target))


def _cwd(value: str | None, workspace: Path | None, key: str) -> Path | None:
    """Where a stdio server runs: ``value`` (``~`` expanded, relative to the
    workspace), else the workspace itself, as when it runs sandboxed: a server started
    from elsewhere (``serve --workspace``) must not see another directory as its own."""
    if not value:
        return workspace
    try:
        path = Path(value).expanduser()
    except RuntimeError as exc:  # ~user with no such user (or no home at all)
        home = printable(value.partition("/")[0])[:40]
        raise ConfigError(f"key '{key}': no home directory for '{home}'") from exc
    return path if path.is_absolute() else (workspace or Path.cwd()) / path


def _key(path: Sequence[str | int]) -> str:
    key = "mcp"
    for part in path:
        key += f"[{part}]" if isinstance(part, int) else f".{part}"
    return key

"""Everything an unsandboxed stdio MCP server started, stopped with it.

The SDK's stdio transport stops a server as the MCP specification says: it closes
its stdin, gives it two seconds, then signals its process group (SIGTERM, then
SIGKILL). It signals only if the server has not exited by then, and only that group:
a server that exits when its stdin closes leaves what it started running (re-parented
to init), and a child that left the group (``setsid``) is never signalled at all. A
sandboxed server needs none of this: its PID namespace ends with it.

So an unsandboxed server is started with a cookie in its environment
(``COOKIE_VARIABLE``), which its descendants inherit. Once the SDK has spawned it, its
process is found among our children by that cookie, and a ``ProcessTree`` follows it:
its descendants by parent, its session and process group, and every process carrying
the cookie. When the connection has closed (after the SDK's own escalation)
``ServerTree.sweep`` stops what is left: SIGTERM, ``TERM_GRACE_S``, SIGKILL.
``ServerTree.kill`` sends SIGKILL at once, for a shutdown that must not wait.

What this cannot follow (``ProcessTree``'s limits): a process that has left the
server's session *and* does not carry the cookie (started with an environment built
from scratch, ``env -i``, or one that removed the variable) *and* is no longer a
descendant of a tracked process (its parent exited, so it was re-parented to init),
as a double-forked ``setsid`` daemon that drops the cookie is; nor what a server has
another service start for it (``systemd-run``, a container daemon, D-Bus activation),
which is never its descendant. Only a cgroup or a PID namespace (``sandbox``) contains
those. A server whose own process starts by replacing its environment (``exec env
-i …``) may not be found at all; then only the SDK's escalation stops it.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
from typing import Final

from toolkernel.sandbox.tree import ProcessTree, child_with_cookie

__all__ = ["COOKIE_VARIABLE", "TERM_GRACE_S", "ServerTree"]

COOKIE_VARIABLE: Final = "TOOLKERNEL_MCP_SERVER_COOKIE"
"""The environment variable that marks every process of one unsandboxed server."""
TERM_GRACE_S: Final = 2.0
"""How long what a stopped server left running has between SIGTERM and SIGKILL."""

_log = logging.getLogger(__name__)


class ServerTree:
    """The processes of one start of an unsandboxed stdio server.

    Args:
        label: The server, in messages (``MCP server git``).
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self._value = secrets.token_hex(16)
        self._cookie = f"{COOKIE_VARIABLE}={self._value}".encode()
        self._tree: ProcessTree | None = None

    @property
    def environment(self) -> dict[str, str]:
        """What the server's environment must hold for its processes to be found."""
        return {COOKIE_VARIABLE: self._value}

    def spawned(self) -> None:
        """Find the server's process: call it once the SDK has spawned it."""
        # Spawning returns once the server has executed its program: it is our child.
        leader = child_with_cookie(os.getpid(), self._cookie)
        if leader is None:
            _log.info("%s: its process was not found; only the SDK will stop it", self.label)
            return
        self._tree = ProcessTree(leader, cookie=self._cookie)

    def kill(self) -> None:
        """SIGKILL every process of the tree now, the server's own too."""
        if self._tree is not None:
            self._tree.send(signal.SIGKILL)

    async def sweep(self) -> None:
        """Stop what is left of the tree once the server has been stopped: SIGTERM,
        up to ``TERM_GRACE_S``, then SIGKILL. Call it shielded: it is bounded."""
        if self._tree is None:
            return
        if not await self._tree.kill(grace_s=TERM_GRACE_S):
            survivors = sorted(proc.pid for proc in self._tree.members())
            _log.warning("%s left processes that survive SIGKILL: %s", self.label, survivors)

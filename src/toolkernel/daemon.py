"""Blocking work awaited from async code in a daemon thread, which a cancel abandons.

anyio's worker threads are not daemons: one blocked for good (a human at a prompt who
never answers, a write to a pipe nobody reads) would hold the process open after a
cancel, Ctrl-C or SIGTERM, as the interpreter joins them at exit.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

__all__ = ["in_daemon_thread"]

_A = TypeVar("_A")
_R = TypeVar("_R")


async def in_daemon_thread(function: Callable[[_A], _R], argument: _A, *, name: str) -> _R:
    """``function(argument)`` in a daemon thread named ``name``, awaited; its result or
    its exception. A cancel of the awaiting task abandons the thread."""
    token = anyio.lowlevel.current_token()
    answered = anyio.Event()
    outcome: list[_R] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(function(argument))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            failure.append(exc)
        finally:
            with contextlib.suppress(Exception):  # the loop is gone: nobody waits
                anyio.from_thread.run_sync(answered.set, token=token)

    threading.Thread(target=run, name=name, daemon=True).start()
    await answered.wait()
    if failure:
        raise failure[0]
    return outcome[0]

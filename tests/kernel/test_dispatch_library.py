"""Dispatch takes its asyncio-only path (a deadline timer and a token watch that cancel
the task) only where sniffio would say the library is asyncio: another library run
from inside an asyncio task (``trio.run`` in a notebook cell) must not have the
asyncio task around it cancelled, nor its deadline on a loop that is not running."""

from __future__ import annotations

import asyncio

import sniffio

from toolkernel import dispatch


def test_the_task_is_used_when_asyncio_runs_the_call() -> None:
    async def main() -> None:
        assert dispatch._asyncio_task() is asyncio.current_task()

    asyncio.run(main())


def test_a_library_marked_for_this_thread_is_not_taken_for_asyncio() -> None:
    async def main() -> None:
        sniffio.thread_local.name = "trio"  # what trio.run sets while it runs
        try:
            assert dispatch._asyncio_task() is None
            assert sniffio.current_async_library() == "trio"
        finally:
            sniffio.thread_local.name = None

    asyncio.run(main())


def test_a_library_marked_in_the_context_is_not_taken_for_asyncio() -> None:
    async def main() -> None:
        mark = sniffio.current_async_library_cvar.set("curio")
        try:
            assert dispatch._asyncio_task() is None
        finally:
            sniffio.current_async_library_cvar.reset(mark)

    asyncio.run(main())


def test_outside_any_event_loop_there_is_no_task() -> None:
    assert dispatch._asyncio_task() is None

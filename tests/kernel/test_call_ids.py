"""Identifiers the runtime hands out (calls.new_id): fresh, 128 random bits each, never
the same in two threads or in a forked child and its parent."""

from __future__ import annotations

import os
import re
import threading

from toolkernel import calls
from toolkernel.calls import new_id

ID = re.compile(r"call_[0-9a-f]{32}")


def test_ids_are_prefixed_128_bit_hex_and_never_repeat_across_pool_refills() -> None:
    ids = [new_id("call") for _ in range(3 * calls._POOL_BYTES // calls._ID_BYTES + 7)]

    assert all(ID.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_threads_taking_ids_at_once_get_distinct_ids() -> None:
    taken: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(len(taken))

    def take(into: list[str]) -> None:
        start.wait()
        into.extend(new_id("run") for _ in range(2_000))

    threads = [threading.Thread(target=take, args=(into,)) for into in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    every = [i for into in taken for i in into]
    assert len(every) == 16_000
    assert len(set(every)) == len(every)


def test_a_forked_child_does_not_hand_out_its_parents_next_ids() -> None:
    new_id("call")  # the pool is filled and partly used
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.write(write, " ".join(new_id("call") for _ in range(20)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split()
    os.waitpid(pid, 0)
    parent = [new_id("call") for _ in range(20)]

    assert len(child) == 20
    assert not set(child) & set(parent)

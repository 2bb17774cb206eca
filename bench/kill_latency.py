"""Time from a stop request to the whole process tree being gone.

For each of N trees (a shell, a child and a ``setsid`` grandchild that both ignore
SIGTERM, all sleeping), the run is stopped and we time from that moment until
`run_sandboxed` returns, which it does only once ``/proc`` shows none of the tree
alive. A scan for the tree's marker variable afterwards confirms nothing survived.

Rows:

* sandboxed, timeout: latency = ``duration_s - timeout_s`` (an upper bound: it
  also contains the spawn, which starts before the timer);
* sandboxed, cancel event: latency measured from ``cancel.set()`` exactly;
* unsandboxed, cancel event, a tree that obeys SIGTERM (without a PID namespace a
  SIGTERM-ignoring descendant must wait out ``TERM_GRACE_S``, by design).

Usage: ``python bench/kill_latency.py [-n 100]``
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import anyio

from toolkernel.sandbox import TERM_GRACE_S, SandboxSpec, find_bwrap, probe, run_sandboxed

MARKER = "TOOLKERNEL_BENCH_MARKER"
STUBBORN = "echo up; ( trap '' TERM; sleep 1000 ) & ( trap '' TERM; setsid sleep 1000 ) & wait"
POLITE = "echo up; sleep 1000 & setsid sleep 1000 & wait"
TIMEOUT_S = 0.2


def survivors(marker: str) -> int:
    needle = f"{MARKER}={marker}".encode()
    count = 0
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_bytes()
            environ = (entry / "environ").read_bytes()
        except (OSError, NotADirectoryError):
            continue
        if stat[stat.rfind(b")") + 2 :][:1] != b"Z" and needle in environ.split(b"\0"):
            count += 1
    return count


async def one(kind: str, workspace: Path, bwrap: Path) -> float:
    marker = uuid.uuid4().hex
    spec = SandboxSpec(
        workspace=workspace, writable=False, env={"PATH": "/usr/bin:/bin", MARKER: marker}
    )
    out = workspace / marker
    cancel = anyio.Event()
    unsandboxed = kind.startswith("unsandboxed")
    script = POLITE if unsandboxed else STUBBORN
    stopped_at = 0.0

    def on_output(_chunk: bytes) -> None:
        nonlocal stopped_at
        if kind != "sandboxed, timeout" and not cancel.is_set():
            stopped_at = time.perf_counter()
            cancel.set()

    outcome = await run_sandboxed(
        ["sh", "-c", script],
        spec,
        bwrap=bwrap,
        timeout_s=TIMEOUT_S if kind == "sandboxed, timeout" else 30,
        output_dir=out,
        cancel=cancel,
        on_output=on_output,
        unsandboxed=unsandboxed,
    )
    ended = time.perf_counter()
    if left := survivors(marker):
        raise SystemExit(f"{left} processes of a {kind} tree survived")
    if kind == "sandboxed, timeout":
        assert outcome.timed_out
        return outcome.duration_s - TIMEOUT_S
    assert outcome.cancelled
    return ended - stopped_at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=100)
    args = parser.parse_args()
    bwrap = find_bwrap()
    probe(bwrap)
    kinds = ["sandboxed, timeout", "sandboxed, cancel", "unsandboxed, cancel (polite tree)"]
    samples: dict[str, list[float]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="tk-bench-kill-") as root:
        for _ in range(args.n):
            for kind in kinds:
                samples[kind].append(anyio.run(one, kind, Path(root), bwrap))
    print(
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Linux {platform.release()}, Python {platform.python_version()}; "
        f"N={args.n} trees per row, TERM_GRACE_S={TERM_GRACE_S}\n"
    )
    print("| stop → tree gone | p50 ms | p99 ms | max ms | survivors |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for kind, values in samples.items():
        ordered = sorted(values)
        p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        print(
            f"| {kind} | {statistics.median(values) * 1e3:.1f} | {p99 * 1e3:.1f} "
            f"| {ordered[-1] * 1e3:.1f} | 0 |"
        )


if __name__ == "__main__":
    main()

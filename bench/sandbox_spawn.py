"""Spawn cost of the sandbox, and peak memory of the runner under 1 GB of output.

Runs, in one process and interleaved so drift hits all rows alike:

* ``subprocess.run(["true"])`` — the floor for any spawn from Python;
* ``run_sandboxed(["true"], unsandboxed=True)`` — the runner without bubblewrap;
* ``run_sandboxed(["true"])`` — the full sandbox (namespaces, mounts, rlimits).

Then, in a fresh interpreter (so its peak is the runner's own), a sandboxed
``head -c 1G /dev/zero`` stored to disk, reporting VmHWM and ru_maxrss.

Usage: ``python bench/sandbox_spawn.py [-n 200] [--output-bytes 1073741824]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from toolkernel.sandbox import SandboxLimits, SandboxSpec, find_bwrap, probe, run_sandboxed

ENV = {"PATH": "/usr/bin:/bin"}


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    bwrap = find_bwrap()
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, check=True)
    return (
        f"{cpu}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"Python {platform.python_version()}, {version.stdout.strip()} ({bwrap})"
    )


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def spawn_table(n: int) -> str:
    bwrap = find_bwrap()
    probe(bwrap)
    workspace = Path(tempfile.mkdtemp(prefix="tk-bench-"))
    spec = SandboxSpec(workspace=workspace, writable=False, env=ENV)
    counter = iter(range(10**9))

    def runner(unsandboxed: bool) -> Callable[[], None]:
        def once() -> None:
            out = workspace / f"o{next(counter)}"
            outcome = anyio.run(
                lambda: run_sandboxed(
                    ["true"],
                    spec,
                    bwrap=bwrap,
                    timeout_s=30,
                    output_dir=out,
                    unsandboxed=unsandboxed,
                )
            )
            assert outcome.exit_code == 0

        return once

    cases: dict[str, Callable[[], object]] = {
        "subprocess.run(['true'])": lambda: subprocess.run(["true"], check=True),
        "run_sandboxed(unsandboxed=True)": runner(unsandboxed=True),
        "run_sandboxed (bwrap)": runner(unsandboxed=False),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(n):
        for name, case in cases.items():
            started = time.perf_counter()
            case()
            samples[name].append(time.perf_counter() - started)
    base = statistics.median(samples["run_sandboxed(unsandboxed=True)"])
    rows = [
        "| spawn of `true` | median ms | p99 ms | median vs unsandboxed runner |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, values in samples.items():
        median = statistics.median(values)
        rows.append(
            f"| {name} | {median * 1e3:.2f} | {percentile(values, 0.99) * 1e3:.2f} "
            f"| {median / base:.2f}x |"
        )
    return "\n".join(rows)


MEASURE = """
import anyio, json, resource, sys, time
from pathlib import Path
from toolkernel.sandbox import SandboxLimits, SandboxSpec, find_bwrap, run_sandboxed
workspace, size = Path(sys.argv[1]), int(sys.argv[2])
spec = SandboxSpec(workspace=workspace, writable=False, env={"PATH": "/usr/bin:/bin"},
                   limits=SandboxLimits(max_output_bytes=size))
started = time.perf_counter()
outcome = anyio.run(lambda: run_sandboxed(
    ["head", "-c", str(size), "/dev/zero"], spec, bwrap=find_bwrap(), timeout_s=600,
    output_dir=workspace / "out"))
elapsed = time.perf_counter() - started
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"stored": outcome.stdout_path.stat().st_size, "seconds": elapsed,
                  "vmhwm_kib": hwm,
                  "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def rss_table(size: int) -> str:
    with tempfile.TemporaryDirectory(prefix="tk-bench-rss-") as workspace:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(MEASURE), workspace, str(size)],
            capture_output=True,
            text=True,
            check=True,
        )
    result = json.loads(done.stdout)
    mib = 1024
    return "\n".join(
        [
            "| sandboxed `head -c` to disk | stored MiB | seconds | MB/s "
            "| peak RSS (VmHWM) MiB | ru_maxrss MiB |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
            f"| {size} bytes | {result['stored'] / 1024**2:.0f} | {result['seconds']:.2f} "
            f"| {result['stored'] / result['seconds'] / 1e6:.0f} "
            f"| {result['vmhwm_kib'] / mib:.1f} | {result['ru_maxrss_kib'] / mib:.1f} |",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument("--output-bytes", type=int, default=1024**3)
    args = parser.parse_args()
    print(f"Machine: {machine()}\n")
    print(spawn_table(args.n))
    print()
    print(rss_table(args.output_bytes))
    print(
        "\n(VmHWM is the runner's own peak; ru_maxrss also counts the pre-exec image "
        "Linux carries across exec. Limits: " + repr(SandboxLimits()) + ")"
    )


if __name__ == "__main__":
    main()

"""``repo.search`` through the runtime vs raw ``rg --json``, on the same large tree.

Generates (once, cached under the system temp dir) a tree of ~20,000 text files,
~200 MB, then for each query interleaves, round by round:

* raw ripgrep: ``subprocess.run(rg --json …, capture_output=True)`` with exactly the
  flags ``repo.search`` uses (the same forbidden-path globs, ``--no-require-git``);
* ``repo.search`` through a real ``Kernel``: validation, authorization, the ledger,
  bubblewrap, output streamed into the artifact store, parsing, redaction.

The page cache is warmed first, so both read from memory. Target: runtime median
<= 1.3x the raw median.

Usage: ``python bench/search_vs_rg.py [-n 15] [--files 20000] [--file-kb 10]``
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from toolkernel.pathguard import DEFAULT_FORBIDDEN
from toolkernel.testing import make_kernel
from toolkernel.tools import install
from toolkernel.tools.search import find_rg, rg_argv

CONFIG = """
[[exposure]]
tools = ["*"]
"""

WORDS = [
    "client",
    "factory",
    "request",
    "response",
    "handler",
    "config",
    "value",
    "index",
    "buffer",
    "stream",
    "token",
    "parse",
    "render",
    "update",
    "delete",
    "create",
    "session",
    "module",
    "import",
    "return",
    "yield",
    "async",
    "await",
]

QUERIES = (
    ("rare: 'new LegacyClient(' (≈60 hits)", "new LegacyClient("),
    ("common: 'handler stream' (≈thousands of hits)", "handler stream"),
    ("absent: 'zq-no-such-text'", "zq-no-such-text"),
)


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    rg = subprocess.run([find_rg(), "--version"], capture_output=True, text=True, check=True)
    return (
        f"{cpu}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"Python {platform.python_version()}, {rg.stdout.splitlines()[0]}"
    )


def build_tree(files: int, file_kb: int) -> Path:
    root = Path(tempfile.gettempdir()) / f"tk-bench-search-{files}x{file_kb}k"
    marker = root / ".complete"
    if marker.exists():
        return root
    rng = random.Random(42)
    for index in range(files):
        directory = root / f"pkg{index % 100:02d}" / f"mod{index % 7}"
        directory.mkdir(parents=True, exist_ok=True)
        lines = []
        size = 0
        while size < file_kb * 1024:
            line = " ".join(rng.choice(WORDS) for _ in range(10))
            lines.append(line)
            size += len(line) + 1
        if index % 333 == 0:
            lines[len(lines) // 2] = "    client = new LegacyClient(config)"
        (directory / f"file{index}.py").write_text("\n".join(lines) + "\n")
    (root / ".gitignore").write_text("build/\n")
    marker.write_text("ok")
    return root


def tree_size(root: Path) -> tuple[int, int]:
    count = total = 0
    for path in root.rglob("*.py"):
        count += 1
        total += path.stat().st_size
    return count, total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=15)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--file-kb", type=int, default=10)
    args = parser.parse_args()

    root = build_tree(args.files, args.file_kb)
    count, total = tree_size(root)
    kernel = make_kernel(root, CONFIG, workspace_tools=False)
    assert install(kernel) is not None, "bubblewrap must work for this benchmark"
    rg = find_rg()
    run = kernel.start_run()

    async def via_runtime(query: str) -> int:
        result = await kernel.call(run, "repo.search", {"query": query, "maxResults": 50})
        assert result.status.value in ("SUCCEEDED", "PARTIAL"), result.safe_message
        return int(result.structured_output["totalMatches"])

    def via_rg(query: str) -> int:
        argv = rg_argv(rg, query, forbidden=DEFAULT_FORBIDDEN)
        done = subprocess.run(argv, cwd=root, capture_output=True, check=False)
        assert done.returncode in (0, 1)
        return done.stdout.count(b'{"type":"match"')

    rows = [
        "| query | raw `rg --json` median ms | `repo.search` median ms | ratio "
        "| rg p90 ms | runtime p90 ms | matches |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    started = time.perf_counter()
    for label, query in QUERIES:
        via_rg(query)  # warm the page cache and both code paths
        anyio.run(via_runtime, query)
        raw: list[float] = []
        ours: list[float] = []
        matches = 0
        for _ in range(args.n):
            t0 = time.perf_counter()
            matches = via_rg(query)
            raw.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            total_matches = anyio.run(via_runtime, query)
            ours.append(time.perf_counter() - t0)
            assert total_matches == matches, (total_matches, matches)
        rm, om = statistics.median(raw), statistics.median(ours)
        rows.append(
            f"| {label} | {rm * 1e3:.1f} | {om * 1e3:.1f} | {om / rm:.2f}x "
            f"| {p90(raw) * 1e3:.1f} | {p90(ours) * 1e3:.1f} | {matches:,} |"
        )
    kernel.close()
    print(
        f"# repo.search vs raw rg\n\nGenerated by `python bench/search_vs_rg.py -n {args.n}` "
        f"on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; took "
        f"{time.perf_counter() - started:.0f} s.\n\n- machine: {machine()}\n"
        f"- tree: {count:,} files, {total / 1e6:.0f} MB of text (page cache warm); "
        f"{args.n} interleaved rounds per query\n- `repo.search` runs a fresh event loop "
        "per call (`anyio.run`), the full governed path with the SQLite ledger, "
        "bubblewrap, and the rg output stored as an artifact\n\n" + "\n".join(rows)
    )


def p90(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


if __name__ == "__main__":
    sys.exit(main())

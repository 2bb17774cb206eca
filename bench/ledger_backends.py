"""What one tool call's ledger append costs, SQLite next to PostgreSQL, in one run.

Run ``.venv/bin/python bench/ledger_backends.py`` (PostgreSQL server binaries needed:
it starts a private cluster, as the tests do). It prints a markdown report; ``--out
FILE`` also writes it there. A run takes well under a minute.

Each timed operation is one ``append`` of a realistic tool call's three events
(TOOL_CALL_REQUEST, TOOL_CALL_STARTED, TOOL_CALL_RESULT; about 1 KB of canonical JSON
payload in all) to one run, as the kernel's journal writes a read-only call:

* SQLite, ``synchronous="normal"`` and ``"full"``: a WAL file in a temporary directory;
* PostgreSQL over its unix socket, crash-safe server defaults (``fsync=on``,
  ``synchronous_commit=on``): the cached-head fast path (one statement);
* the same with ``synchronous_commit=off`` set through the DSN's ``options``: commits
  return before the WAL flush (a server crash may lose the last ones);
* PostgreSQL, two workers alternating on one run: every append finds its cached head
  stale and takes the head row's lock (the contended path).

Method: rows are measured in interleaved rounds (the order rotates each round), each
after its own warm-up; every append is timed alone with ``perf_counter_ns``. Every
chain is verified afterwards, outside the timed window.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

# The tests' throwaway-cluster helper.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "ledger"))

from pg_cluster import PgCluster

from toolkernel.canonical import canonical_json
from toolkernel.ledger import EventType, Ledger, NewEvent, SqliteLedger
from toolkernel.ledger.postgres import PostgresLedger

CALL = "call_8f2c1e7a9b"
# A commit returns before its WAL is flushed: a server crash may lose the last commits
# (never corrupt), like SQLite's synchronous=normal on power loss.
_ASYNC_COMMIT = "options='-c synchronous_commit=off'"


def tool_call(n: int) -> list[NewEvent]:
    """REQUEST, STARTED and RESULT of one ``repo.search`` call, ~1 KB of payload."""
    request = {
        "toolCallId": f"{CALL}-{n}",
        "stepId": f"step-{n}",
        "toolName": "repo.search",
        "toolVersion": "1.0.0",
        "arguments": {"query": "def authorize(", "path": "src/toolkernel", "maxResults": 20},
        "argumentsHash": "sha256:" + "3f" * 32,
        "requestedAt": "2026-11-29T19:20:01.123456Z",
        "requestedBy": "model:claude",
        "traceContext": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    }
    started = {"executionMode": "SANDBOX_READ_ONLY", "adapter": "ripgrep", "attempt": 1}
    result = {
        "status": "SUCCEEDED",
        "errorCode": None,
        "safeMessage": "20 matches in 7 files (output truncated to the budget).",
        "structuredOutput": {
            "matches": [
                {"path": f"src/toolkernel/m{i}.py", "line": 40 + i, "text": "def authorize(ctx)"}
                for i in range(5)
            ],
            "truncated": True,
        },
        "artifacts": [{"id": "sha256:" + "a1" * 32, "bytes": 18234, "mediaType": "text/plain"}],
        "usage": {"durationMs": 12, "outputBytes": 18234},
        "retryable": False,
    }
    return [
        NewEvent(EventType.TOOL_CALL_REQUEST, request, f"{CALL}-{n}"),
        NewEvent(EventType.TOOL_CALL_STARTED, started, f"{CALL}-{n}"),
        NewEvent(EventType.TOOL_CALL_RESULT, result, f"{CALL}-{n}"),
    ]


class Row:
    """One measured configuration: appends to its own run, alternating its ledgers."""

    def __init__(self, name: str, ledgers: list[Ledger]) -> None:
        self.name = name
        self.ledgers = ledgers
        self.samples: list[int] = []
        self.n = 0

    def measure(self, count: int, *, keep: bool = True) -> None:
        for _ in range(count):
            ledger = self.ledgers[self.n % len(self.ledgers)]
            events = tool_call(self.n)
            start = time.perf_counter_ns()
            ledger.append("bench-run", events)
            elapsed = time.perf_counter_ns() - start
            self.n += 1
            if keep:
                self.samples.append(elapsed)

    def check(self) -> None:
        report = self.ledgers[0].verify()
        if not report.ok or report.events_checked != 3 * self.n:
            raise RuntimeError(f"{self.name}: the chain does not verify: {report}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=2000, help="timed appends per row")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    args = parser.parse_args()

    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp, PgCluster(durable=True) as cluster:
        rows = [
            Row("SQLite, synchronous=normal", [SqliteLedger(Path(tmp) / "normal.db")]),
            Row(
                "SQLite, synchronous=full",
                [SqliteLedger(Path(tmp) / "full.db", synchronous="full")],
            ),
            Row("PostgreSQL, unix socket", [PostgresLedger(cluster.dsn, schema="single")]),
            Row(
                "PostgreSQL, unix socket, synchronous_commit=off (set in the DSN)",
                [PostgresLedger(f"{cluster.dsn} {_ASYNC_COMMIT}", schema="async")],
            ),
            Row(
                "PostgreSQL, 2 workers alternating on one run (stale head every append)",
                [PostgresLedger(cluster.dsn, schema="pair") for _ in range(2)],
            ),
        ]
        for row in rows:
            row.measure(200, keep=False)
        per_round = max(1, args.appends // args.rounds)
        for r in range(args.rounds):
            for row in rows[r % len(rows) :] + rows[: r % len(rows)]:
                row.measure(per_round)
        for row in rows:
            row.check()
        report = render(rows, cluster, tmp, per_round * args.rounds, time.monotonic() - started)
        for row in rows:
            for ledger in row.ledgers:
                ledger.close()
    print(report)
    if args.out:
        args.out.write_text(report + "\n", encoding="utf-8")


def render(rows: list[Row], cluster: PgCluster, tmp: str, count: int, took: float) -> str:
    size = sum(len(canonical_json(e.payload)) for e in tool_call(0))
    base = rows[0].samples
    lines = [
        "# Ledger append cost: SQLite vs PostgreSQL",
        "",
        f"Generated by `.venv/bin/python bench/ledger_backends.py` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. One timed operation is "
        f"one `append` of a tool call's REQUEST + STARTED + RESULT events ({size} bytes "
        f"of canonical JSON payload) to one run; {count:,} timed appends per row in "
        f"interleaved rounds after 200 warm-up appends (run took {took:.0f} s).",
        "",
        *machine(cluster, tmp),
        "",
        "| backend | p50 µs | p99 µs | appends/s | p50 ÷ SQLite normal p50 |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        p50, p99 = _pct(row.samples, 50), _pct(row.samples, 99)
        rate = 1e9 / statistics.fmean(row.samples)
        ratio = p50 / _pct(base, 50)
        lines.append(
            f"| {row.name} | {p50 / 1e3:,.0f} | {p99 / 1e3:,.0f} | {rate:,.0f} | {ratio:.2f} |"
        )
    return "\n".join(lines)


def machine(cluster: PgCluster, tmp: str) -> list[str]:
    cpu = "unknown"
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    versions = ", ".join(
        f"{name} {importlib.metadata.version(name)}" for name in ("toolkernel", "psycopg")
    )
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"- machine: {platform.system()} {platform.machine()}, "
        f"nproc {len(os.sched_getaffinity(0))}, CPU {cpu}",
        f"- Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"{cluster.version}, {versions}",
        f"- storage: SQLite files and the PostgreSQL data directory both on /tmp "
        f"({_filesystem(tmp)})",
        "- PostgreSQL: private cluster, server defaults (fsync=on, synchronous_commit=on), "
        "client in the same machine over the unix socket",
        f"- load average at start (1/5/15 min): {load}; other processes share the machine",
    ]


def _filesystem(path: str) -> str:
    best = ("", "unknown")
    for line in _read("/proc/mounts").splitlines():
        device, mount, fstype = line.split()[:3]
        if path.startswith(mount) and len(mount) > len(best[0]):
            best = (mount, f"{fstype} on {device}")
    return best[1]


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError:
        return ""


def _pct(samples: list[int], pct: int) -> float:
    ordered = sorted(samples)
    return float(ordered[min(len(ordered) - 1, len(ordered) * pct // 100)])


if __name__ == "__main__":
    main()

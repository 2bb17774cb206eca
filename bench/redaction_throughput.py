"""Redaction throughput on realistic tool output, whole-string and streamed.

Generates ~50 MB of mixed output (service logs, Python source from the standard
library, pytest output with tracebacks, a few secrets sprinkled in), then times
``Redactor.redact_text`` on the whole text and ``StreamRedactor`` fed 64 KiB chunks.
Prints a markdown table with the median of several runs and the machine.

    .venv/bin/python bench/redaction_throughput.py [--mb 50] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sysconfig
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from toolkernel.redaction import Redactor, StreamRedactor

WORKSPACE = Path("/work/ws")
CHUNK = 64 * 1024
# Planted secrets (fake, generated shapes) so the secret rules do real work too.
SECRETS = (
    "AKIA" + "QX7RZ3MPLK2VB9TE",
    "ghp_" + "Zq8vN2kLmX4pRt7YbW1cJ9sD3fGh6KaE0uIo",
    "xoxb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z",
)


def log_lines(rng: random.Random) -> Iterator[str]:
    levels = ("INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR")
    paths = ("/api/v1/items", "/api/v1/users/42", "/healthz", "/static/app.js")
    while True:
        i = rng.randrange(10**9)
        yield (
            f"2025-06-01T12:{i % 60:02d}:{i % 59:02d}.{i % 997:03d}Z {rng.choice(levels)} "
            f"worker-{i % 8} request_id={i:x}-{i % 7919:04x} method=GET path={rng.choice(paths)} "
            f"status={rng.choice((200, 200, 201, 404, 500))} duration_ms={i % 900} "
            f'user_agent="python-httpx/0.28" file={WORKSPACE}/src/app/handlers.py:{i % 400}\n'
        )


def pytest_output(rng: random.Random) -> Iterator[str]:
    while True:
        n = rng.randrange(1000)
        yield f"tests/test_module_{n % 40}.py::test_case_{n} PASSED{' ' * 20}[{n % 100:3d}%]\n"
        if n % 25 == 0:
            yield (
                f"___________________ test_case_{n} ___________________\n\n"
                f"    def test_case_{n}():\n"
                f"        result = compute({n})\n"
                f">       assert result == {n + 1}\n"
                f"E       assert {n} == {n + 1}\n\n"
                f"tests/test_module_{n % 40}.py:{n % 300}: AssertionError\n"
                "Traceback (most recent call last):\n"
                f'  File "/usr/lib/python3.11/site-packages/app/core.py", line {n}, in compute\n'
                "    return helper(x)\n"
                f'  File "{WORKSPACE}/src/app/helpers.py", line 12, in helper\n'
                "    raise ValueError(x)\n"
                f"ValueError: {n}\n"
            )


def python_source() -> str:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))[:120]
    return "".join(f.read_text(encoding="utf-8", errors="replace") for f in files)


def generate(megabytes: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    source = python_source()
    logs, tests = log_lines(rng), pytest_output(rng)
    parts: list[str] = []
    size = 0
    target = megabytes * 1_000_000
    while size < target:
        kind = rng.random()
        if kind < 0.45:
            block = "".join(next(logs) for _ in range(200))
        elif kind < 0.75:
            start = rng.randrange(len(source) - 40_000)
            block = source[start : start + 40_000]
        else:
            block = "".join(next(tests) for _ in range(200))
        if rng.random() < 0.2:
            block += f"export TOKEN={rng.choice(SECRETS)}\n"
        parts.append(block)
        size += len(block)
    return "".join(parts)


def median_seconds(run: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    text = generate(args.mb)
    size_mb = len(text.encode()) / 1e6
    redactor = Redactor(WORKSPACE, secrets=["s3cr3t-injected-value-1234"])
    counts: Counter[str] = Counter()
    redacted = redactor.redact_text(text, counts)
    assert all(secret not in redacted for secret in SECRETS)

    def whole() -> object:
        return redactor.redact_text(text, Counter())

    encoded = text.encode()

    def streamed() -> object:
        stream = StreamRedactor(redactor)
        chunks = (encoded[i : i + CHUNK] for i in range(0, len(encoded), CHUNK))
        return sum(len(part) for part in stream.redact_chunks(chunks))

    rows = [
        ("Redactor.redact_text (whole string)", whole),
        ("StreamRedactor, 64 KiB chunks", streamed),
    ]
    cpu = platform.processor() or platform.machine()
    print(
        f"Machine: {cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}"
    )
    print(f"Input: {size_mb:.1f} MB of mixed output; median of {args.runs} runs\n")
    print("| mode | median s | MB/s |")
    print("| --- | ---: | ---: |")
    for name, run in rows:
        seconds = median_seconds(run, args.runs)
        print(f"| {name} | {seconds:.2f} | {size_mb / seconds:.1f} |")
    print(f"\nRedactions in one pass: {dict(sorted(counts.items()))}")


if __name__ == "__main__":
    main()

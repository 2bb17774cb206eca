"""Choose the JSON Schema 2020-12 validator by measuring: correctness, then speed.

Run ``python bench/validators.py``. It prints a markdown report and writes the same
text to ``bench/results/validators.md``. Libraries compared:

* ``jsonschema`` (pure Python, ``Draft202012Validator``),
* ``jsonschema-rs`` (Rust, ``validator_for``, 2020-12 unless ``$schema`` says otherwise),
* ``fastjsonschema`` (generated Python code; implements drafts 4/6/7 and part of
  2019-09, not 2020-12; run in its default, most recent mode).

Correctness uses the required (non-``optional/``) tests of the official JSON Schema
Test Suite for draft 2020-12, with the suite's remotes loaded from disk: every library
gets a resolver that answers from those files and refuses anything else, so nothing
touches the network. Speed uses a realistic tool input schema (``repo.search``).
Timings are per single call (``perf_counter_ns`` around each call, minus the
measured timer overhead), after a warm-up; a run takes well under two minutes.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastjsonschema
import jsonschema
import jsonschema_rs
import referencing
import referencing.jsonschema

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT.parent / "shared" / "corpora" / "json-schema-test-suite"
TESTS = SUITE / "tests-draft2020-12"
REMOTES = SUITE / "remotes"
REMOTE_BASE = "http://localhost:1234/"
RESULT = ROOT / "bench" / "results" / "validators.md"

# A typical tool input schema: what the model's arguments are checked against per call.
REPO_SEARCH = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["query"],
    "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": 500},
        "pathGlobs": {
            "type": "array",
            "items": {"type": "string", "maxLength": 200},
            "maxItems": 20,
        },
        "maxResults": {"type": "integer", "minimum": 1, "maximum": 200},
        "mode": {"enum": ["literal", "regex", "word"]},
        "caseSensitive": {"type": "boolean"},
    },
}
VALID = {
    "query": "def compile_schema",
    "pathGlobs": ["src/**/*.py", "tests/**/*.py"],
    "maxResults": 50,
    "mode": "literal",
    "caseSensitive": True,
}
# Several violations at once: the realistic shape of a confused model's call.
INVALID = {
    "query": "x" * 600,
    "pathGlobs": ["src/**"] * 25,
    "maxResults": 0,
    "mode": "fuzzy",
    "recursive": True,
}


# ---------------------------------------------------------------- correctness


@dataclass
class Tally:
    passed: int = 0
    failed: int = 0
    compile_error_groups: int = 0
    compile_error_tests: int = 0
    validate_errors: int = 0
    # "file::group::test (how)" for every test not passed, to name them in the report.
    problems: list[str] = field(default_factory=list)


def load_remotes() -> dict[str, Any]:
    remotes = {}
    for path in sorted(REMOTES.rglob("*.json")):
        relative = path.relative_to(REMOTES).as_posix()
        # remotes/v1/ is the next, unreleased dialect; no draft 2020-12 test uses it.
        if not relative.startswith("v1/"):
            remotes[REMOTE_BASE + relative] = json.loads(path.read_text(encoding="utf-8"))
    return remotes


def required_groups() -> Iterator[dict[str, Any]]:
    """Groups of the top-level files (``optional/`` excluded), tagged with their file."""
    for path in sorted(TESTS.glob("*.json")):
        for group in json.loads(path.read_text(encoding="utf-8")):
            yield {**group, "file": path.name}


Validate = Callable[[Any], bool]
Compiler = Callable[[Any], Validate]


def run_suite(compile_: Compiler) -> Tally:
    tally = Tally()
    for group in required_groups():
        prefix = f"{group['file']}::{group['description']}"
        try:
            validate = compile_(group["schema"])
        except Exception as exc:
            tally.compile_error_groups += 1
            tally.compile_error_tests += len(group["tests"])
            tally.problems.append(f"{prefix} (compile error: {type(exc).__name__})")
            continue
        for test in group["tests"]:
            case = f"{prefix}::{test['description']}"
            try:
                ok = validate(test["data"]) == test["valid"]
            except Exception as exc:
                tally.validate_errors += 1
                tally.problems.append(f"{case} (raised {type(exc).__name__}: {exc})")
                continue
            if ok:
                tally.passed += 1
            else:
                tally.failed += 1
                tally.problems.append(f"{case} (wrong answer)")
    return tally


def problem_notes(name: str, tally: Tally) -> list[str]:
    """Name each problem when there are few; otherwise count them per suite file."""
    if not tally.problems:
        return []
    if len(tally.problems) <= 10:
        return [f"- {name}: " + "; ".join(f"`{p}`" for p in tally.problems)]
    per_file = Counter(p.split("::", 1)[0] for p in tally.problems)
    counts = ", ".join(f"{file} {n}" for file, n in per_file.most_common())
    return [f"- {name}, cases or groups not passed per file: {counts}"]


def rs_compiler(remotes: Mapping[str, Any]) -> Compiler:
    registry = jsonschema_rs.Registry(list(remotes.items()))

    def compile_(schema: Any) -> Validate:
        return jsonschema_rs.validator_for(schema, registry=registry, offline=True).is_valid

    return compile_


def py_compiler(remotes: Mapping[str, Any]) -> Compiler:
    spec = referencing.jsonschema.DRAFT202012
    registry: referencing.Registry[Any] = referencing.Registry().with_resources(
        (uri, referencing.Resource.from_contents(doc, default_specification=spec))
        for uri, doc in remotes.items()
    )

    def compile_(schema: Any) -> Validate:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        return cls(schema, registry=registry).is_valid

    return compile_


class OfflineHandlers(Mapping[str, Callable[[str], Any]]):
    """fastjsonschema handlers claiming every URI scheme, so it never calls urlopen."""

    def __init__(self, remotes: Mapping[str, Any]) -> None:
        self._remotes = remotes

    def __getitem__(self, scheme: str) -> Callable[[str], Any]:
        return self._load

    def __contains__(self, scheme: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def _load(self, uri: str) -> Any:
        if uri not in self._remotes:
            raise LookupError(f"refusing to fetch {uri}")
        return self._remotes[uri]


def fast_compiler(remotes: Mapping[str, Any]) -> Compiler:
    handlers = OfflineHandlers(remotes)

    def compile_(schema: Any) -> Validate:
        # use_formats=False: 2020-12 treats format as an annotation.
        check = fastjsonschema.compile(schema, handlers=handlers, use_formats=False)

        def validate(instance: Any) -> bool:
            try:
                check(instance)
            except fastjsonschema.JsonSchemaValueException:
                return False
            return True

        return validate

    return compile_


# ---------------------------------------------------------------- speed


@dataclass(frozen=True)
class Timing:
    median_ns: float
    p99_ns: float
    calls: int

    def cell(self) -> str:
        return f"{fmt_ns(self.median_ns)} / {fmt_ns(self.p99_ns)}"


def timer_overhead_ns() -> float:
    samples = []
    for _ in range(20_000):
        t0 = time.perf_counter_ns()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples)


def measure(
    fn: Callable[[], object], *, overhead: float, budget_s: float, max_calls: int
) -> Timing:
    for _ in range(min(50, max_calls)):
        fn()
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    clock = time.perf_counter_ns
    while len(samples) < max_calls and (len(samples) < 50 or time.perf_counter() < deadline):
        t0 = clock()
        fn()
        samples.append(max(clock() - t0 - overhead, 0.0))
    samples.sort()
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    return Timing(statistics.median(samples), p99, len(samples))


def fmt_ns(ns: float) -> str:
    return f"{ns:,.0f}"


def swallow(check: Callable[[Any], object], instance: Any) -> Callable[[], bool]:
    """A fastjsonschema call that reports invalid instead of raising."""

    def call() -> bool:
        try:
            check(instance)
        except fastjsonschema.JsonSchemaValueException:
            return False
        return True

    return call


def all_errors_fast(check: Callable[[Any], object], instance: Any) -> Callable[[], object]:
    def call() -> object:
        try:
            check(instance)
        except fastjsonschema.JsonSchemaValueException as exc:
            return [exc]
        return []

    return call


def speed_rows(overhead: float) -> list[tuple[str, dict[str, Timing]]]:
    schema = REPO_SEARCH
    rs = jsonschema_rs.validator_for(schema)
    py = jsonschema.Draft202012Validator(schema)
    fast = fastjsonschema.compile(schema, use_formats=False)
    # Timing a validator that gives the wrong answer would compare nothing.
    answers = [
        (rs.is_valid(VALID), py.is_valid(VALID), swallow(fast, VALID)()),
        (rs.is_valid(INVALID), py.is_valid(INVALID), swallow(fast, INVALID)()),
    ]
    if answers != [(True, True, True), (False, False, False)]:
        sys.exit(f"validators disagree on the bench instances: {answers}")

    def py_compile() -> object:
        # jsonschema builds lazily; checking the schema is the work the others do up front.
        jsonschema.Draft202012Validator.check_schema(schema)
        return jsonschema.Draft202012Validator(schema)

    cases: list[tuple[str, dict[str, Callable[[], object]], float, int]] = [
        (
            "compile (incl. meta-schema check; fastjsonschema: code generation)",
            {
                "jsonschema-rs": lambda: jsonschema_rs.validator_for(schema),
                "jsonschema": py_compile,
                "fastjsonschema": lambda: fastjsonschema.compile(schema, use_formats=False),
            },
            1.5,
            3_000,
        ),
        (
            "is_valid, valid instance",
            {
                "jsonschema-rs": lambda: rs.is_valid(VALID),
                "jsonschema": lambda: py.is_valid(VALID),
                "fastjsonschema": swallow(fast, VALID),
            },
            1.0,
            50_000,
        ),
        (
            "is_valid, invalid instance",
            {
                "jsonschema-rs": lambda: rs.is_valid(INVALID),
                "jsonschema": lambda: py.is_valid(INVALID),
                "fastjsonschema": swallow(fast, INVALID),
            },
            1.0,
            50_000,
        ),
        (
            "all errors, invalid instance (fastjsonschema: first error only)",
            {
                "jsonschema-rs": lambda: list(rs.iter_errors(INVALID)),
                "jsonschema": lambda: list(py.iter_errors(INVALID)),
                "fastjsonschema": all_errors_fast(fast, INVALID),
            },
            1.0,
            50_000,
        ),
    ]
    rows = []
    for label, fns, budget, max_calls in cases:
        timings = {
            name: measure(fn, overhead=overhead, budget_s=budget, max_calls=max_calls)
            for name, fn in fns.items()
        }
        rows.append((label, timings))
    return rows


def wrapper_rows(overhead: float) -> list[tuple[str, Timing]]:
    """The same operations through toolkernel.schema, to show what the wrapper costs."""
    try:
        from toolkernel.schema import compile_schema
    except ImportError:  # run outside the project's environment
        return []
    compiled = compile_schema(REPO_SEARCH)
    fns: list[tuple[str, Callable[[], object], float, int]] = [
        ("compile_schema (meta-schema check on)", lambda: compile_schema(REPO_SEARCH), 1.5, 3_000),
        ("is_valid, valid instance", lambda: compiled.is_valid(VALID), 1.0, 50_000),
        ("is_valid, invalid instance", lambda: compiled.is_valid(INVALID), 1.0, 50_000),
        ("errors(limit=20), invalid instance", lambda: compiled.errors(INVALID), 1.0, 50_000),
    ]
    return [
        (label, measure(fn, overhead=overhead, budget_s=budget, max_calls=n))
        for label, fn, budget, n in fns
    ]


# ---------------------------------------------------------------- report


def machine() -> list[str]:
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = ", ".join(
        f"{dist} {importlib.metadata.version(dist)}"
        for dist in ("jsonschema-rs", "jsonschema", "fastjsonschema")
    )
    return [
        f"- machine: {platform.system()} {platform.machine()}, "
        f"nproc {len(os.sched_getaffinity(0))}, "
        f"CPU {cpu}",
        f"- Python {platform.python_version()} ({sys.implementation.name})",
        f"- libraries: {versions}",
    ]


def report() -> str:
    started = time.perf_counter()
    remotes = load_remotes()
    groups = list(required_groups())
    total = sum(len(group["tests"]) for group in groups)
    compilers: list[tuple[str, str, Compiler]] = [
        ("jsonschema-rs", "`validator_for` (2020-12 default)", rs_compiler(remotes)),
        ("jsonschema", "`validator_for`, default `Draft202012Validator`", py_compiler(remotes)),
        ("fastjsonschema", "default (draft 2019-09 subset), formats off", fast_compiler(remotes)),
    ]
    lines = [
        "# JSON Schema validators for toolkernel",
        "",
        "Generated by `python bench/validators.py`.",
        "",
        *machine(),
        "",
        f"## Correctness: JSON Schema Test Suite, draft 2020-12, required tests "
        f"({len(groups)} groups, {total} tests)",
        "",
        "Remotes are served from disk; a group whose schema does not compile counts all "
        "its tests as not passed.",
        "",
        "| library | mode | passed | failed | compile errors (groups / tests) "
        "| raised while validating | pass rate |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    notes: list[str] = []
    for name, mode, compile_ in compilers:
        tally = run_suite(compile_)
        notes += problem_notes(name, tally)
        lines.append(
            f"| {name} | {mode} | {tally.passed} | {tally.failed} | "
            f"{tally.compile_error_groups} / {tally.compile_error_tests} | "
            f"{tally.validate_errors} | {tally.passed / total:.1%} |"
        )

    if notes:
        lines += ["", "Not passed:", "", *notes]
    overhead = timer_overhead_ns()
    lines += [
        "",
        "## Speed: `repo.search` input schema",
        "",
        "Nanoseconds per single call, median / p99 (timer overhead of "
        f"{overhead:.0f} ns subtracted). Ratio = that library's median over "
        "jsonschema-rs's median (higher is slower).",
        "",
        "| operation | jsonschema-rs | jsonschema | ratio | fastjsonschema | ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, timings in speed_rows(overhead):
        base = timings["jsonschema-rs"].median_ns or 1.0
        cells = [timings["jsonschema-rs"].cell()]
        for name in ("jsonschema", "fastjsonschema"):
            cells += [timings[name].cell(), f"{timings[name].median_ns / base:.1f}x"]
        lines.append(f"| {label} | {' | '.join(cells)} |")

    wrapped = wrapper_rows(overhead)
    if wrapped:
        lines += [
            "",
            "## The chosen library through `toolkernel.schema`",
            "",
            "| operation | median / p99 ns |",
            "| --- | ---: |",
            *(f"| {label} | {timing.cell()} |" for label, timing in wrapped),
        ]
    lines += ["", f"Total bench time: {time.perf_counter() - started:.1f} s.", ""]
    return "\n".join(lines)


def main() -> None:
    if not TESTS.is_dir():
        sys.exit(f"JSON Schema Test Suite not found at {SUITE}")
    # jsonschema warns about unknown $schema values and fastjsonschema about odd
    # schemas in the suite; the counts above are the result, not the warnings.
    warnings.simplefilter("ignore")
    text = report()
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()

"""``toolkernel demo``: the seed's end-to-end example and failure drills, for real.

A sample repository is written to a temporary folder, a kernel with the built-in
workspace tools (bubblewrap sandbox, ripgrep) is started on it, and each scenario is
proposed as a model would propose it. The projections the model would see are printed,
then the ledger that recorded all of it, and the ledger's verification.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from toolkernel.calls import ToolCallResult
from toolkernel.config import CONFIG_FILENAME, load_config
from toolkernel.kernel import Kernel
from toolkernel.run import Run

__all__ = ["run_demo", "write_sample_repository"]

DEMO_CONFIG = """
# The demo's policy: a developer profile while EDITING; network stays off.
[run]
state = "EDITING"
profile = "developer"

[policy]
write_scope = ["service-a/**"]

[[exposure]]
tools = ["*"]
"""

_FILES = {
    "service-a/pom.xml": "<project><artifactId>service-a</artifactId></project>\n",
    "service-a/src/main/java/com/acme/ClientFactory.java": """\
        package com.acme;

        public class ClientFactory {
            public LegacyClient create(ClientConfig config) {
                return new LegacyClient(config);
            }

            public LegacyClient createDefault() {
                return new LegacyClient(ClientConfig.defaults());
            }
        }
        """,
    "service-a/src/main/java/com/acme/Reports.java": """\
        package com.acme;

        class Reports {
            private final LegacyClient client = new LegacyClient(ClientConfig.defaults());
        }
        """,
    "service-a/src/test/java/com/acme/ClientFactoryTest.java": """\
        package com.acme;

        class ClientFactoryTest {
            LegacyClient client = new LegacyClient(new ClientConfig("test"));
        }
        """,
    "service-b/src/main/java/com/acme/Billing.java": """\
        package com.acme;

        class Billing {
            LegacyClient client = new LegacyClient(ClientConfig.defaults());
        }
        """,
    "README.md": "# sample\nThe LegacyClient constructor is deprecated; use ClientFactory.\n",
    ".env": "DATABASE_PASSWORD=hunter2-not-for-models\n",
}


def write_sample_repository(root: Path) -> None:
    """The repository of the seed's example: Java services using LegacyClient."""
    for relative, text in _FILES.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    (root / CONFIG_FILENAME).write_text(DEMO_CONFIG.lstrip(), encoding="utf-8")


def run_demo(*, keep: bool = False, out: TextIO | None = None) -> int:
    """Run every scenario; returns 0 when each behaved as the seed expects, else 1."""
    out = out or sys.stdout
    root = Path(tempfile.mkdtemp(prefix="toolkernel-demo-"))
    try:
        write_sample_repository(root)
        return _scenarios(root, out)
    finally:
        if keep:
            print(f"\nThe sample repository is kept at {root}", file=out)
        else:
            shutil.rmtree(root, ignore_errors=True)


def _scenarios(root: Path, out: TextIO) -> int:
    from toolkernel.cli import print_ledger_table
    from toolkernel.definition import ExecutionMode

    config = load_config(root / CONFIG_FILENAME)
    checks: list[tuple[str, bool]] = []
    with Kernel(config) as kernel:
        sandbox = ExecutionMode.PROCESS in kernel.adapters
        run = kernel.start_run()
        shown = kernel.expose(run)
        _say(out, f"Workspace: {root}")
        _say(
            out, f"Sandbox: {'bubblewrap' if sandbox else 'UNAVAILABLE (sandboxed tools refused)'}"
        )
        _say(out, "Tools shown to the model: " + ", ".join(d.name for d in shown))

        def propose(
            title: str,
            tool: str,
            arguments: Any,
            expect: Callable[[ToolCallResult], bool],
            **fields: Any,
        ) -> ToolCallResult:
            _heading(out, title)
            _say(out, f"model proposes: {tool} {json.dumps(arguments)}")
            result = kernel.call_sync(run, tool, arguments, **fields)
            _say(out, "model sees:")
            _say(out, textwrap.indent(json.dumps(result.projection(), indent=2), "  "))
            passed = expect(result)
            checks.append((title, passed))
            _say(out, "=> as expected" if passed else "=> NOT as expected")
            return result

        for scenario in _SCENARIOS:
            scenario(propose, run)

        _heading(out, "The ledger")
        print_ledger_table(kernel.ledger.events(run.id), out=out)
        report = kernel.ledger.verify(run.id)
        checks.append(("ledger verifies", report.ok))
        _say(
            out,
            f"\nledger verify: {report.events_checked} events, "
            f"{'intact' if report.ok else 'BROKEN'}",
        )
    _heading(out, "Summary")
    for title, passed in checks:
        _say(out, f"  {'ok ' if passed else 'FAIL'}  {title}")
    return 0 if all(passed for _, passed in checks) else 1


Propose = Callable[..., ToolCallResult]


def _end_to_end(propose: Propose, run: Run) -> None:
    propose(
        "Section 26: find usages of the deprecated LegacyClient constructor",
        "repo.search",
        {"query": "new LegacyClient(", "pathGlobs": ["**/*.java"], "maxResults": 50},
        lambda r: r.status == "SUCCEEDED" and len(r.structured_output["matches"]) == 5,
    )


def _drill_extra_argument(propose: Propose, run: Run) -> None:
    propose(
        "Drill 1: the model sends an extra argument",
        "repo.search",
        {"query": "LegacyClient", "sendSecrets": True},
        lambda r: r.status == "INVALID_ARGUMENTS" and r.error_code == "UNKNOWN_PROPERTY",
    )


def _drill_outside_workspace(propose: Propose, run: Run) -> None:
    propose(
        "Drill 2: the model reads a path outside the workspace",
        "file.read",
        {"path": "../../../../etc/passwd"},
        lambda r: r.status == "INVALID_ARGUMENTS" and r.error_code == "PATH_TRAVERSAL",
    )


def _drill_timeout(propose: Propose, run: Run) -> None:
    hang = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "if os.fork() == 0:\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    time.sleep(3600)\n"
        "print('building index... 40%', flush=True)\n"
        "time.sleep(3600)\n"
    )
    propose(
        "Drill 3: a command hangs (and ignores SIGTERM, with a child that does too)",
        "shell.run",
        {"argv": ["python3", "-c", hang], "timeoutMs": 1500},
        lambda r: r.status == "TIMED_OUT" and bool(r.artifacts),
    )


def _redaction(propose: Propose, run: Run) -> None:
    leak = (
        "print('connecting with key AKIA' + 'IOSFODNN7EXAMPLE')\n"
        "print('token=ghp_' + 'A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8')\n"
    )
    propose(
        "Redaction: a command prints credentials",
        "shell.run",
        {"argv": ["python3", "-c", leak]},
        lambda r: (
            "AKIAIOSFODNN7EXAMPLE" not in json.dumps(r.projection())
            and "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8" not in json.dumps(r.projection())
        ),
    )


_SCENARIOS = (
    _end_to_end,
    _drill_extra_argument,
    _drill_outside_workspace,
    _drill_timeout,
    _redaction,
)


def _heading(out: TextIO, title: str) -> None:
    print(f"\n== {title} ==", file=out)


def _say(out: TextIO, text: str) -> None:
    print(text, file=out)

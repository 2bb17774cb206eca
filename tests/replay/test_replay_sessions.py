"""``toolkernel replay`` on the recorded 50-call sessions in ``data/``.

Each session is one coding agent's work on the small ``calc`` project written below
(make ``mean`` and ``divide`` reject bad input, add tests, add a median), recorded in
one provider's format: OpenAI Chat Completions, OpenAI Responses, Anthropic Messages.
The three hold the same 50 calls, planted bad ones included, except call 20, whose
arguments are malformed in the way each format allows.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import Message
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from toolkernel.codes import ErrorCode, Status
from toolkernel.ledger import EventType, SqliteLedger
from toolkernel.replay_cli import EXIT_OK, run_replay

DATA = Path(__file__).parent / "data"
SESSIONS = {
    "openai_chat_session": ChatCompletion,
    "openai_responses_session": Response,
    "anthropic_session": Message,
}
WORKSPACE_FILES: dict[str, str] = {
    "README.md": (
        "# calc\n\nSmall arithmetic helpers used by the reporting service.\n\n"
        "Run the tests with `PYTHONPATH=src python3 -m unittest discover -s tests`.\n"
    ),
    "pyproject.toml": '[project]\nname = "calc"\nversion = "0.3.0"\nrequires-python = ">=3.11"\n',
    "src/calc/__init__.py": '"""Arithmetic helpers."""\n\nfrom calc.ops import add, divide, mean\n',
    "src/calc/ops.py": (
        '"""Arithmetic helpers used by the reporting service."""\n\n\n'
        "def add(a: float, b: float) -> float:\n"
        '    """The sum of two numbers."""\n'
        "    return a + b\n\n\n"
        "def divide(a: float, b: float) -> float:\n"
        '    """a divided by b."""\n'
        "    return a / b\n\n\n"
        "def mean(values: list[float]) -> float:\n"
        '    """The arithmetic mean of values."""\n'
        "    return sum(values) / len(values)\n"
    ),
    "tests/test_ops.py": (
        "import unittest\n\nfrom calc import add, divide, mean\n\n\n"
        "class OpsTest(unittest.TestCase):\n"
        "    def test_add(self) -> None:\n"
        "        self.assertEqual(add(2, 3), 5)\n\n"
        "    def test_divide(self) -> None:\n"
        "        self.assertEqual(divide(6, 3), 2)\n\n"
        "    def test_mean(self) -> None:\n"
        "        self.assertEqual(mean([1, 2, 3]), 2)\n"
    ),
    ".env": "REPORTING_API_TOKEN=rpt_live_7f3a9c1e5b2d8046\n",
    "toolkernel.toml": (
        '[run]\nstate = "EDITING"\nprofile = "developer"\n\n'
        '[policy]\nwrite_scope = ["src", "src/**", "tests", "tests/**"]\n\n'
        '[[exposure]]\ntools = ["*"]\n'
    ),
}

A, N, D, INV = "ALLOWED", "NEEDS_APPROVAL", "DENIED", "INVALID_ARGUMENTS"
# Call by call: the tool, the dry-run verdict, and the error code of a refusal.
EXPECTED: list[tuple[str, str, str | None]] = [
    ("repo.search", A, None),
    ("repo.search", A, None),
    ("file.read", A, None),
    ("file.read", A, None),
    ("file.read", A, None),
    ("file.read", INV, "FORBIDDEN_PATH"),  # .env
    ("file.read", INV, "PATH_TRAVERSAL"),  # ../../etc/passwd
    ("shell.run", A, None),
    ("file.patch", A, None),
    ("file.patch", A, None),  # a stale baseHash: only running it can tell
    ("file.read", A, None),
    ("file.patch", A, None),
    ("file.patch", A, None),
    ("shell.run", A, None),
    ("file.patch", D, "WRITE_SCOPE_DENIED"),  # README.md
    ("shell.run", INV, "COMMAND_NOT_ALLOWED"),  # curl
    ("repo.search", A, None),
    ("repo.search", A, None),
    ("file.read", INV, "UNKNOWN_PROPERTY"),
    ("file.read", INV, "<per format>"),
    ("web__search", D, "UNKNOWN_TOOL"),
    ("shell.run", A, None),
    ("shell.run", N, None),  # git push
    ("file.read", A, None),
    ("file.read", A, None),
    ("file.patch", A, None),
    ("file.read", INV, "ABSOLUTE_PATH"),
    ("repo.search", INV, "OUT_OF_BOUNDS"),  # an empty query
    ("shell.run", A, None),
    ("file.read", A, None),
    ("file.patch", A, None),
    ("file.patch", A, None),
    ("shell.run", A, None),
    ("repo.search", A, None),
    ("repo.search", A, None),
    ("file.read", A, None),
    ("file.patch", INV, "PATH_TRAVERSAL"),  # src/../../scratch.py
    ("shell.run", INV, "COMMAND_NOT_ALLOWED"),  # sudo
    ("policy.explain", A, None),
    ("file.read", INV, "TYPE_MISMATCH"),  # maxBytes as a string
    ("file.patch", A, None),
    ("shell.run", A, None),
    ("file.read", A, None),  # a file that does not exist: only running it can tell
    ("repo.search", A, None),
    ("shell.run", N, None),  # rm -rf build
    ("file.read", A, None),
    ("file.read", A, None),
    ("verifier.run", A, None),
    ("shell.run", A, None),
    ("repo.search", INV, "OUT_OF_BOUNDS"),  # maxResults 500
]
CALL_20 = {
    "openai_chat_session": "ARGUMENTS_NOT_JSON",  # truncated
    "openai_responses_session": "DUPLICATE_KEY",  # "path" twice
    "anthropic_session": "MISSING_PROPERTY",  # no "path"
}
UNITTEST_RUNS = (8, 14, 29, 33, 49)  # 1-based call numbers


def expected(session: str) -> list[tuple[str, str, str | None]]:
    table = list(EXPECTED)
    table[19] = ("file.read", INV, CALL_20[session])
    return table


@pytest.fixture
def calc(tmp_path: Path) -> Path:
    root = tmp_path / "calc"
    for relative, text in WORKSPACE_FILES.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def replay(session: str, workspace: Path, **options: Any) -> list[dict[str, Any]]:
    out, err = io.StringIO(), io.StringIO()
    code = run_replay(DATA / f"{session}.jsonl", workspace=workspace, out=out, err=err, **options)
    assert (code, err.getvalue()) == (EXIT_OK, "")
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.mark.parametrize(("session", "model"), SESSIONS.items())
def test_every_recorded_line_is_the_providers_own_response_type(session, model):
    lines = (DATA / f"{session}.jsonl").read_text(encoding="utf-8").splitlines()

    for line in lines:
        model.model_validate_json(line)
    assert len(lines) == 43  # 42 turns with tool calls, then the final answer


@pytest.mark.parametrize("session", SESSIONS)
def test_dry_run_reports_every_calls_verdict_and_why(session, calc):
    rows = replay(session, calc, dry_run=True)

    assert [(r["toolName"], r["verdict"], r["errorCode"]) for r in rows] == expected(session)
    assert Counter(r["verdict"] for r in rows) == {A: 35, INV: 11, D: 2, N: 2}
    assert all(r["safeMessage"] for r in rows)


@pytest.mark.parametrize("session", SESSIONS)
def test_dry_run_executes_nothing_and_leaves_no_trace(session, calc):
    before = snapshot(calc)

    replay(session, calc, dry_run=True)

    assert snapshot(calc) == before  # no patch, no command output, no ledger


@pytest.mark.parametrize("session", SESSIONS)
def test_dry_run_rows_are_stable_and_name_the_providers_calls(session, calc):
    rows = replay(session, calc, dry_run=True)

    keys = [
        "line", "toolName", "providerCallId", "verdict", "toolCallId", "status",
        "errorCode", "safeMessage", "structuredOutput", "artifacts", "retryable",
    ]  # fmt: skip
    assert all(list(r) == keys for r in rows)
    assert all(r["providerCallId"] == r["toolCallId"] for r in rows)
    assert len({r["providerCallId"] for r in rows}) == 50
    assert [r["line"] for r in rows[:6]] == [1, 1, 2, 2, 2, 3]
    for row in rows:
        refused = row["verdict"] in (D, INV)
        assert row["status"] == (row["verdict"] if refused else None)
        assert (row["structuredOutput"], row["artifacts"]) == (None, [])
    assert replay(session, calc, dry_run=True) == rows  # the same file, the same output


def test_dry_run_says_why_a_command_needs_approval(calc):
    rows = replay("openai_chat_session", calc, dry_run=True)

    assert "git push origin HEAD" in rows[22]["safeMessage"]
    assert "No approver is connected" in rows[22]["safeMessage"]


@pytest.mark.parametrize("session", SESSIONS)
def test_replay_runs_the_session_against_the_workspace(session, calc):
    rows = replay(session, calc)

    outcome = [(r["status"], r["errorCode"]) for r in rows]
    # What the dry run refused, the real run refuses the same way...
    for (_, verdict, code), (status, error) in zip(expected(session), outcome, strict=True):
        if verdict in (D, INV):
            assert (status, error) == (verdict, code)
        elif verdict == N:
            assert (status, error) == (Status.DENIED, ErrorCode.APPROVAL_REQUIRED)
    # ...and what it allowed ran: the stale patch and the missing file fail as tools.
    assert outcome[9] == (Status.FAILED, ErrorCode.PRECONDITION_FAILED)
    assert outcome[42] == (Status.FAILED, ErrorCode.NOT_FOUND)
    for number in UNITTEST_RUNS:
        assert outcome[number - 1] == (Status.SUCCEEDED, None)
        assert rows[number - 1]["structuredOutput"]["exitCode"] == 0
    ops = (calc / "src" / "calc" / "ops.py").read_text(encoding="utf-8")
    assert 'raise ValueError("mean() of an empty list is undefined")' in ops
    assert 'raise ValueError("divide() by zero")' in ops
    assert "Every helper raises ValueError" in ops
    assert (calc / "src" / "calc" / "stats.py").is_file()
    assert (calc / "README.md").read_text(encoding="utf-8") == WORKSPACE_FILES["README.md"]
    assert not (calc.parent / "scratch.py").exists()
    with SqliteLedger(calc / ".toolkernel" / "ledger.db") as ledger:
        (run,) = ledger.runs()
        events = list(ledger.events(run.run_id))
        assert ledger.verify(run.run_id).ok
    for kind in (EventType.TOOL_CALL_REQUEST, EventType.TOOL_CALL_RESULT):
        assert sum(e.type is kind for e in events) == 50

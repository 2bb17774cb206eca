"""Generated documentation stays in step with the code."""

from pathlib import Path

from toolkernel.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_error_code_reference_matches_the_catalog(capsys):
    assert main(["codes", "--format", "markdown"]) == 0
    generated = capsys.readouterr().out
    assert generated in (ROOT / "docs" / "error-codes.md").read_text(encoding="utf-8")

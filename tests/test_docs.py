"""Generated documentation stays in step with the code."""

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from toolkernel.cli import main
from toolkernel.kernel import Kernel

ROOT = Path(__file__).resolve().parents[1]


def test_error_code_reference_matches_the_catalog(capsys):
    assert main(["codes", "--format", "markdown"]) == 0
    generated = capsys.readouterr().out
    assert generated in (ROOT / "docs" / "error-codes.md").read_text(encoding="utf-8")


def _documented_checker(tmp_path: Path) -> Path:
    text = (ROOT / "docs" / "ledger.md").read_text(encoding="utf-8")
    section = text.split("## Checking a chain without toolkernel", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "check_ledger.py"
    script.write_text(code, encoding="utf-8")
    return script


def _export(workspace: Path, capsys: pytest.CaptureFixture[str], target: Path) -> None:
    assert main(["ledger", "show", "--format", "json", "--workspace", str(workspace)]) == 0
    target.write_text(capsys.readouterr().out, encoding="utf-8")


def _check(script: Path, export: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), str(export)], capture_output=True, text=True, timeout=60
    )


async def _calls(kernel: Kernel) -> None:
    run = kernel.start_run()
    kernel.expose(run)
    await kernel.call(run, "repo.lookup", {"query": "naïve ✓", "limit": 2})
    await kernel.call(run, "repo.lookup", {"query": "x", "limit": 0})  # refused
    await kernel.call(run, "tool.crash", {})  # a traceback in `internal`


def test_the_documented_standalone_checker_verifies_real_ledgers_and_catches_edits(
    kernel_factory, workspace: Path, tmp_path: Path, capsys
):
    kernel = kernel_factory()
    anyio.run(_calls, kernel)
    kernel.close()
    script = _documented_checker(tmp_path)
    export = tmp_path / "ledger.json"
    _export(workspace, capsys, export)
    events = json.loads(export.read_text(encoding="utf-8"))
    assert len(events) >= 8
    intact = _check(script, export)
    assert (intact.returncode, intact.stdout.strip()) == (0, "every chain is intact")

    edited = [dict(e) for e in events]
    edited[2]["payload"] = {**edited[2]["payload"], "toolName": "something.else"}
    export.write_text(json.dumps(edited), encoding="utf-8")
    caught = _check(script, export)
    assert caught.returncode == 1
    assert "do not match the hash" in caught.stdout

    dropped = events[:3] + events[4:]
    export.write_text(json.dumps(dropped), encoding="utf-8")
    gap = _check(script, export)
    assert gap.returncode == 1
    assert "expected seq 4" in gap.stdout

    # A run id written to fool a reader's terminal is printed escaped.
    spoof = "\x1b[2J\x1b[32mevery chain is intact\x1b[8m\u202e"
    export.write_text(json.dumps([{**events[0], "runId": spoof}]), encoding="utf-8")
    spoofed = _check(script, export)
    assert spoofed.returncode == 1
    assert "\x1b" not in spoofed.stdout
    assert "\u202e" not in spoofed.stdout
    assert "\\x1b[2J" in spoofed.stdout


def test_the_readmes_configuration_example_loads(tmp_path):
    """A newcomer copies it: every key must be where the loader looks for it."""
    from toolkernel.config import load_config

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Configuration", 1)[1]
    example = section.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "toolkernel.toml"
    path.write_text(example, encoding="utf-8")
    config = load_config(path, workspace=tmp_path)
    assert "secrets/**" in config.forbidden_paths
    with Kernel(config) as kernel:
        assert kernel.config.ledger.commit == "each"

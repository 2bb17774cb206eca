"""The demo runs the seed's example and drills through the real runtime, and says so."""

import io

from toolkernel.demo import run_demo


def test_demo_runs_every_scenario_as_expected():
    out = io.StringIO()
    assert run_demo(out=out) == 0, out.getvalue()[-3000:]
    text = out.getvalue()
    for title in ("Section 26", "Drill 1", "Drill 2", "Drill 3", "Drill 4", "Redaction"):
        assert f"ok   {title}" in text
    assert "REMOTE_TOOL_REJECTED" in text
    assert "ledger verify: " in text
    assert "intact" in text

"""Output over the projection budget is cut before ``redact`` sees it: a secret the cut
goes through is masked whole there, and counted in the result's redaction notices."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkernel.codes import ErrorCode, Status
from toolkernel.functions import tool
from toolkernel.normalize import shrink
from toolkernel.redaction import SECRET_MASK, Redactor

pytestmark = pytest.mark.anyio

TOKEN = "ghp_" + "R8kT3mZq9XwL2vN7pB4sY6dF1hJ0cE5aG8uK"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzK8ZQ2pLm3"
KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
)
PIECE = 6


def pieces(secret: str) -> set[str]:
    return {secret[i : i + PIECE] for i in range(len(secret) - PIECE + 1)}


@tool("t.big")
def big() -> Any:
    """Four strings of over 2000 characters, each with a secret across the first cut."""
    return {
        "a": "x" * 1970 + " token=" + TOKEN + " " + "y" * 3000,
        "b": "x" * 1960 + " aws_secret_access_key=" + AWS_SECRET + " " + "y" * 3000,
        "c": "x" * 1975 + " " + KEY + "z" * 3000,
        "d": "x" * 1980 + " " + TOKEN + " " + "y" * 3000,
    }


async def test_a_secret_across_the_budget_cut_is_masked_whole_and_counted(kernel_factory):
    kernel = kernel_factory()
    kernel.register(big)
    result = await kernel.call(kernel.start_run(), "t.big", {})
    assert (result.status, result.error_code) == (Status.PARTIAL, ErrorCode.OUTPUT_TRUNCATED)
    shown = json.dumps(result.projection())
    for secret in (TOKEN, AWS_SECRET, KEY.splitlines()[1], "BEGIN OPENSSH"):
        assert not any(piece in shown for piece in pieces(secret)), secret
    output = result.structured_output
    assert output["a"].endswith(f" token={SECRET_MASK}…[truncated]")
    assert output["c"].endswith(f" {SECRET_MASK}…[truncated]")
    notices = {(n.kind, n.where): n.count for n in result.redactions}
    assert notices == {
        ("aws-secret-key", "structuredOutput"): 1,
        ("github-token", "structuredOutput"): 2,
        ("private-key", "structuredOutput"): 1,
    }
    assert "[Redacted from this result: 1 aws-secret-key, 2 github-token, 1 private-key.]" in (
        result.safe_message
    )


REDACTOR = Redactor(Path("/srv/ws"))
SECRETS = st.sampled_from(
    [
        ("token=", TOKEN),
        ("aws_secret_access_key=", AWS_SECRET),
        ("password: ", "S3cr3t-P4ss-2024-Vx9"),
    ]
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    secret=SECRETS,
    limit=st.sampled_from([2000, 500, 200, 80]),
    offset=st.integers(min_value=-70, max_value=5),
)
def test_no_piece_of_a_secret_survives_shrink_then_redact(secret, limit, offset):
    """Wherever the secret, or its keyword, lies around the cut of the level that fits."""
    context, value = secret
    at = limit + offset
    text = "x" * at + " " + context + value + " " + "y" * 3000
    counts: Counter[str] = Counter()
    # Room for one string of ``limit`` characters and the masks: the next level is
    # at least twice as long, so this one is taken.
    cut = shrink({"out": text}, limit + 60, redactor=REDACTOR, counts=counts)
    assert len(cut["out"]) < limit + 40
    shown = json.dumps(REDACTOR.redact(cut, Counter()))
    assert not any(piece in shown for piece in pieces(value))

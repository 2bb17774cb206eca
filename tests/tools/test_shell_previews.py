"""A command's output preview (head and tail) cut inside a line shows nothing of a
secret: not a value whose keyword the cut dropped (" = S3cr3t…"), which redaction of
the preview alone would not recognise."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from toolkernel.artifacts import ArtifactStore
from toolkernel.redaction import Redactor
from toolkernel.tools.adapter import _capture

PASSWORD = "S3cr3t-P4ss-2024-Vx9"


@pytest.mark.parametrize("pad", range(0, 60, 3))
def test_a_tail_cut_between_a_keyword_and_its_value_shows_no_value(
    tmp_path: Path, pad: int
) -> None:
    output = tmp_path / "stdout"
    line = f"password = {PASSWORD} ".encode()
    output.write_bytes(b"word " * 4000 + line + b"m" * pad + b" " + b"more " * 405)
    store = ArtifactStore(tmp_path / "artifacts", redactor=Redactor(tmp_path))

    captured = _capture(store, output, "stdout", "call_1")

    shown = store.redactor.redact_text(captured.tail, Counter())  # as the kernel does
    assert PASSWORD[:8] not in shown
    assert captured.tail.endswith("more ")


def test_a_head_cut_between_a_keyword_and_its_value_shows_no_value(tmp_path: Path) -> None:
    output = tmp_path / "stdout"
    for lead in range(2020, 2050):
        output.write_bytes(b" " * lead + f"password = {PASSWORD} ".encode() * 3)
        store = ArtifactStore(tmp_path / "artifacts", redactor=Redactor(tmp_path))
        captured = _capture(store, output, "stdout", "call_1")
        shown = store.redactor.redact_text(captured.head + captured.tail, Counter())
        assert PASSWORD[:8] not in shown, lead

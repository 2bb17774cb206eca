"""The bubblewrap every sandbox test runs: the real one, probed once per module."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkernel.sandbox import find_bwrap, probe


@pytest.fixture(scope="module")
def bwrap() -> Path:
    # No skip: a machine where the sandbox cannot start must fail these tests loudly.
    path = find_bwrap()
    probe(path)
    return path

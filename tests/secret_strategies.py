"""Hypothesis strategies for secret-shaped text, shared by the redaction property tests."""

from __future__ import annotations

import string

from hypothesis import strategies as st

ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits


def chars(alphabet: str, size: int, max_size: int | None = None) -> st.SearchStrategy[str]:
    return st.text(st.sampled_from(alphabet), min_size=size, max_size=max_size or size)


def mixed(size: int) -> st.SearchStrategy[str]:
    """Random-looking: upper, lower and digits all present, like generated tokens."""
    return chars(ALNUM, size).filter(
        lambda s: (
            sum(c.isupper() for c in s) >= 3
            and sum(c.islower() for c in s) >= 3
            and sum(c.isdigit() for c in s) >= 3
        )
    )

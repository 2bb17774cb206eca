"""The ledger's clock (calls.timestamp): ISO-8601 UTC with microseconds, the date of
the very second the microseconds belong to, whatever second came before."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolkernel import calls

# From the epoch to the year 9999, in nanoseconds.
NANOS = st.integers(min_value=0, max_value=253_402_300_799_999_999_999)


def expected(ns: int) -> str:
    whole = datetime.fromtimestamp(ns // 1_000_000_000, UTC)
    return f"{whole:%Y-%m-%dT%H:%M:%S}.{ns // 1_000 % 1_000_000:06d}Z"


@given(st.lists(NANOS, min_size=1, max_size=5))
def test_each_time_is_written_with_its_own_seconds_date_and_zero_padded_micros(
    times: list[int],
) -> None:
    # Consecutive readings in any order, so the cached date is sometimes the right
    # second's and sometimes another's.
    with pytest.MonkeyPatch.context() as patch:
        for ns in times:
            patch.setattr(calls.time, "time_ns", lambda ns=ns: ns)
            assert calls.timestamp() == expected(ns)


def test_microseconds_keep_their_leading_zeros_within_one_second() -> None:
    second = 1_764_532_800 * 1_000_000_000  # 2025-11-30T20:00:00Z
    with pytest.MonkeyPatch.context() as patch:
        for micros, text in ((0, "000000"), (7, "000007"), (999_999, "999999")):
            patch.setattr(calls.time, "time_ns", lambda m=micros: second + m * 1_000)
            assert calls.timestamp() == f"2025-11-30T20:00:00.{text}Z"

"""The API server's timestamps: one format written from datetimes and seconds, read back."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.core.apitime import api_time, parse_api_time


@given(st.integers(min_value=0, max_value=4_000_000_000))
def test_whole_seconds_come_back(t: int) -> None:
    assert parse_api_time(api_time(t)) == t


@given(st.floats(min_value=0, max_value=4e9))
def test_seconds_come_back_within_a_second(t: float) -> None:
    assert abs(parse_api_time(api_time(t)) - t) < 1


def test_an_aware_datetime_is_written_in_utc() -> None:
    at = dt.datetime(2026, 12, 1, 19, 5, 7, 900, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert api_time(at) == "2026-12-01T17:05:07Z"
    assert api_time(at) == api_time(at.timestamp())

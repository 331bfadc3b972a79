"""Due periods with CloudKitty's rules (`cloudkitty/utils/__init__.py:200-223`): month start on first sight, strict wait check."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ratebeam.transforms.periods import due_periods, month_start, period_range

H = 3600


def test_new_scope_starts_at_month_start_without_wait_check():
    now = datetime(2026, 3, 1, 0, 30, tzinfo=UTC)
    assert list(due_periods(None, now, H, 2)) == [datetime(2026, 3, 1, tzinfo=UTC)]


def test_wait_check_is_strict():
    last = datetime(2026, 3, 1, 9, tzinfo=UTC)
    # [10:00, 11:00) is rated once now > 12:00 with wait_periods 2.
    assert list(due_periods(last, datetime(2026, 3, 1, 12, tzinfo=UTC), H, 2)) == []
    assert list(due_periods(last, datetime(2026, 3, 1, 12, 0, 1, tzinfo=UTC), H, 2)) == [
        datetime(2026, 3, 1, 10, tzinfo=UTC)
    ]


def test_catch_up_is_capped():
    last = datetime(2026, 3, 1, tzinfo=UTC)
    now = last + timedelta(days=10)
    due = list(due_periods(last, now, H, 2, cap=5))
    assert due == [last + timedelta(hours=h) for h in range(1, 6)]
    assert len(list(due_periods(last, now, H, 2))) == 10 * 24 - 3


def test_naive_datetimes_are_refused():
    with pytest.raises(ValueError, match="timezone-aware"):
        list(due_periods(None, datetime(2026, 3, 1), H, 2))  # noqa: DTZ001


def test_month_start_and_ranges():
    assert month_start(datetime(2026, 2, 17, 5, tzinfo=UTC)) == datetime(2026, 2, 1, tzinfo=UTC)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert period_range(start, start + timedelta(hours=3), H) == [start + timedelta(hours=h) for h in range(3)]
    with pytest.raises(ValueError, match="not aligned"):
        period_range(start + timedelta(minutes=5), start + timedelta(hours=3), H)

"""The four time groupby keys of `cloudkitty/collector/__init__.py:285-309`, vectorized and scalar, from the period begin in UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import polars as pl
import pytest

from ratebeam.transforms.schema import BEGIN, TIME_KEYS, TIME_POLARS, groupby_column
from ratebeam.transforms.time_keys import add_time_keys, time_keys


def test_known_dates():
    assert time_keys(datetime(2024, 1, 6, tzinfo=UTC)) == {
        "week_of_the_year": "00", "day_of_the_year": "6", "month": "1", "year": "2024"
    }
    assert time_keys(datetime(2024, 1, 7, tzinfo=UTC))["week_of_the_year"] == "01"  # first Sunday
    assert time_keys(datetime(2024, 12, 31, 23, tzinfo=UTC)) == {
        "week_of_the_year": "52", "day_of_the_year": "366", "month": "12", "year": "2024"
    }
    assert time_keys(datetime(2023, 1, 1, tzinfo=UTC))["week_of_the_year"] == "01"  # 2023 starts on a Sunday


def test_scalar_matches_cloudkittys_strftime_calls():
    # CloudKitty: strftime("%U"), ("%-j"), ("%-m"), ("%Y") on the period start (glibc)
    day = datetime(1999, 12, 25, 5, tzinfo=UTC)
    for _ in range(1200):
        assert time_keys(day) == {
            "week_of_the_year": day.strftime("%U"),
            "day_of_the_year": day.strftime("%-j"),
            "month": day.strftime("%-m"),
            "year": day.strftime("%Y"),
        }
        day += timedelta(days=3, hours=7)


def test_vectorized_equals_scalar_over_many_years():
    begins = [datetime(1970, 1, 1, tzinfo=UTC) + timedelta(hours=13 * i) for i in range(0, 60_000, 7)]
    frame = add_time_keys(pl.DataFrame({BEGIN: begins}, schema={BEGIN: TIME_POLARS}))
    columns = [groupby_column(k) for k in TIME_KEYS]
    assert frame.select(columns).rows() == [tuple(time_keys(b).values()) for b in begins]
    assert all(frame.schema[c] == pl.String for c in columns)


def test_begin_in_another_zone_is_taken_in_utc():
    paris = timezone(timedelta(hours=1))
    begin = datetime(2024, 1, 7, 0, 30, tzinfo=paris)  # 2024-01-06 23:30 UTC, a Saturday
    frame = pl.DataFrame({BEGIN: [begin]}).with_columns(pl.col(BEGIN).dt.convert_time_zone("Europe/Paris"))
    row = add_time_keys(frame).row(0, named=True)
    assert row[groupby_column("week_of_the_year")] == "00" and row[groupby_column("day_of_the_year")] == "6"
    assert time_keys(begin)["week_of_the_year"] == "00"


def test_time_keys_overwrite_same_named_labels_and_work_lazily():
    frame = pl.LazyFrame(
        {"start": [datetime(2024, 3, 1, tzinfo=UTC)], groupby_column("month"): ["from-collector"], "x": [1]}
    )
    out = add_time_keys(frame, begin_col="start")
    assert isinstance(out, pl.LazyFrame)
    row = out.collect().row(0, named=True)
    assert row[groupby_column("month")] == "3" and row["x"] == 1
    assert row[groupby_column("week_of_the_year")] == "08" and row[groupby_column("year")] == "2024"


def test_naive_datetimes_are_refused():
    with pytest.raises(ValueError, match="naive"):
        time_keys(datetime(2024, 1, 1))  # noqa: DTZ001 - on purpose

"""The four time groupby keys CloudKitty adds to every point (`cloudkitty/collector/__init__.py:285-309`), vectorized.

``_create_data_point`` writes ``week_of_the_year`` (``%U``: Sunday-based week, days before the first
Sunday are week ``"00"``), ``day_of_the_year`` (``%-j``, unpadded), ``month`` (``%-m``, unpadded)
and ``year`` (``%Y``) into ``groupby``, computed from the period begin, *after* the collector's own
labels, so they overwrite same-named labels.  ratebeam computes them in UTC (CloudKitty uses the
host's local time; deployments run in UTC).  They are strings, as in CloudKitty.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TypeVar

import polars as pl

from ratebeam.transforms.schema import BEGIN, TIME_KEYS, groupby_column

FrameT = TypeVar("FrameT", pl.DataFrame, pl.LazyFrame)


def time_key_exprs(begin: pl.Expr | None = None) -> list[pl.Expr]:
    """Expressions for the ``groupby.<time key>`` columns from a tz-aware ``begin`` column."""
    utc = (pl.col(BEGIN) if begin is None else begin).dt.convert_time_zone("UTC")
    values = {
        "week_of_the_year": utc.dt.strftime("%U"),
        "day_of_the_year": utc.dt.ordinal_day().cast(pl.String),
        "month": utc.dt.month().cast(pl.String),
        "year": utc.dt.year().cast(pl.String),
    }
    return [values[key].alias(groupby_column(key)) for key in TIME_KEYS]


def add_time_keys(frame: FrameT, begin_col: str = BEGIN) -> FrameT:
    """``frame`` with the four ``groupby.<time key>`` columns set (overwriting same-named labels, in place).

    Computed once per distinct begin and joined back: a batch holds a few periods and many points,
    and formatting every point's begin (``strftime``) was half the cost of converting usage.
    """
    names = [groupby_column(key) for key in TIME_KEYS]
    columns = frame.collect_schema().names()
    begins = frame.select(pl.col(begin_col).unique()).with_columns(time_key_exprs(pl.col(begin_col)))
    joined = frame.drop(names, strict=False).join(begins, on=begin_col, how="left", maintain_order="left")
    return joined.select(*columns, *(name for name in names if name not in columns))


def time_keys(begin: datetime) -> dict[str, str]:
    """The time keys of one period begin, exactly as CloudKitty's ``strftime`` calls give them."""
    if begin.tzinfo is None:
        raise ValueError(f"naive datetime {begin.isoformat()}: period begins must be timezone-aware")
    utc = begin.astimezone(UTC)
    return {
        "week_of_the_year": utc.strftime("%U"),
        "day_of_the_year": str(utc.timetuple().tm_yday),
        "month": str(utc.month),
        "year": str(utc.year),
    }

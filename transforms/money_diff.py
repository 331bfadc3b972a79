"""What a rule change does to money: stored points re-rated with two raters, compared per cell.

Why re-rate stored points rather than collect again: a rated point keeps its qty, groupby and
metadata, which is all a rating module reads (the collector's input price is always 0,
``transforms.convert_usage``), so the stored range is re-rated without one collector request.  Both
sides are re-rated, the current rules as well as the proposed ones: the difference then measures the
rule change alone, not drift between what is stored and what the database says today.

The same kernel as a cycle prices both sides (``rate`` is a ``ChainRater``, or anything of its
signature); the comparison is one lazy Polars plan (two left joins on a row index, then group-bys
by cell and by (scope, type)) collected once.  Sums are exact decimals.  A cell is *changed* when
any of its points gets another price (so a cell whose ups and downs cancel out still counts: its
stored points would change) or when it fails on one side only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from ratebeam.transforms.frames import FrameOutcome
from ratebeam.transforms.schema import BEGIN, PRICE, PRICE_POLARS, SCOPE, TYPE

#: A rater as ``transforms.chain_rater.ChainRater``: usage frame -> (rated frame, failed frames).
Rater = Callable[[pl.DataFrame], tuple[pl.DataFrame, list[FrameOutcome]]]

CURRENT = "current"
PROPOSED = "proposed"
DIFFERENCE = "difference"
POINTS = "points"
CHANGED = "changed"
_ROW = "__rb_diff_row"
_MONEY = pl.Decimal(38, PRICE_POLARS.scale)


@dataclass(frozen=True)
class MoneyDiff:
    """The outcome of a diff.

    ``totals``: one row per (scope_id, type) with current, proposed, difference (proposed - current)
    and points; ``cells``: the changed (scope_id, begin, type) cells with the same sums;
    ``current_failures``/``proposed_failures``: the frames a side could not rate (their points count
    as no money on that side).
    """

    totals: pl.DataFrame
    cells: pl.DataFrame
    current_failures: list[FrameOutcome]
    proposed_failures: list[FrameOutcome]


def money_diff(stored: pl.DataFrame, current: Rater, proposed: Rater) -> MoneyDiff:
    """Re-rate ``stored`` points (rated columns of ``transforms.schema``) with both raters and compare."""
    usage = stored.with_columns(pl.lit(0).cast(PRICE_POLARS).alias(PRICE)).with_row_index(_ROW)
    current_rated, current_failures = current(usage)
    proposed_rated, proposed_failures = proposed(usage)
    points = (
        usage.lazy()
        .select(_ROW, SCOPE, BEGIN, TYPE)
        .join(_prices(current_rated, CURRENT), on=_ROW, how="left")
        .join(_prices(proposed_rated, PROPOSED), on=_ROW, how="left")
    )
    money = [pl.col(CURRENT).sum().cast(_MONEY), pl.col(PROPOSED).sum().cast(_MONEY), pl.len().alias(POINTS)]
    difference = (pl.col(PROPOSED) - pl.col(CURRENT)).cast(_MONEY).alias(DIFFERENCE)
    cells = (
        points.group_by(SCOPE, BEGIN, TYPE)
        .agg(*money, pl.col(CURRENT).ne_missing(pl.col(PROPOSED)).any().alias(CHANGED))
        .filter(pl.col(CHANGED))
        .select(SCOPE, BEGIN, TYPE, CURRENT, PROPOSED, difference, POINTS)
        .sort(SCOPE, BEGIN, TYPE)
    )
    totals = (
        points.group_by(SCOPE, TYPE).agg(*money)
        .select(SCOPE, TYPE, CURRENT, PROPOSED, difference, POINTS)
        .sort(SCOPE, TYPE)
    )
    totals_frame, cells_frame = pl.collect_all([totals, cells])
    return MoneyDiff(totals_frame, cells_frame, current_failures, proposed_failures)


def _prices(rated: pl.DataFrame, name: str) -> pl.LazyFrame:
    """A side's price per row index (rows of failed frames are absent: null after the join)."""
    return rated.lazy().select(_ROW, pl.col(PRICE).alias(name))

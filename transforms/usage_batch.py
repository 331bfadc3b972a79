"""The last step every collector shares: converted samples → the columns of a usage batch.

Collectors differ in how they get samples; once a frame has ``scope_id``, a converted ``qty``, the
label columns named by their keys and the period bounds, the usage batch is built the same way —
type and unit from the metric, price 0, ``groupby.``/``metadata.`` columns, CloudKitty's time keys,
and no point without a quantity.
"""

from __future__ import annotations

import polars as pl

from ratebeam.transforms import schema
from ratebeam.transforms.metric_defs import MetricDef
from ratebeam.transforms.schema import groupby_column, metadata_column
from ratebeam.transforms.time_keys import add_time_keys


def usage_columns(converted: pl.LazyFrame, metric: MetricDef, begin: pl.Expr, end: pl.Expr) -> pl.LazyFrame:
    """``converted`` (scope_id, qty, one column per label key) as usage-batch columns."""
    usage = converted.select(
        pl.col(schema.SCOPE),
        pl.lit(metric.rating_type).alias(schema.TYPE),
        begin.cast(schema.TIME_POLARS).alias(schema.BEGIN),
        end.cast(schema.TIME_POLARS).alias(schema.END),
        pl.col(schema.QTY),
        pl.lit(0).cast(schema.PRICE_POLARS).alias(schema.PRICE),
        pl.lit(metric.unit).alias(schema.UNIT),
        *(pl.col(k).alias(groupby_column(k)) for k in metric.groupby),
        *(pl.col(k).alias(metadata_column(k)) for k in metric.metadata),
    )
    return add_time_keys(usage).filter(pl.col(schema.QTY).is_not_null())

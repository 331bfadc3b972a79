"""Raw-sample rows of one metric and period → one Arrow batch per scope (every remote collector's last step).

Why shared: the raw-sample layout (``transforms.convert_usage``) is the contract between collectors
and the conversion, so the Prometheus and Gnocchi collectors build it the same way, here: the scope,
the metric key, the period bounds, the value column (text for Prometheus, floats for Gnocchi) and one
``label.<key>`` column per groupby/metadata key, sorted by scope and labels (a stable order).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import polars as pl
import pyarrow as pa

from ratebeam.transforms import schema
from ratebeam.transforms.convert_usage import METRIC, VALUE, label_column, label_keys
from ratebeam.transforms.metric_defs import MetricDef


def sample_rows(metric: MetricDef) -> dict[str, list[Any]]:
    """Empty columns to fill: the scope, the value and each label of ``metric``."""
    return {k: [] for k in (schema.SCOPE, VALUE, *label_keys(metric))}


def scope_batches(
    rows: dict[str, list[Any]], metric: MetricDef, begin: datetime, end: datetime,
    value_type: type[pl.DataType] = pl.String,
) -> dict[str, pa.RecordBatch]:
    """The raw-sample batch of each scope in ``rows`` (``sample_rows`` filled); ``{}`` when empty."""
    if not rows[schema.SCOPE]:
        return {}
    keys = label_keys(metric)
    types = {k: pl.String for k in rows} | {VALUE: value_type}
    samples = (
        pl.DataFrame(rows, schema=types)
        .select(
            schema.SCOPE, pl.lit(metric.key).alias(METRIC),
            pl.lit(begin).cast(schema.TIME_POLARS).alias(schema.BEGIN),
            pl.lit(end).cast(schema.TIME_POLARS).alias(schema.END),
            VALUE, *(pl.col(k).alias(label_column(k)) for k in keys),
        )
        .sort(schema.SCOPE, *map(label_column, keys))
    )
    return {
        str(scope[0]): part.to_arrow().combine_chunks().to_batches()[0]
        for scope, part in samples.partition_by(schema.SCOPE, as_dict=True, maintain_order=True).items()
    }

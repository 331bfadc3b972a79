"""The usage points a cycle rates, written as interchange usage JSONL for another rater to read.

A benchmark that compares ratebeam with CloudKitty must give both the same points.  CloudKitty has
no file collector, and its collectors convert values themselves; so ratebeam collects and converts
the samples once, with the code a cycle runs — the configured collector's ``collect`` per scope,
period and metric, then ``transforms.convert_usage.convert_samples`` (metrics.yml ``factor``,
``offset``, ``mutate``) — and writes the resulting points in the usage JSONL of
``docs/formats.md``, one line per point, sorted by scope, period and type, so that
a reader can take one scope at a time.  Quantities are plain decimals (``1``, ``0.5``: no exponent, no trailing
zeros), exactly the converted values.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl

from ratebeam.connectors.errors import NoDataCollected
from ratebeam.connectors.registry import make_collector
from ratebeam.pipelines.config import RatebeamConfig
from ratebeam.transforms import schema
from ratebeam.transforms.convert_usage import convert_samples, frame_samples
from ratebeam.transforms.frames import Frame, to_frame

#: Polars' ISO-8601 text of a UTC timestamp, as the interchange format writes instants.
_ISO = "%Y-%m-%dT%H:%M:%S%:z"


def write_converted_usage(config: RatebeamConfig, scopes: Iterable[str], begins: Iterable[datetime],
                          path: Path) -> int:
    """Collect and convert every (scope, period) of ``config`` and write its points to ``path``.

    Returns the number of points written.
    """
    metrics = config.metrics.metrics
    collector = make_collector(config.collector, config.scope_key)
    step = timedelta(seconds=config.period)
    raw = []
    try:
        for scope in scopes:
            for begin in begins:
                batches = []
                for metric in metrics:
                    try:
                        batches.append(collector.collect(scope, begin, begin + step, metric))
                    except NoDataCollected:
                        continue
                raw.append(frame_samples(batches, [Frame(scope, begin)], collector.numeric_context))
    finally:
        collector.close()
    usage = to_frame(convert_samples(raw, metrics))
    lines = [_lines(usage.filter(pl.col(schema.TYPE) == m.rating_type), m.groupby, m.metadata) for m in metrics]
    text = pl.concat(lines).sort("scope", "begin", "type", maintain_order=True)
    with path.open("w", encoding="utf-8") as out:
        for line in text.get_column("line"):
            out.write(line)
            out.write("\n")
    return text.height


def _lines(usage: pl.DataFrame, groupby: Iterable[str], metadata: Iterable[str]) -> pl.DataFrame:
    """One JSON text per point of one metric (its own labels only), with the sort keys beside it."""
    qty = pl.col(schema.QTY).cast(pl.String)
    if usage.schema[schema.QTY].scale:  # type: ignore[attr-defined]
        qty = qty.str.replace(r"0+$", "").str.replace(r"\.$", "")
    point = pl.struct(
        pl.col(schema.TYPE).alias("type"),
        qty.alias("qty"),
        pl.col(schema.UNIT).alias("unit"),
        pl.col(schema.SCOPE).alias("scope"),
        pl.col(schema.BEGIN).dt.strftime(_ISO).alias("begin"),
        pl.col(schema.END).dt.strftime(_ISO).alias("end"),
        pl.struct(*(pl.col(schema.groupby_column(k)).alias(k) for k in groupby)).alias("groupby"),
        *([pl.struct(*(pl.col(schema.metadata_column(k)).alias(k) for k in metadata)).alias("metadata")]
          if metadata else []),
    )
    return usage.select(
        pl.col(schema.SCOPE).alias("scope"), pl.col(schema.BEGIN).alias("begin"),
        pl.col(schema.TYPE).alias("type"), point.struct.json_encode().alias("line"),
    )

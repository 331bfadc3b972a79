"""The ``file`` collector: usage samples from Parquet / CSV / JSONL files through fsspec.

The embedded default, so a user can rate without any server.  A file holds *samples*, one row
each: ``metric`` (the metrics.yml name, before ``@#``), ``timestamp`` (ISO-8601 or a timestamp
column; naive means UTC), ``value``, and any number of label columns (``project_id``, ``id``,
``flavor_name``...).  For a scope × period × metric the collector takes the samples of that metric
whose scope-key label equals the scope and whose timestamp is in ``[begin, end)``, folds the
samples of each series (same groupby + metadata labels) with the metric's
``extra_args.aggregation_method`` (max by default, like CloudKitty's Prometheus
``max(max_over_time(...))``) and returns the folded values as raw samples; ``ConvertUsage`` applies
factor / offset / mutate in the exact context (``numeric_context``) and adds the time keys.  A label
the file lacks, or an empty cell, is ``''`` — as CloudKitty's Prometheus collector gives missing
labels.  A sample without a metric, timestamp, value or scope id refuses the file (``checks``); a
NaN or infinite value is no sample, counted in the run's ``samples_not_finite``.  Extensions are
matched whatever their case (``more.CSV``).

Files are read once per worker (at the first call), a Parquet file ``reading.CHUNK_ROWS`` rows
at a time.  Up to ``spill_rows`` samples stay in memory, where the first call of a metric prepares
its frames of every scope and period in one vectorised pass; more are spilled to local Parquet
(``spill``) and prepared one scope × ``WINDOW_PERIODS`` periods at a time, so a run's memory does
not grow with its scopes or periods.  Any fsspec URL works: a local path, ``memory://``, ``s3://``
with s3fs.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta

import polars as pl
import pyarrow as pa

from ratebeam.connectors.collectors.base import Collector
from ratebeam.connectors.collectors.file.config import FileCollectorConfig
from ratebeam.connectors.collectors.file.reading import NOT_FINITE, list_files, read_chunks
from ratebeam.connectors.collectors.file.spill import Samples
from ratebeam.connectors.errors import NoDataCollected
from ratebeam.transforms import schema
from ratebeam.transforms.convert_usage import METRIC, VALUE, label_column, label_keys
from ratebeam.transforms.metric_defs import MetricDef

#: Samples a collector holds in memory before it spills them (``spill_rows``'s default).
SPILL_ROWS = FileCollectorConfig.model_fields["spill_rows"].default
#: Spilled samples are prepared a window of this many periods of one scope at a time (a week of hours).
WINDOW_PERIODS = 168
#: Windows kept (least recently used dropped): a few scopes' worth, wherever the runner sends the
#: frames (FnApiRunner sends every period of a scope together).
WINDOWS_KEPT = 8
_AGG = {
    "max": lambda c: c.max(),
    "min": lambda c: c.min(),
    "sum": lambda c: c.sum(),
    "count": lambda c: c.count().cast(schema.QTY_POLARS),
    "last": lambda c: c.last(),
    "avg": lambda c: (c.sum() / c.count().cast(schema.QTY_POLARS)).cast(schema.QTY_POLARS),
}


#: A metric's frames by (scope, period begin), and its NaN / infinite samples left out, by the same key.
_Prepared = tuple[dict[tuple[str, datetime], pa.RecordBatch], dict[tuple[str, datetime], int]]


class FileCollector(Collector):
    """Collects raw samples from usage files; see the module docstring for the file layout."""

    name = "file"

    def __init__(self, url: str, fmt: str = "auto", scope_key: str = "project_id",
                 spill_rows: int = SPILL_ROWS, spill_dir: str | None = None) -> None:
        self._url = url
        self._format = fmt
        self._scope_key = scope_key
        self._spill_rows = spill_rows
        self._spill_dir = spill_dir
        self._samples: Samples | None = None
        #: In memory: each metric's frames, prepared at its first call, by (metric key, period, anchor).
        self._whole: dict[tuple[str, int, int], _Prepared] = {}
        #: Spilled: (scope, period, anchor, window) → the window's samples and its frames by metric key.
        self._windows: OrderedDict[tuple[str, int, int, int], tuple[pl.DataFrame | None, dict[str, _Prepared]]] = (
            OrderedDict())
        # Imported here: configuration loading imports this module, and commands that run no
        # pipeline must not pay Beam's start-up time (a counter is a no-op outside a pipeline).
        from apache_beam.metrics import Metrics

        self._not_finite = Metrics.counter("ratebeam", "samples_not_finite")

    def check(self) -> None:
        """The files exist and every sample has what it needs (else ``FatalConnectorError`` naming the place).

        Reads every file, chunk by chunk, keeping nothing: a file refused here stops the run before
        it takes any lease.
        """
        fs, files = list_files(self._url, self._format)
        for path, fmt in files:
            for _chunk in read_chunks(fs, path, fmt, self._scope_key):
                pass

    def _loaded(self) -> Samples:
        """Every sample of every file (read and checked at the first call)."""
        if self._samples is None:
            samples = Samples(self._scope_key, self._spill_rows, self._spill_dir)
            with ExitStack() as on_failure:  # a refused file leaves no spill behind
                on_failure.callback(samples.close)
                fs, files = list_files(self._url, self._format)
                for path, fmt in files:
                    for chunk in read_chunks(fs, path, fmt, self._scope_key):
                        samples.add(chunk)
                samples.finish()
                on_failure.pop_all()
            self._samples = samples
        return self._samples

    def collect(self, scope_id: str, begin: datetime, end: datetime, metric: MetricDef) -> pa.RecordBatch:
        """The scope's samples for the period, from the frames prepared with it (see the module docstring)."""
        period = int((end - begin).total_seconds())
        anchor = int(begin.timestamp()) % period
        batches, not_finite = self._frames(scope_id, begin, metric, period, anchor)
        if not_finite.get((scope_id, begin)):
            self._not_finite.inc(not_finite[(scope_id, begin)])
        batch = batches.get((scope_id, begin))
        if batch is None:
            raise NoDataCollected(f"{metric.name}: no sample for scope {scope_id} in [{begin}, {end})")
        return batch

    def _frames(self, scope_id: str, begin: datetime, metric: MetricDef, period: int, anchor: int) -> _Prepared:
        """The prepared frames holding (scope, begin): of the whole metric in memory, of a window when spilled."""
        samples = self._loaded()
        if not samples.spilled:
            whole = (metric.key, period, anchor)
            if whole not in self._whole:
                self._whole[whole] = self._prepare(samples.of_metric(metric.name), metric, period, anchor)
            return self._whole[whole]
        span = period * WINDOW_PERIODS
        window = (int(begin.timestamp()) - anchor) // span
        key = (scope_id, period, anchor, window)
        if key in self._windows:
            self._windows.move_to_end(key)
        else:
            first = datetime.fromtimestamp(anchor + window * span, UTC)
            self._windows[key] = (samples.of_scope(scope_id, first, first + timedelta(seconds=span)), {})
            while len(self._windows) > WINDOWS_KEPT:
                self._windows.popitem(last=False)
        rows, prepared = self._windows[key]
        if metric.key not in prepared:
            ours = None if rows is None else rows.filter(pl.col("metric") == metric.name)
            prepared[metric.key] = self._prepare(ours if ours is not None and ours.height else None, metric, period,
                                                 anchor)
        return prepared[metric.key]

    def _prepare(self, samples: pl.DataFrame | None, metric: MetricDef, period: int, anchor: int) -> _Prepared:
        """Every scope × period of ``samples`` (one metric's) at once: one vectorized pass instead of one per call.

        Also how many NaN / infinite samples each scope × period leaves out.
        """
        if samples is None:
            return {}, {}
        labels = label_keys(metric)
        agg = _AGG[getattr(metric.extra_args, "aggregation_method", "max")]
        step = pl.duration(seconds=period)
        epoch_s = pl.col("timestamp").dt.epoch("s")
        begin = pl.from_epoch(anchor + ((epoch_s - anchor) // period) * period, time_unit="s")
        begin = begin.dt.replace_time_zone("UTC").cast(schema.TIME_POLARS).alias(schema.BEGIN)
        left_out = samples.filter(pl.col(NOT_FINITE)).group_by(self._scope_key, begin).len()
        not_finite = {(scope, when): count for scope, when, count in left_out.iter_rows()}
        raw = (
            samples.lazy()
            .filter(~pl.col(NOT_FINITE))
            .with_columns(
                *((pl.col(k).fill_null("") if k in samples.columns else pl.lit("")).alias(label_column(k))
                  for k in labels),
                pl.col(self._scope_key).alias(schema.SCOPE),
                begin,
            )
            .group_by([schema.SCOPE, schema.BEGIN, *map(label_column, labels)], maintain_order=True)
            .agg(agg(pl.col("value")).alias(VALUE))
            .select(
                schema.SCOPE, pl.lit(metric.key).alias(METRIC), schema.BEGIN,
                (pl.col(schema.BEGIN) + step).alias(schema.END), VALUE, *map(label_column, labels),
            )
            .sort(schema.SCOPE, schema.BEGIN, maintain_order=True)
            .collect(engine="in-memory")
        )
        table = raw.to_arrow().combine_chunks()
        bounds = raw.select(schema.SCOPE, schema.BEGIN).with_row_index().group_by(
            schema.SCOPE, schema.BEGIN, maintain_order=True
        ).agg(pl.col("index").min().alias("first"), pl.len().alias("rows"))
        batches = {
            (scope, when): table.slice(first, rows).to_batches()[0]
            for scope, when, first, rows in bounds.iter_rows()
        }
        return batches, not_finite

    def close(self) -> None:
        """Remove the spill, if any."""
        if self._samples is not None:
            self._samples.close()

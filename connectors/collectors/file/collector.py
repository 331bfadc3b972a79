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
matched whatever their case (``more.CSV``); a directory's hidden files (``.x``, ``_SUCCESS``) and
files of another extension are not read, and each is listed (``not_read``: the run's summary,
its log and ``ratebeam gaps`` say them).

Files are read once per worker (at the first call), a Parquet file ``reading.CHUNK_ROWS`` rows
at a time.  Up to ``spill_rows`` samples stay in memory, where the first call of a metric prepares
its frames of every scope and period in one vectorised pass; more are spilled to local Parquet
(``spill``) and prepared one scope × ``WINDOW_PERIODS`` periods at a time, so a run's memory does
not grow with its scopes or periods.  A scope's periods are contiguous rows of the prepared frames,
so ``collect_periods`` answers many periods of a scope with a slice (the collect stage groups a
bundle's frames by scope to use it).  Any fsspec URL works: a local path, ``memory://``, ``s3://``
with s3fs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Prepared:
    """One metric's prepared frames: each scope's rows (ordered by period) and where each period's are.

    A scope's periods are contiguous rows of one table, so a call for many periods of a scope is a
    slice or a few, not one batch per period stitched together.
    """

    #: scope → its rows, ordered by period begin.
    rows: dict[str, pa.Table]
    #: (scope, begin) → (first row in ``rows[scope]``, rows).
    spans: dict[tuple[str, datetime], tuple[int, int]]
    #: (scope, begin) → NaN / infinite samples left out.
    not_finite: dict[tuple[str, datetime], int]

    def take(self, scope_id: str, begins: Iterable[datetime]) -> pa.RecordBatch | None:
        """The rows of the scope's ``begins`` as one batch, in period order (None when there are none)."""
        ranges = sorted(self.spans[(scope_id, b)] for b in begins if (scope_id, b) in self.spans)
        if not ranges:
            return None
        merged = [ranges[0]]
        for first, count in ranges[1:]:
            last_first, last_count = merged[-1]
            if last_first + last_count == first:  # adjacent periods: one slice
                merged[-1] = (last_first, last_count + count)
            else:
                merged.append((first, count))
        table = self.rows[scope_id]
        parts = [table.slice(first, count) for first, count in merged]
        return (parts[0] if len(parts) == 1 else pa.concat_tables(parts).combine_chunks()).to_batches()[0]

    def left_out(self, scope_id: str, begins: Iterable[datetime]) -> int:
        """The NaN / infinite samples of the scope's ``begins``."""
        return sum(self.not_finite.get((scope_id, b), 0) for b in begins)


_NOTHING = _Prepared({}, {}, {})


class FileCollector(Collector):
    """Collects raw samples from usage files; see the module docstring for the file layout."""

    name = "file"
    #: Every period's samples are prepared at once, so many periods of a scope cost a slice of them.
    collects_periods = True

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
        self._not_finite = 0

    def counts(self) -> dict[str, int]:
        """The NaN/Inf samples left out so far."""
        return {"samples_not_finite": self._not_finite}

    def check(self) -> None:
        """The files exist and every sample has what it needs (else ``FatalConnectorError`` naming the place).

        Reads every file, chunk by chunk, keeping nothing: a file refused here stops the run before
        it takes any lease.
        """
        listed = list_files(self._url, self._format)
        for path, fmt in listed.files:
            for _chunk in read_chunks(listed.fs, path, fmt, self._scope_key):
                pass

    def not_read(self) -> list[tuple[str, str]]:
        """(path, why) of each file of the usage directory that is not read (``reading.list_files``)."""
        return list_files(self._url, self._format).not_read

    def _loaded(self) -> Samples:
        """Every sample of every file (read and checked at the first call)."""
        if self._samples is None:
            samples = Samples(self._scope_key, self._spill_rows, self._spill_dir)
            with ExitStack() as on_failure:  # a refused file leaves no spill behind
                on_failure.callback(samples.close)
                listed = list_files(self._url, self._format)
                for path, fmt in listed.files:
                    for chunk in read_chunks(listed.fs, path, fmt, self._scope_key):
                        samples.add(chunk)
                samples.finish()
                on_failure.pop_all()
            self._samples = samples
        return self._samples

    def collect(self, scope_id: str, begin: datetime, end: datetime, metric: MetricDef) -> pa.RecordBatch:
        """The scope's samples for the period, from the frames prepared with it (see the module docstring)."""
        return self.collect_periods(scope_id, [begin], int((end - begin).total_seconds()), metric)

    def collect_periods(self, scope_id: str, begins: Sequence[datetime], period: int,
                        metric: MetricDef) -> pa.RecordBatch:
        """The scope's samples for every period of ``begins`` in one batch, in period order."""
        anchor = int(begins[0].timestamp()) % period
        parts: list[pa.RecordBatch] = []
        for prepared, ours in self._prepared(scope_id, begins, metric, period, anchor):
            left_out = prepared.left_out(scope_id, ours)
            if left_out:
                self._not_finite += left_out
            batch = prepared.take(scope_id, ours)
            if batch is not None:
                parts.append(batch)
        if not parts:
            span = f"[{begins[0]}, {begins[-1] + timedelta(seconds=period)})"
            raise NoDataCollected(f"{metric.name}: no sample for scope {scope_id} in {span}")
        if len(parts) == 1:
            return parts[0]
        return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]

    def _prepared(self, scope_id: str, begins: Sequence[datetime], metric: MetricDef, period: int,
                  anchor: int) -> Iterator[tuple[_Prepared, list[datetime]]]:
        """The prepared frames holding the scope's ``begins``, each with the begins it holds.

        In memory: the whole metric's, prepared at its first call.  Spilled: one window of
        ``WINDOW_PERIODS`` periods of the scope at a time.
        """
        samples = self._loaded()
        if not samples.spilled:
            whole = (metric.key, period, anchor)
            if whole not in self._whole:
                self._whole[whole] = self._prepare(samples.of_metric(metric.name), metric, period, anchor)
            yield self._whole[whole], list(begins)
            return
        span = period * WINDOW_PERIODS
        by_window: dict[int, list[datetime]] = {}
        for begin in begins:
            by_window.setdefault((int(begin.timestamp()) - anchor) // span, []).append(begin)
        for window, ours in by_window.items():
            yield self._window(scope_id, window, metric, period, anchor), ours

    def _window(self, scope_id: str, window: int, metric: MetricDef, period: int, anchor: int) -> _Prepared:
        """Spilled: the metric's prepared frames of one window of the scope (least recently used dropped)."""
        samples = self._loaded()
        span = period * WINDOW_PERIODS
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
            return _NOTHING
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
            # The scope-key label is the scope itself: grouping by it again cost a fifth of the pass.
            .group_by([schema.SCOPE, schema.BEGIN, *(label_column(k) for k in labels if k != self._scope_key)],
                      maintain_order=True)
            .agg(agg(pl.col("value")).alias(VALUE))
            .select(
                schema.SCOPE, pl.lit(metric.key).alias(METRIC), schema.BEGIN,
                (pl.col(schema.BEGIN) + step).alias(schema.END), VALUE,
                *(pl.col(schema.SCOPE if k == self._scope_key else label_column(k)).alias(label_column(k))
                  for k in labels),
            )
            .sort(schema.SCOPE, schema.BEGIN, maintain_order=True)
            .collect(engine="in-memory")
        )
        # String views, Polars' own layout: zero-copy here and when the conversion reads them back.
        table = raw.to_arrow(compat_level=pl.CompatLevel.newest()).combine_chunks()
        indexed = raw.select(schema.SCOPE, schema.BEGIN).with_row_index()
        per_scope = indexed.group_by(schema.SCOPE, maintain_order=True).agg(
            pl.col("index").min().alias("first"), pl.len().alias("rows"))
        starts = dict(zip(per_scope[schema.SCOPE].to_list(), per_scope["first"].to_list(), strict=True))
        rows = {scope: table.slice(first, count) for scope, first, count in per_scope.iter_rows()}
        per_period = indexed.group_by(schema.SCOPE, schema.BEGIN, maintain_order=True).agg(
            pl.col("index").min().alias("first"), pl.len().alias("rows"))
        spans = {(scope, when): (first - starts[scope], count) for scope, when, first, count in per_period.iter_rows()}
        return _Prepared(rows, spans, not_finite)

    def close(self) -> None:
        """Remove the spill, if any."""
        if self._samples is not None:
            self._samples.close()

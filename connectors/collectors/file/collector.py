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

Files are read once per worker (``setup``) and indexed by (metric, scope), so each call only
slices a small sorted frame.  Any fsspec URL works: a local path, ``memory://``, ``s3://`` with s3fs.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation

import fsspec
import polars as pl
import pyarrow as pa

from ratebeam.connectors.collectors.base import Collector
from ratebeam.connectors.collectors.file.checks import NEEDED, refuse_missing, refuse_nested
from ratebeam.connectors.errors import FatalConnectorError, NoDataCollected
from ratebeam.transforms import schema
from ratebeam.transforms.convert_usage import METRIC, VALUE, label_column, label_keys
from ratebeam.transforms.metric_defs import MetricDef
from ratebeam.transforms.schema import quantize_qty

FORMATS = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
#: Column marking the samples whose value is NaN or infinite (no sample; counted when collected).
_NOT_FINITE = "__not_finite"
_AGG = {
    "max": lambda c: c.max(),
    "min": lambda c: c.min(),
    "sum": lambda c: c.sum(),
    "count": lambda c: c.count().cast(schema.QTY_POLARS),
    "last": lambda c: c.last(),
    "avg": lambda c: (c.sum() / c.count().cast(schema.QTY_POLARS)).cast(schema.QTY_POLARS),
}


def list_files(url: str, fmt: str = "auto") -> tuple[fsspec.AbstractFileSystem, list[tuple[str, str]]]:
    """The (path, format) of every usage file under ``url`` (a file, a directory or a glob)."""
    fs, path = fsspec.core.url_to_fs(url)
    if any(ch in path for ch in "*?["):
        paths = sorted(fs.glob(path))
    elif fs.isdir(path):
        paths = sorted(p for p in fs.find(path) if _format(p, "auto"))
    elif fs.exists(path):
        paths = [path]
    else:
        raise FatalConnectorError(f"file collector: {url!r} does not exist")
    found = [(p, _format(p, fmt)) for p in paths]
    unknown = [p for p, f in found if f is None]
    if unknown:
        raise FatalConnectorError(f"file collector: unknown file format for {unknown[0]!r} (use .parquet, .csv or .jsonl)")
    if not found:
        raise FatalConnectorError(f"file collector: no usage file under {url!r}")
    return fs, found  # type: ignore[return-value]


def _format(path: str, fmt: str) -> str | None:
    if fmt != "auto":
        return fmt
    for ext, name in FORMATS.items():
        if path.lower().endswith(ext):
            return name
    return None


def _read_one(fs: fsspec.AbstractFileSystem, path: str, fmt: str, scope_key: str) -> pl.DataFrame:
    try:
        with fs.open(path, "rb") as fh:
            if fmt == "parquet":
                frame = pl.read_parquet(fh)
            elif fmt == "csv":
                frame = pl.read_csv(fh, infer_schema=False)
            else:
                frame = pl.read_ndjson(fh)
    except (OSError, pl.exceptions.PolarsError, pa.ArrowException) as exc:
        # an empty CSV, invalid UTF-8, a corrupt Parquet file: said with the file, without Polars' hints
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FatalConnectorError(f"file collector: {path}: cannot read as {fmt}: {reason}") from None
    missing = [c for c in NEEDED if c not in frame.columns]
    if missing:
        raise FatalConnectorError(f"file collector: {path}: missing column(s) {', '.join(missing)}")
    refuse_nested(frame, path, fmt)
    refuse_missing(frame, path, fmt, scope_key)
    values, not_finite = _values(frame["value"], path)
    return frame.with_columns(
        pl.col("metric").cast(pl.String),
        _timestamps(frame, path),
        values,
        not_finite.alias(_NOT_FINITE),
        *(pl.col(c).cast(pl.String) for c in frame.columns if c not in NEEDED),
    )


def _timestamps(frame: pl.DataFrame, path: str) -> pl.Expr:
    dtype = frame.schema["timestamp"]
    col = pl.col("timestamp")
    if dtype == pl.String:
        return pl.lit(_parse_timestamps(frame["timestamp"], path)).alias("timestamp")
    if isinstance(dtype, pl.Datetime):
        col = col.dt.replace_time_zone("UTC") if dtype.time_zone is None else col.dt.convert_time_zone("UTC")
        return col.cast(schema.TIME_POLARS)
    raise FatalConnectorError(f"file collector: {path}: timestamp: unsupported type {dtype}")


#: The end of an ISO-8601 text that carries its offset (``...T10:00:00Z``, ``... 10:00+02:00``).
_AWARE = r"\d:\d{2}(?::\d{2}(?:[.,]\d+)?)?\s*(?:[Zz]|[+-]\d{2}(?::?\d{2})?)$"


def _parse_timestamps(text: pl.Series, path: str) -> pl.Series:
    """ISO-8601 texts as UTC instants; naive ones are UTC, so a file may mix both forms.

    Polars infers one format per column, so the texts with an offset and those without are parsed
    apart and put back in place.  An instant past 9999-12-31 in UTC is refused: no stage after
    this one (Python's datetime, the storages) can hold it.
    """
    out = pl.Series("timestamp", [None] * len(text), dtype=pl.Datetime("us", "UTC"))
    aware = text.str.contains(_AWARE).fill_null(False)
    for mask, zone in ((aware, "UTC"), (~aware & text.is_not_null(), None)):
        part = text.filter(mask)
        if part.is_empty():
            continue
        try:
            parsed = part.str.to_datetime(time_unit="us", time_zone=zone, strict=True)
        except pl.exceptions.PolarsError as exc:
            reason = str(exc).strip().splitlines()[0]
            raise FatalConnectorError(f"file collector: {path}: timestamp: not ISO-8601 ({reason})") from None
        parsed = parsed if zone else parsed.dt.replace_time_zone("UTC")
        out = out.scatter(mask.arg_true(), parsed)
    late = text.filter(out.dt.year() > 9999)
    if not late.is_empty():
        raise FatalConnectorError(f"file collector: {path}: timestamp: after 9999-12-31 once in UTC: {late[0]!r}")
    return out


def _values(values: pl.Series, path: str) -> tuple[pl.Series, pl.Series]:
    """Sample values as exact decimals (numbers via their shortest text, ``Decimal(str(x))``) and a mask.

    The mask says which are NaN or infinite (their decimal is null: a decimal column cannot hold them).
    """
    if values.dtype.is_integer() or isinstance(values.dtype, pl.Decimal):
        return values.cast(schema.QTY_POLARS), pl.repeat(False, len(values), eager=True)
    text = values.cast(pl.String)
    uniques = text.unique().drop_nulls()
    parsed: list[Decimal | None] = []
    not_finite = []
    for raw in uniques.to_list():
        try:
            number = Decimal(raw.strip())
            if not number.is_finite():
                not_finite.append(raw)
                parsed.append(None)
                continue
            parsed.append(quantize_qty(number))
        except (InvalidOperation, ValueError):
            raise FatalConnectorError(f"file collector: {path}: value: not a number: {raw!r}") from None
    decimals = text.replace_strict(uniques, pl.Series(parsed, dtype=schema.QTY_POLARS), default=None,
                                   return_dtype=schema.QTY_POLARS)
    return decimals, text.is_in(pl.Series(not_finite, dtype=pl.String).implode())


#: A metric's frames by (scope, period begin), and its NaN / infinite samples left out, by the same key.
_Prepared = tuple[dict[tuple[str, datetime], pa.RecordBatch], dict[tuple[str, datetime], int]]


class FileCollector(Collector):
    """Collects raw samples from usage files; see the module docstring for the file layout."""

    name = "file"

    def __init__(self, url: str, fmt: str = "auto", scope_key: str = "project_id") -> None:
        self._url = url
        self._format = fmt
        self._scope_key = scope_key
        self._by_metric: dict[str, pl.DataFrame] | None = None
        self._prepared: dict[tuple[str, int, int], _Prepared] = {}
        # Imported here: configuration loading imports this module, and commands that run no
        # pipeline must not pay Beam's start-up time (a counter is a no-op outside a pipeline).
        from apache_beam.metrics import Metrics

        self._not_finite = Metrics.counter("ratebeam", "samples_not_finite")

    def check(self) -> None:
        """The files exist and every sample has what it needs (else ``FatalConnectorError`` naming the place).

        Reads every file: a file refused here stops the run before it takes any lease.
        """
        self._loaded()

    def _loaded(self) -> dict[str, pl.DataFrame]:
        """Every sample of every file, by metric name (read and checked at the first call)."""
        if self._by_metric is None:
            fs, files = list_files(self._url, self._format)
            data = pl.concat([_read_one(fs, p, f, self._scope_key) for p, f in files], how="diagonal_relaxed")
            self._by_metric = {
                str(k[0]): part for k, part in data.partition_by("metric", as_dict=True, maintain_order=True).items()
            }
        return self._by_metric

    def _samples(self, metric_name: str) -> pl.DataFrame | None:
        return self._loaded().get(metric_name)

    def collect(self, scope_id: str, begin: datetime, end: datetime, metric: MetricDef) -> pa.RecordBatch:
        """The scope's samples for the period, from the metric's periods prepared at the first call."""
        period = int((end - begin).total_seconds())
        anchor = int(begin.timestamp()) % period
        key = (metric.key, period, anchor)
        if key not in self._prepared:
            self._prepared[key] = self._prepare(metric, period, anchor)
        batches, not_finite = self._prepared[key]
        if not_finite.get((scope_id, begin)):
            self._not_finite.inc(not_finite[(scope_id, begin)])
        batch = batches.get((scope_id, begin))
        if batch is None:
            raise NoDataCollected(f"{metric.name}: no sample for scope {scope_id} in [{begin}, {end})")
        return batch

    def _prepare(self, metric: MetricDef, period: int, anchor: int) -> _Prepared:
        """Every scope × period of one metric at once: one vectorized pass instead of one per call.

        Also how many NaN / infinite samples each scope × period leaves out.
        """
        samples = self._samples(metric.name)
        if samples is None:
            return {}, {}
        labels = label_keys(metric)
        agg = _AGG[getattr(metric.extra_args, "aggregation_method", "max")]
        step = pl.duration(seconds=period)
        epoch_s = pl.col("timestamp").dt.epoch("s")
        begin = pl.from_epoch(anchor + ((epoch_s - anchor) // period) * period, time_unit="s")
        begin = begin.dt.replace_time_zone("UTC").cast(schema.TIME_POLARS).alias(schema.BEGIN)
        left_out = samples.filter(pl.col(_NOT_FINITE)).group_by(self._scope_key, begin).len()
        not_finite = {(scope, when): count for scope, when, count in left_out.iter_rows()}
        raw = (
            samples.lazy()
            .filter(~pl.col(_NOT_FINITE))
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

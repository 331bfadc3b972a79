"""``ConvertUsage``: raw samples, as a collector gives them, → usage batches (`cloudkitty/utils/__init__.py:250-292`, `cloudkitty/collector/__init__.py:81-119`, `cloudkitty/collector/__init__.py:285-309`).

Collectors only collect: for a frame they return *raw samples* — one row per series with the
``scope_id``, the ``metric`` key, the period ``begin``/``end``, the ``value`` exactly as collected
(a decimal column for the file collector, Prometheus' text for the Prometheus collector) and one
``label.<key>`` column per groupby / metadata key.  Everything CloudKitty then does to a sample is
pure and the same for every collector, so it lives here, once: ``value * factor + offset`` and
``mutate`` in the collector's numeric context (``transforms.conversion``), type and unit from the
metric, price 0, the ``groupby.``/``metadata.`` columns, the time keys, and no point without a
quantity.  Each collector declares its numeric context as data (``Collector.numeric_context``); the
collect stage stamps it on the raw batch (``with_numeric_context``) so this step needs no collector.

Row order is kept (the collectors sort their samples), so the usage rows are the same, in the same
order, as when each collector converted its own samples.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

import apache_beam as beam
import polars as pl
import pyarrow as pa
from apache_beam.transforms.window import BoundedWindow

from ratebeam.transforms import schema
from ratebeam.transforms.conversion import NumericContext, convert_qty
from ratebeam.transforms.frames import (
    CONVERT_STAGE,
    Frame,
    FrameOutcome,
    concat_batches,
    concat_frames,
    empty_usage_batch,
    manifest,
    to_batch,
    to_frame,
    with_manifest,
)
from ratebeam.transforms.metric_defs import MetricDef
from ratebeam.transforms.rebatch import RebatchingFn
from ratebeam.transforms.schema import groupby_column, metadata_column
from ratebeam.transforms.tallies import TALLIES
from ratebeam.transforms.time_keys import add_time_keys

LOG = logging.getLogger(__name__)
FAILURES = "failures"
METRIC = "metric"
VALUE = "value"
LABEL_PREFIX = "label."
CONTEXT_KEY = b"ratebeam.numeric_context"
_ROW = "__rb_sample_row"


def label_column(key: str) -> str:
    """Column of a raw-sample batch holding the label ``key`` (``''`` when the series lacks it)."""
    return LABEL_PREFIX + key


def label_keys(metric: MetricDef) -> list[str]:
    """The labels a collector returns for ``metric``: groupby (scope key included) then metadata."""
    return list(dict.fromkeys((*metric.groupby, *metric.metadata)))


def with_numeric_context(batch: pa.RecordBatch, context: NumericContext) -> pa.RecordBatch:
    """Record which arithmetic turns this batch's values into quantities (the collector's)."""
    meta = dict(batch.schema.metadata or {})
    meta[CONTEXT_KEY] = str(context).encode()
    return batch.replace_schema_metadata(meta)


def numeric_context(batch: pa.RecordBatch) -> NumericContext:
    """The context ``with_numeric_context`` recorded (exact when none was)."""
    raw = (batch.schema.metadata or {}).get(CONTEXT_KEY)
    return NumericContext.EXACT if raw is None else NumericContext(raw.decode())


def empty_samples() -> pa.RecordBatch:
    """A 0-row raw-sample batch: the carrier of a frame (or a scope) without samples."""
    return pa.RecordBatch.from_pylist([], schema=pa.schema([(METRIC, pa.string())]))


def frame_samples(batches: list[pa.RecordBatch], frames: Iterable[Frame], context: NumericContext) -> pa.RecordBatch:
    """The raw samples of every metric of whole ``frames`` as one batch, with its manifest and context.

    Frames without samples travel in the manifest (a 0-row batch if none has any), so that they can
    be committed.
    """
    table = concat_batches(batches)
    carrier = empty_samples() if table is None else table.to_batches()[0]
    return with_numeric_context(with_manifest(carrier, frames), context)


def usage_columns(converted: pl.LazyFrame, metric: MetricDef, *carry: str) -> pl.LazyFrame:
    """Converted samples (with ``qty``) as usage-batch columns, time keys included, null qty dropped.

    ``qty_remainder`` is kept when the conversion made one (``transforms.conversion``).
    """
    if schema.QTY_REMAINDER in converted.collect_schema():
        carry = (*carry, schema.QTY_REMAINDER)
    usage = converted.select(
        pl.col(schema.SCOPE),
        pl.lit(metric.rating_type).alias(schema.TYPE),
        pl.col(schema.BEGIN).cast(schema.TIME_POLARS),
        pl.col(schema.END).cast(schema.TIME_POLARS),
        pl.col(schema.QTY),
        pl.lit(0).cast(schema.PRICE_POLARS).alias(schema.PRICE),
        pl.lit(metric.unit).alias(schema.UNIT),
        *(pl.col(label_column(k)).alias(groupby_column(k)) for k in metric.groupby),
        *(pl.col(label_column(k)).alias(metadata_column(k)) for k in metric.metadata),
        *carry,
    )
    return add_time_keys(usage).filter(pl.col(schema.QTY).is_not_null())


def convert_metric(samples: pl.DataFrame, metric: MetricDef, context: NumericContext,
                   *carry: str) -> pl.DataFrame:
    """The usage points of one metric's raw samples (CloudKitty's conversion; see the module docstring).

    ``carry``: extra columns kept as they are.  Raises ``ValueError`` naming the metric for a quantity
    outside ``decimal(38, 18)``.
    """
    converted = convert_qty(samples.lazy(), VALUE, metric, context)
    try:
        usage = usage_columns(converted, metric, *carry).collect(engine="in-memory")
    except pl.exceptions.ComputeError as exc:  # the vectorized path overflowed
        raise ValueError(f"{metric.key}: {str(exc).strip().splitlines()[0]}") from None
    remainders = usage.get_column(schema.QTY_REMAINDER, default=None)
    if remainders is not None and remainders.null_count() == usage.height:  # every qty is exact
        return usage.drop(schema.QTY_REMAINDER)
    return usage


def convert_samples(raw: pa.RecordBatch | list[pa.RecordBatch], metrics: Iterable[MetricDef],
                    context: NumericContext | None = None) -> pa.RecordBatch:
    """Raw-sample batches (whole frames, any metrics of ``metrics``) → one usage batch of their frames.

    ``context`` defaults to the one recorded on the batches (one collector: one context).  Rows keep
    their order: batch by batch, and within a batch as the collector returned them.
    """
    raws = [raw] if isinstance(raw, pa.RecordBatch) else raw
    context = numeric_context(raws[0]) if context is None else context
    frames = [f for b in raws for f in manifest(b)]
    table = concat_batches(raws)
    if table is None:
        return with_manifest(empty_usage_batch(), frames)
    by_key = {m.key: m for m in metrics}
    samples = to_frame(table).with_row_index(_ROW)
    converted = [
        convert_metric(part, by_key[str(key)], context, _ROW)
        for (key,), part in samples.partition_by(METRIC, as_dict=True, maintain_order=True).items()
    ]
    usage = pl.concat(converted, how="diagonal_relaxed") if len(converted) > 1 else converted[0]
    if not usage.height:
        return with_manifest(empty_usage_batch(), frames)
    return to_batch(usage.sort(_ROW).drop(_ROW), frames, views=True)  # read back by the rating stage


class _ConvertFn(RebatchingFn):
    def __init__(self, metrics: tuple[MetricDef, ...], rebatch_rows: int) -> None:
        super().__init__(rebatch_rows)
        self._metrics = metrics

    def flush(self, batches: list[pa.RecordBatch], window: BoundedWindow) -> Iterator:
        try:
            yield convert_samples(batches, self._metrics)
            return
        except ValueError:  # some frame has a quantity too large: find it, convert the others
            pass
        done = []
        for raw in batches:
            try:
                done.append(convert_samples(raw, self._metrics))
            except ValueError as exc:
                reason = f"convert: {type(exc).__name__}: {exc}"
                for frame in manifest(raw):
                    self._tallies.inc("frames_failed_convert")
                    LOG.warning("scope %s period %s: %s", frame.scope_id, frame.begin.isoformat(), reason)
                    yield beam.pvalue.TaggedOutput(
                        FAILURES, FrameOutcome(frame.scope_id, frame.begin, False, CONVERT_STAGE, reason))
        if done:
            yield to_batch(concat_frames(done), [f for b in done for f in manifest(b)], views=True)


class ConvertUsage(beam.PTransform):
    """Raw-sample batches (whole frames) → usage batches (main, re-batched) + ``failures`` outcomes + ``tallies``."""

    def __init__(self, metrics: tuple[MetricDef, ...], rebatch_rows: int) -> None:
        super().__init__()
        self._fn = _ConvertFn(tuple(metrics), rebatch_rows)

    def expand(self, raw: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        """Convert each frame's raw samples; frames that cannot be converted go to ``failures``."""
        # The main output is typed so Beam encodes batches with the Arrow IPC coder, not pickle.
        return raw | beam.ParDo(self._fn).with_output_types(pa.RecordBatch).with_outputs(FAILURES, TALLIES, main="usage")

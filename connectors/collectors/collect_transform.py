"""``CollectUsage``: one collector call per scope × period × metric, one Arrow batch per frame.

The fan-out unit is the frame (scope, period): its metrics are collected one call each and joined
into a single batch, because a frame is CloudKitty's unit of failure — one metric that fails fails
the period (spec §6.4) — and the state commit needs every frame whole in one batch.  A frame with
no data at all still emits a 0-row batch so that it can be acknowledged and committed.

Delivery: at-least-once per frame; a failed frame is reported as a ``FrameOutcome`` on the
``failures`` output and emits no usage.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics

from ratebeam.connectors.errors import ConnectorError, NoDataCollected, is_frame_failure
from ratebeam.connectors.registry import make_collector
from ratebeam.failpoints import failpoint
from ratebeam.transforms.frames import (
    Frame,
    FrameOutcome,
    concat_frames,
    empty_usage_batch,
    to_batch,
    with_manifest,
)
from ratebeam.transforms.metric_defs import MetricDef

LOG = logging.getLogger(__name__)
FAILURES = "failures"


class _CollectFn(beam.DoFn):
    def __init__(self, collector_config: Any, metrics: tuple[MetricDef, ...], period: int, scope_key: str) -> None:
        self._config = collector_config
        self._scope_key = scope_key
        self._metrics = metrics
        self._period = period
        self._points = Metrics.counter("ratebeam", "points_collected")
        self._requests = Metrics.counter("ratebeam", "collector_calls")
        self._nodata = Metrics.counter("ratebeam", "metrics_without_data")
        self._failed = Metrics.counter("ratebeam", "frames_failed_collect")

    def setup(self) -> None:
        self._collector = make_collector(self._config, self._scope_key)

    def process(self, item: tuple[str, datetime]):
        scope_id, begin = item
        frame = Frame(scope_id, begin)
        end = begin + timedelta(seconds=self._period)
        batches: list[pa.RecordBatch] = []
        for metric in self._metrics:
            failpoint("collect")
            self._requests.inc()
            try:
                batches.append(self._collector.collect(scope_id, begin, end, metric))
            except NoDataCollected:
                self._nodata.inc()
            except ConnectorError as exc:  # one frame fails; a fatal error stops the run
                if not is_frame_failure(exc):
                    raise
                self._failed.inc()
                reason = f"collect {metric.key}: {type(exc).__name__}: {exc}"
                LOG.warning("scope %s period %s: %s", scope_id, begin.isoformat(), reason)
                yield beam.pvalue.TaggedOutput(
                    FAILURES, (scope_id, FrameOutcome(scope_id, begin, False, "collect", reason))
                )
                return
        rows = sum(b.num_rows for b in batches)
        self._points.inc(rows)
        if rows:
            yield to_batch(concat_frames(batches), [frame])
        else:
            yield with_manifest(empty_usage_batch(), [frame])

    def teardown(self) -> None:
        collector = getattr(self, "_collector", None)
        if collector is not None:
            collector.close()


class CollectUsage(beam.PTransform):
    """(scope, period begin) → usage batches (one per frame) + ``failures`` outcomes."""

    def __init__(self, collector_config: Any, metrics: tuple[MetricDef, ...], period: int, scope_key: str) -> None:
        super().__init__()
        self._fn = _CollectFn(collector_config, metrics, period, scope_key)

    def expand(self, items):
        # The main output is typed so Beam encodes batches with the Arrow IPC coder, not pickle.
        return items | beam.ParDo(self._fn).with_output_types(pa.RecordBatch).with_outputs(FAILURES, main="usage")

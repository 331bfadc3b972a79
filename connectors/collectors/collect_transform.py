"""``CollectUsage``: the raw samples of every frame, one collector call per scope × period × metric.

The unit of output is the frame (scope, period): its metrics' raw samples are joined into a single
batch, because a frame is CloudKitty's unit of failure — one metric that fails fails the period
(`cloudkitty/orchestrator.py:418-443`) — and the state commit needs every frame whole in one batch.  A frame with no data at
all still emits a 0-row batch so that it can be acknowledged and committed.  Conversion to usage
points is the next, pure, step (``transforms.convert_usage.ConvertUsage``).

Two shapes, one result:

- per scope: one call per scope × period × metric, inside one DoFn per frame; or, for a collector
  that ``collects_periods`` (files), one call per scope × metric for many periods, the frames of a
  bundle being grouped by scope (``_CollectFn``);
- batched, the Prometheus and Aetos collectors' default (``batched_metrics``: every metric their
  configuration says is exact for all scopes at once): work items are grouped by (period, metric),
  each group of a batched metric is one ``collect_all`` call for all its scopes, and the results are
  split by scope and regrouped by frame.  The grouping is in the graph, so there is exactly one query
  per (period, metric) however the frames were shuffled across workers.  In the same stage, the
  metrics that cannot be batched are collected scope by scope, and so is a batched metric whose
  query for all scopes was refused (a ``SkippableConnectorError``, e.g. Prometheus refusing it for
  ``query.max-samples``), so a query too big to send at once costs requests, not frames.  A
  collector without any batched metric uses the per-scope shape (no grouping at all).

Nothing is retried here: a batched query that failed with a ``RetriableConnectorError`` was
retried by the HTTP layer already, so it is not asked again scope by scope — with ``retries: 2``
a server that is down gets 3 attempts per query, not 3 more per scope; every scope's frame fails.

Delivery: at-least-once per frame; a failed frame is reported as a ``FrameOutcome`` on the
``failures`` output and emits no samples.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

import apache_beam as beam
import pyarrow as pa
from apache_beam import typehints
from apache_beam.transforms.window import BoundedWindow

from ratebeam.connectors.errors import (
    ConnectorError,
    NoDataCollected,
    RetriableConnectorError,
    is_frame_failure,
)
from ratebeam.connectors.registry import make_collector
from ratebeam.failpoints import failpoint
from ratebeam.transforms.convert_usage import (
    empty_samples,
    frame_samples,
    numeric_context,
    with_numeric_context,
)
from ratebeam.transforms.frames import COLLECT_STAGE, Frame, FrameOutcome, split_frames
from ratebeam.transforms.metric_defs import MetricDef
from ratebeam.transforms.rebatch import BufferingFn
from ratebeam.transforms.tallies import TALLIES, Tallies

LOG = logging.getLogger(__name__)
FAILURES = "failures"
T = TypeVar("T")

#: Batched mode, between the query and the frame: ((scope, begin ISO), (metric index, failure, samples)).
_Part = typehints.Tuple[typehints.Tuple[str, str], typehints.Tuple[int, str, pa.RecordBatch]]


class _CollectorFn(beam.DoFn):
    """A DoFn owning one collector (built on the worker) and the one guarded way to call it."""

    def __init__(self, collector_config: Any, period: int, scope_key: str) -> None:
        self._config = collector_config
        self._period = period
        self._scope_key = scope_key
        self._tallies = Tallies()

    def setup(self) -> None:
        self._collector = make_collector(self._config, self._scope_key)

    def _end(self, begin: datetime) -> datetime:
        return begin + timedelta(seconds=self._period)

    def _call(self, metric: MetricDef, call: Callable[[], T], where: str) -> tuple[T | None, str]:
        """``call()``; (result, '') on success, (None, '') when no data, (None, reason) when it failed."""
        result, reason, _ = self._attempt(metric, call, where)
        return result, reason

    def _attempt(self, metric: MetricDef, call: Callable[[], T], where: str) -> tuple[T | None, str, bool]:
        """As ``_call``, plus whether a failed call was refused (asked in smaller parts it may succeed).

        False for a ``RetriableConnectorError``: the server failed and the HTTP layer retried already.
        What the collector counted meanwhile (requests, samples left out) is tallied.
        """
        failpoint("collect")
        try:
            return call(), "", False
        except NoDataCollected:
            self._tallies.inc("metrics_without_data")
            return None, "", False
        except ConnectorError as exc:  # the frame(s) fail; a fatal error stops the run
            if not is_frame_failure(exc):
                raise
            reason = f"collect {metric.key}: {type(exc).__name__}: {exc}"
            LOG.warning("%s: %s", where, reason)
            return None, reason, not isinstance(exc, RetriableConnectorError)
        finally:
            self._tallies.observe(self._collector.counts())

    def teardown(self) -> None:
        collector = getattr(self, "_collector", None)
        if collector is not None:
            collector.close()


def _collect_failure(frame: Frame, reason: str) -> FrameOutcome:
    return FrameOutcome(frame.scope_id, frame.begin, False, COLLECT_STAGE, reason)


#: Work items a collect worker gathers before collecting them, grouped by scope (``collect_periods``).
FRAMES_PER_FLUSH = 1024
#: Periods of one scope asked in one ``collect_periods`` call at most (a week of hours): bounds its rows.
PERIODS_PER_CALL = 168


class _CollectFn(_CollectorFn, BufferingFn[tuple[str, datetime]]):
    """Per scope: (scope, begin) → raw samples, many periods of a scope per call where the collector can.

    A collector that ``collects_periods`` (the file collector) is asked once per metric for up to
    ``PERIODS_PER_CALL`` periods of a scope: the work items are buffered (``FRAMES_PER_FLUSH`` per
    window) and grouped by scope, and one batch carries all those frames, so per-frame costs (a
    call, a batch, a manifest) are paid per scope; a group larger than ``rebatch_rows`` is cut
    between frames (``split_frames``), so batches stay as large as configured.  A grouped call
    that fails with a frame failure is made again period by period, so one bad period fails only
    its own frame.  Other collectors are called frame by frame, as each item arrives (a buffer of
    one).
    """

    def __init__(self, collector_config: Any, metrics: tuple[MetricDef, ...], period: int, scope_key: str,
                 rebatch_rows: int | None = None) -> None:
        _CollectorFn.__init__(self, collector_config, period, scope_key)
        BufferingFn.__init__(self, 1)
        self._metrics = metrics
        self._rebatch_rows = rebatch_rows

    def setup(self) -> None:
        super().setup()
        self._limit = FRAMES_PER_FLUSH if self._collector.collects_periods else 1

    def weight(self, element: tuple[str, datetime]) -> int:
        """A work item is one frame."""
        return 1

    def flush(self, elements: list[tuple[str, datetime]], window: BoundedWindow) -> Iterator:
        """Collect the buffered frames, scope by scope."""
        by_scope: dict[str, set[datetime]] = {}
        for scope_id, begin in elements:
            by_scope.setdefault(scope_id, set()).add(begin)
        for scope_id, found in by_scope.items():
            begins = sorted(found)
            if len(begins) == 1 or not self._collector.collects_periods:
                for begin in begins:
                    yield from self._collect_frame(scope_id, begin)
                continue
            for i in range(0, len(begins), PERIODS_PER_CALL):
                yield from self._collect_periods(scope_id, begins[i:i + PERIODS_PER_CALL])

    def _collect_periods(self, scope_id: str, begins: list[datetime]) -> Iterator:
        """One ``collect_periods`` call per metric for the scope's ``begins``; period by period if one fails."""
        where = f"scope {scope_id} {len(begins)} periods from {begins[0].isoformat()}"
        batches: list[pa.RecordBatch] = []
        for metric in self._metrics:
            self._tallies.inc("collector_calls")
            batch, reason = self._call(
                metric, partial(self._collector.collect_periods, scope_id, begins, self._period, metric), where)
            if reason:
                LOG.warning("%s: collecting period by period instead", where)
                for begin in begins:
                    yield from self._collect_frame(scope_id, begin)
                return
            if batch is not None:
                batches.append(batch)
        samples = frame_samples(batches, [Frame(scope_id, b) for b in begins], self._collector.numeric_context)
        self._tallies.inc("points_collected", samples.num_rows)
        yield from split_frames(samples, self._rebatch_rows) if self._rebatch_rows else [samples]

    def _collect_frame(self, scope_id: str, begin: datetime) -> Iterator:
        """One frame: one ``collect`` call per metric; the first metric that fails fails the frame."""
        frame, end = Frame(scope_id, begin), self._end(begin)
        batches: list[pa.RecordBatch] = []
        for metric in self._metrics:
            self._tallies.inc("collector_calls")
            batch, reason = self._call(
                metric, partial(self._collector.collect, scope_id, begin, end, metric),
                f"scope {scope_id} period {begin.isoformat()}",
            )
            if reason:
                self._tallies.inc("frames_failed_collect")
                yield beam.pvalue.TaggedOutput(FAILURES, _collect_failure(frame, reason))
                return
            if batch is not None:
                batches.append(batch)
        samples = frame_samples(batches, [frame], self._collector.numeric_context)
        self._tallies.inc("points_collected", samples.num_rows)
        yield samples


class _QueryAllScopesFn(_CollectorFn):
    """Batched: ((begin, metric index), scopes) → one part per scope.

    The parts come from one ``collect_all`` call for a batched metric, else (not batched, or that
    call refused) from one ``collect`` call per scope.
    """

    def __init__(
        self, collector_config: Any, metrics: tuple[MetricDef, ...], batched: tuple[bool, ...], period: int,
        scope_key: str,
    ) -> None:
        super().__init__(collector_config, period, scope_key)
        self._metrics = metrics
        self._batched = batched

    def process(self, group: tuple[tuple[str, int], Iterable[str]]):
        """The parts of one (period, metric) group, then what was counted."""
        yield from self._query(*group)
        yield from self._tallies.drain()

    def _query(self, key: tuple[str, int], scopes: Iterable[str]):
        begin_iso, index = key
        scopes = list(dict.fromkeys(scopes))
        metric, begin = self._metrics[index], datetime.fromisoformat(begin_iso)
        end = self._end(begin)
        self._tallies.inc("collector_calls", len(scopes))
        found: dict[str, pa.RecordBatch] | None = None
        failed = ""  # the batched query failed after its retries: so does every scope's part
        if self._batched[index]:
            where = f"{len(scopes)} scope(s) period {begin_iso}"
            found, failed, refused = self._attempt(
                metric, lambda: self._collector.collect_all(begin, end, metric), where)
            if refused:
                LOG.warning("%s: collecting %s scope by scope instead", where, metric.key)
                failed = ""
            elif not failed:
                found = found or {}
        empty = with_numeric_context(empty_samples(), self._collector.numeric_context)
        for scope in scopes:
            reason = failed
            if failed:
                batch = None
            elif found is not None:
                batch = found.get(scope)
                if batch is None:
                    self._tallies.inc("metrics_without_data")
            else:
                batch, reason = self._call(
                    metric, partial(self._collector.collect, scope, begin, end, metric),
                    f"scope {scope} period {begin_iso}",
                )
            samples = empty if batch is None else with_numeric_context(batch, self._collector.numeric_context)
            yield (scope, begin_iso), (index, reason, samples)


class _AssembleFrameFn(beam.DoFn):
    """Batched: every metric's part of one frame → the frame's raw samples, or its failure."""

    def __init__(self) -> None:
        self._tallies = Tallies()

    def process(self, keyed: tuple[tuple[str, str], Iterable[tuple[int, str, pa.RecordBatch]]]):
        """The frame's samples or failure, then what was counted."""
        yield from self._assemble(*keyed)
        yield from self._tallies.drain()

    def _assemble(self, key: tuple[str, str], parts: Iterable[tuple[int, str, pa.RecordBatch]]):
        scope_id, begin_iso = key
        frame = Frame(scope_id, datetime.fromisoformat(begin_iso))
        by_metric = dict(sorted((index, (reason, batch)) for index, reason, batch in parts))
        reasons = [reason for reason, _ in by_metric.values() if reason]
        if reasons:  # one metric failing fails the frame (`cloudkitty/orchestrator.py:418-443`)
            self._tallies.inc("frames_failed_collect")
            yield beam.pvalue.TaggedOutput(FAILURES, _collect_failure(frame, reasons[0]))
            return
        batches = [batch for _, batch in by_metric.values()]
        samples = frame_samples(batches, [frame], numeric_context(batches[0]))
        self._tallies.inc("points_collected", samples.num_rows)
        yield samples


class _BatchedCollect(beam.PTransform):
    """Batched collection as its own stage: group by (period, metric), query, regroup by frame."""

    def __init__(
        self, collector_config: Any, metrics: tuple[MetricDef, ...], batched: tuple[bool, ...], period: int,
        scope_key: str,
    ) -> None:
        super().__init__()
        self._query = _QueryAllScopesFn(collector_config, metrics, batched, period, scope_key)
        self._metrics = len(metrics)

    def expand(self, items: beam.PCollection) -> dict[str, beam.PCollection]:
        count = self._metrics
        parts = (
            items
            | "ByPeriodAndMetric" >> beam.FlatMap(
                lambda item: [((item[1].isoformat(), i), item[0]) for i in range(count)]
            ).with_output_types(typehints.Tuple[typehints.Tuple[str, int], str])
            | "GroupQueries" >> beam.GroupByKey()
            | "QueryAllScopes" >> beam.ParDo(self._query).with_output_types(_Part).with_outputs(TALLIES, main="parts")
        )
        frames = (
            parts.parts
            | "ByFrame" >> beam.GroupByKey()
            | "AssembleFrames" >> beam.ParDo(_AssembleFrameFn())
            .with_output_types(pa.RecordBatch).with_outputs(FAILURES, TALLIES, main="samples")
        )
        tallies = (parts.tallies, frames.tallies) | "Tallies" >> beam.Flatten()
        return {"samples": frames.samples, FAILURES: frames[FAILURES], TALLIES: tallies}


def batched_metrics(collector_config: Any, metrics: tuple[MetricDef, ...]) -> tuple[bool, ...]:
    """For each metric, whether it is collected for all scopes at once.

    The collector section decides: its ``batched_metrics(metrics)`` when it has one (Prometheus,
    Aetos: automatic by default), else its plain ``batched`` option for every metric (Gnocchi).
    """
    options = getattr(collector_config, "options", collector_config)
    decide = getattr(options, "batched_metrics", None)
    if decide is not None:
        return tuple(decide(metrics))
    return (bool(getattr(options, "batched", False)),) * len(metrics)


class CollectUsage(beam.PTransform):
    """(scope, period begin) → raw-sample batches (``samples``, whole frames each) + ``failures`` outcomes + ``tallies``."""

    def __init__(self, collector_config: Any, metrics: tuple[MetricDef, ...], period: int, scope_key: str,
                 rebatch_rows: int | None = None) -> None:
        """``rebatch_rows``: the most rows a batch of many frames holds (the rating batches' size)."""
        super().__init__()
        self._args = (collector_config, tuple(metrics), period, scope_key)
        self._rebatch_rows = rebatch_rows

    def expand(self, items: beam.PCollection) -> dict[str, beam.PCollection]:
        """The batched stage when at least one metric is batched, else per-scope calls."""
        config, metrics, period, scope_key = self._args
        batched = batched_metrics(config, metrics)
        if any(batched):
            return items | "Batched" >> _BatchedCollect(config, metrics, batched, period, scope_key)
        # The main output is typed so Beam encodes batches with the Arrow IPC coder, not pickle.
        collect = _CollectFn(*self._args, self._rebatch_rows)
        outputs = items | beam.ParDo(collect).with_output_types(pa.RecordBatch).with_outputs(FAILURES, TALLIES,
                                                                                             main="samples")
        return {"samples": outputs.samples, FAILURES: outputs[FAILURES], TALLIES: outputs[TALLIES]}

"""What ``/metrics`` and ``run --metrics-file`` report: the runner's counters and the database's figures.

Two kinds of figures, both prometheus-client collectors (``collect()`` yields metric families):

* :class:`JobCounters`: the Beam counters of the current job (``serve``, ``events serve``) or of
  the run (``run``), as the launcher last read them, each as ``ratebeam_<counter>``.  Gauges, not
  counters: a restarted job starts again from 0 (Prometheus' ``rate()`` would misread a reset of
  a job that is not a process restart).
* :class:`DatabaseFigures` and :class:`EventStreamFigures`: read from SQL at scrape time, so they
  are the truth now whoever did the work (another replica, a ``run`` from cron): the frames still
  failing (open dead letters), each active scope's lag behind the wall clock, the event inbox's
  depth, the stream's watermark lag and its late notifications.  One scrape is a handful of
  indexed queries; a database that does not answer gives ``ratebeam_database_up 0`` and the
  rest of the scrape still comes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ratebeam.pipelines.config import RatebeamConfig

LOG = logging.getLogger(__name__)


class JobCounters(Collector):
    """The latest counters of a job (``update``), each as the gauge ``ratebeam_<name>``.

    ``always`` names counters shown as 0 before the runner reports them (a dashboard's series
    exist from the first scrape); ``per_scope`` is a labelled family of per-scope figures.
    """

    def __init__(self, always: tuple[str, ...] = (), per_scope: tuple[str, str] | None = None) -> None:
        self._always = always
        self._per_scope = per_scope  # (metric name, help)
        self._counters: dict[str, int] = {}
        self._scopes: dict[str, int] = {}

    def update(self, counters: dict[str, int], per_scope: dict[str, int] | None = None) -> None:
        """Replace the figures with the runner's latest answer."""
        self._counters = dict(counters)
        if per_scope is not None:
            self._scopes = dict(per_scope)

    def collect(self) -> Iterator[Metric]:
        """One gauge per counter (those of ``always`` first, then any other the job has)."""
        for name in dict.fromkeys((*self._always, *sorted(self._counters))):
            yield GaugeMetricFamily(f"ratebeam_{name}", f"Beam counter {name} of the current job",
                                    value=self._counters.get(name, 0))
        if self._per_scope is not None:
            family = GaugeMetricFamily(self._per_scope[0], self._per_scope[1], labels=["scope"])
            for scope, value in sorted(self._scopes.items()):
                family.add_metric([scope], value)
            yield family


def _database_up(up: bool) -> GaugeMetricFamily:
    return GaugeMetricFamily("ratebeam_database_up", "1 when the last scrape could read the database", value=int(up))


class DatabaseFigures(Collector):
    """The rating state read at scrape time: open dead letters, each active scope's lag, the oldest due period."""

    def __init__(self, config: RatebeamConfig) -> None:
        from ratebeam.connectors.sql.engine import make_engine

        self._config = config
        self._engine = make_engine(config.database_url)

    def collect(self) -> Iterator[Metric]:
        """Read and yield the figures (``ratebeam_database_up 0`` alone when the database does not answer)."""
        import sqlalchemy as sa

        try:
            families = self._read(datetime.now(UTC))
        except sa.exc.SQLAlchemyError as exc:
            LOG.warning("metrics: the database did not answer: %s", str(exc).splitlines()[0])
            yield _database_up(False)
            return
        yield _database_up(True)
        yield from families

    def _read(self, now: datetime) -> list[Metric]:
        import sqlalchemy as sa

        from ratebeam.connectors.sql.models import DeadLetter, MessageDeadLetter
        from ratebeam.connectors.sql.state_store import StateStore

        c = self._config
        states = [s for s in StateStore(self._engine, c.scope_key, c.fetcher.backend, c.collector.backend)
                  .list_states(active=True) if s.last_processed is not None]
        with self._engine.connect() as conn:
            frames = conn.execute(sa.select(sa.func.count()).select_from(DeadLetter)
                                  .where(DeadLetter.resolved_at.is_(None))).scalar_one()
            messages = conn.execute(sa.select(sa.func.count()).select_from(MessageDeadLetter)).scalar_one()
        dead = GaugeMetricFamily("ratebeam_dead_letters_open",
                                 "Dead letters not resolved: failed frames (kind=frame), unreadable bus messages "
                                 "(kind=message)", labels=["kind"])
        dead.add_metric(["frame"], frames)
        dead.add_metric(["message"], messages)
        period = timedelta(seconds=c.period)
        lag = GaugeMetricFamily("ratebeam_scope_lag_seconds",
                                "Seconds between now and the end of the scope's last committed period",
                                labels=["scope"])
        for s in states:
            lag.add_metric([s.scope], max(0.0, (now - (s.last_processed + period)).total_seconds()))
        oldest = min((s.last_processed for s in states), default=None)
        due = GaugeMetricFamily("ratebeam_oldest_due_period_lag_seconds",
                                "How far the oldest due period of an active scope lags behind the wall clock",
                                value=0.0 if oldest is None else max(0.0, (now - (oldest + period)).total_seconds()))
        return [dead, lag, due]


class EventStreamFigures(Collector):
    """The event stream read from its inbox at scrape time: depth, watermark lag, late notifications.

    The watermark of the stream's source is the latest notification time it has read into Beam
    (``pipelines.events.source``); the inbox records which rows a job read (``emitted_run``), so
    the latest ``generated`` among them is that watermark, durable across job restarts.
    """

    def __init__(self, database_url: str) -> None:
        from ratebeam.connectors.sql.engine import make_engine

        self._engine = make_engine(database_url)

    def collect(self) -> Iterator[Metric]:
        """Read and yield the figures (``ratebeam_database_up 0`` alone when the database does not answer)."""
        import sqlalchemy as sa

        from ratebeam.connectors.sql.models import EventInbox

        now = datetime.now(UTC)
        try:
            with self._engine.connect() as conn:
                depth = conn.execute(sa.select(sa.func.count()).select_from(EventInbox)
                                     .where(EventInbox.finished_at.is_(None))).scalar_one()
                late = conn.execute(sa.select(sa.func.count()).select_from(EventInbox)
                                    .where(EventInbox.late_at.is_not(None))).scalar_one()
                watermark = conn.execute(sa.select(sa.func.max(EventInbox.generated))
                                         .where(EventInbox.emitted_run.is_not(None))).scalar_one()
        except sa.exc.SQLAlchemyError as exc:
            LOG.warning("metrics: the database did not answer: %s", str(exc).splitlines()[0])
            yield _database_up(False)
            return
        yield _database_up(True)
        yield GaugeMetricFamily("ratebeam_events_inbox_depth",
                                "Notifications in the inbox not finished yet (their frame not stored)", value=depth)
        yield GaugeMetricFamily("ratebeam_events_late_recorded",
                                "Notifications recorded late (after their trigger's fire_delay), for events reprocess",
                                value=late)
        if watermark is not None:  # no notification read yet: no watermark, no series
            yield GaugeMetricFamily("ratebeam_events_watermark_lag_seconds",
                                    "Seconds between now and the latest notification time the stream has read",
                                    value=max(0.0, (now - watermark).total_seconds()))


class CallCounts(Collector):
    """Calls handled by ``rpc``, by method and outcome (``ratebeam_rpc_calls_total``)."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}

    def count(self, method: str, outcome: str) -> None:
        """One more call of ``method`` that ended ``ok`` or ``error``."""
        self._counts[(method, outcome)] = self._counts.get((method, outcome), 0) + 1

    def collect(self) -> Iterator[Metric]:
        """The counts so far (a process restart starts them again, as a Prometheus counter does)."""
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily("ratebeam_rpc_calls", "CloudKitty RPC calls handled", labels=["method", "outcome"])
        for (method, outcome), value in sorted(self._counts.items()):
            family.add_metric([method, outcome], value)
        yield family

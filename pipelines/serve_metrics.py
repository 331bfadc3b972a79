"""What ``ratebeam serve`` tells an operator: its Beam counters in the log and on ``/metrics``.

The launcher polls the job's Beam metrics (periods planned and committed, points rated and
written, failed frames, per-scope failures) and reads from the state table how far the oldest due
period lags behind the wall clock — the figure to alert on when rating falls behind.  It logs them
when they change (at least once per tick) and, with ``--metrics-port``, serves them for Prometheus
(``prometheus-client``, the ``ratebeam[service]`` extra) on ``/metrics``, beside the database's
figures read at scrape time and the health endpoints (``pipelines.ops``).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from ratebeam.pipelines.config import RatebeamConfig

LOG = logging.getLogger(__name__)

#: The option that asks for the endpoint (and so for the ``service`` extra's prometheus-client).
METRICS_PORT = "--metrics-port"
#: Beam counters exposed as ``ratebeam_<name>`` (running totals of the current job).
EXPOSED = ("cycles", "heartbeats", "scopes_fetched", "scopes_leased", "scopes_skipped_leased_elsewhere",
           "periods_planned", "periods_committed", "points_collected", "points_rated", "points_written",
           "scopes_with_failures", "frames_failed_collect", "frames_failed_rate", "frames_failed_write", "scopes_lease_lost")


def oldest_due_lag_seconds(config: RatebeamConfig, now: datetime) -> float:
    """Seconds between ``now`` and the begin of the oldest period due on an active scope (0: none due)."""
    from ratebeam.connectors.sql.state_store import StateStore

    store = StateStore(_engine(config), config.scope_key, config.fetcher.backend, config.collector.backend)
    try:
        states = [s for s in store.list_states(active=True) if s.last_processed is not None]
    finally:
        store.engine.dispose()
    if not states:
        return 0.0
    oldest = min(s.last_processed for s in states) + timedelta(seconds=config.period)
    return max(0.0, (now - oldest).total_seconds())


def _engine(config: RatebeamConfig) -> Engine:
    from ratebeam.connectors.sql.engine import make_engine

    return make_engine(config.database_url)


class ServiceMetrics:
    """Logs the job's counters when they change; serves them, health and the database's figures on ``port``.

    The loop calls :meth:`update` at each poll: that is its heartbeat (``/healthz/live``).  Ready
    (``/healthz/ready``) means the database answers and the runner's job runs (``job.state``).
    """

    def __init__(self, config: RatebeamConfig, port: int | None, host: str = "0.0.0.0") -> None:
        from ratebeam.pipelines.ops.health import JobState, ServiceMonitor, database_check

        self._config = config
        self._last: dict[str, int] = {}
        self.job = JobState()
        self.monitor = ServiceMonitor("serve", port, host)
        self.monitor.add_check("database", database_check(config.database_url))
        self.monitor.add_check("runner", self.job.check)
        self._counters = None
        if self.monitor.registry is not None:
            from ratebeam.pipelines.ops.figures import DatabaseFigures, JobCounters

            self._counters = JobCounters(EXPOSED, ("ratebeam_scope_failed_frames",
                                                   "Failed frames of the running job, per scope"))
            self.monitor.register(self._counters)
            self.monitor.register(DatabaseFigures(config))

    def update(self, counters: dict[str, int], scope_failures: dict[str, int] | None = None) -> None:
        """Record the latest counters (and per-scope failures); log them if they changed; beat."""
        self.monitor.beat()
        if counters != self._last:
            self._last = dict(counters)
            lag = oldest_due_lag_seconds(self._config, datetime.now(UTC))
            LOG.info("serve: %s; oldest due period lags %.0fs",
                     ", ".join(f"{k}={counters.get(k, 0)}" for k in EXPOSED if k in counters) or "no counters yet", lag)
        if self._counters is not None:
            self._counters.update(counters, scope_failures)

    def close(self) -> None:
        """Stop serving."""
        self.monitor.close()

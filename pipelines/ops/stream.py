"""The event stream's health and metrics (``events serve --metrics-port``), in one object its launcher polls.

Kept here, not in the stream's modules, so the launcher (``pipelines.events.serve``) only calls
:meth:`StreamMonitor.poll` once per turn of its loop and :meth:`StreamMonitor.close` at the end.
Ready means: the database answers, the broker accepts a connection, the runner's job runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ratebeam.pipelines.ops.health import JobState, ServiceMonitor, broker_check, database_check

if TYPE_CHECKING:
    from ratebeam.pipelines.config import RatebeamConfig

#: The stream's counters shown from the first scrape (``ratebeam_<name>``; others appear once counted).
ALWAYS = ("notifications_received", "notifications_duplicate", "notifications_dead_letter", "frames_stored",
          "notifications_finished", "events_late", "events_unmatched", "source_polls")


class StreamMonitor:
    """Heartbeat, readiness (database, broker, job) and metrics of ``events serve``; silent without a port."""

    def __init__(self, config: RatebeamConfig, broker_url: str, port: int | None = None, host: str = "0.0.0.0") -> None:
        self.job = JobState()
        self.monitor = ServiceMonitor("events serve", port, host)
        self.monitor.add_check("database", database_check(config.database_url))
        self.monitor.add_check("broker", broker_check(broker_url))
        self.monitor.add_check("runner", self.job.check)
        self._counters = None
        if self.monitor.registry is not None:
            from ratebeam.pipelines.ops.figures import DatabaseFigures, EventStreamFigures, JobCounters

            self._counters = JobCounters(ALWAYS)
            for collector in (self._counters, EventStreamFigures(config.database_url), DatabaseFigures(config)):
                self.monitor.register(collector)

    def poll(self, state: str, counters: dict[str, int]) -> None:
        """One turn of the launcher's loop: beat, note the job's state, take its counters (``serve.job_metrics``)."""
        self.monitor.beat()
        self.job.state = state
        if self._counters is not None:
            self._counters.update(counters)

    def close(self) -> None:
        """Stop serving."""
        self.monitor.close()

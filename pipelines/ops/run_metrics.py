"""``ratebeam run``'s figures for Prometheus: a textfile for node_exporter, or a push to a Pushgateway.

Why: a ``run`` from cron or a systemd timer ends before any scrape could reach it.  Prometheus'
two answers for batch jobs are node_exporter's textfile collector (a ``*.prom`` file in its
``--collector.textfile.directory``, read at each scrape of the node) and the Pushgateway.  Both
get the same figures as ``serve``'s ``/metrics``: the run's counters (``ratebeam_<counter>``, with
``ratebeam_cycles 1``), its failed frames per scope, the database's figures after the run (open
dead letters, each scope's lag), and when it ended and with which status (alert on
``time() - ratebeam_run_last_end_timestamp_seconds`` for a run that stopped running).
The file is written by prometheus-client's ``write_to_textfile``: a temporary file renamed over
the old one, so the collector never reads half a file.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ratebeam.pipelines.config import RatebeamConfig
    from ratebeam.pipelines.cycle import CycleReport

#: The Pushgateway's job label of the pushed group.
PUSH_JOB = "ratebeam_run"


def run_registry(config: RatebeamConfig, report: CycleReport, status: int, started: float) -> CollectorRegistry:
    """A registry holding the run's figures (the database's read when it is collected)."""
    from prometheus_client import CollectorRegistry, Gauge

    from ratebeam.pipelines.ops.figures import DatabaseFigures, JobCounters
    from ratebeam.pipelines.serve_metrics import EXPOSED

    registry = CollectorRegistry()
    counters = JobCounters(EXPOSED, ("ratebeam_scope_failed_frames", "Failed frames of the run, per scope"))
    counters.update({**report.counters, "cycles": 1}, dict(Counter(f.scope_id for f in report.failures)))
    registry.register(counters)
    registry.register(DatabaseFigures(config))
    Gauge("ratebeam_run_last_end_timestamp_seconds", "When the last run ended (Unix time)",
          registry=registry).set(time.time())
    Gauge("ratebeam_run_duration_seconds", "How long the last run took", registry=registry).set(
        time.monotonic() - started)
    Gauge("ratebeam_run_exit_status", "The last run's exit status (0: every frame rated and committed)",
          registry=registry).set(status)
    return registry


def export(registry: CollectorRegistry, metrics_file: str | None, pushgateway: str | None) -> None:
    """Write the textfile (atomically) and/or push the group ``job=ratebeam_run`` (replacing the last run's)."""
    from prometheus_client import push_to_gateway, write_to_textfile

    from ratebeam.pipelines.commands.common import CommandError
    from ratebeam.pipelines.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED

    if metrics_file:
        try:
            write_to_textfile(metrics_file, registry)
        except OSError as exc:
            raise CommandError(f"--metrics-file {metrics_file}: {exc.strerror or exc}", EXIT_BAD_INPUT) from None
    if pushgateway:
        try:
            push_to_gateway(pushgateway, job=PUSH_JOB, registry=registry, timeout=30)
        except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
            raise CommandError(f"--pushgateway {pushgateway}: {exc}", EXIT_FAILED) from None

"""Reprocessing and backfill jobs: the cycle's graph fed with explicit (scope, period) ranges.

``job_stages`` swaps the cycle's planning and commit stages for ``PlanJobs`` / ``CommitJobs``
(``connectors.sql.job_transforms``); everything between — collect, convert, rate with the rules
valid at each period's begin, write — is the regular cycle's, scopes in parallel as there.

:func:`run_jobs` runs rounds of that graph until every range is done: each round rates at most
``chunk`` periods of every range, then commits their progress, so a crash costs at most one round
(re-rated, idempotently, by the next run), and progress is reported after each round.  A round
that moves nothing (scopes leased by another run, frames failing) ends the run: what is left is
reported and taken up by the next run.

Where jobs run: ``ratebeam reprocess run`` and ``ratebeam backfill``; ``ratebeam run`` runs the
pending reprocessing schedules after its cycle (as CloudKitty's processor runs its reprocessors),
and ``ratebeam serve`` adds a reprocessing branch to every tick (:class:`JobCycle`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import apache_beam as beam

from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.job_transforms import CommitJobs, JobSettings, PlanJobs, pending_jobs
from ratebeam.connectors.sql.jobs import REPROCESS, JobRange, JobStore
from ratebeam.connectors.sql.state_transforms import StateSettings
from ratebeam.pipelines.commands.progress import progress
from ratebeam.pipelines.config import RatebeamConfig
from ratebeam.pipelines.cycle import CycleStages, Planned, build_cycle, run_cycle
from ratebeam.transforms.chain_rater import ChainRaterFactory
from ratebeam.transforms.frames import FrameOutcome
from ratebeam.transforms.rate_dofn import RaterFactory


def job_stages(config: RatebeamConfig, job: JobSettings) -> Callable[[StateSettings], CycleStages]:
    """The stages of a job run, from the run's settings (``run_cycle(stages=...)``).

    A reprocessing re-rates periods already stored, so its writer also removes the types a
    period no longer has; a backfill only adds (another metric's points stay).
    """

    def make(settings: StateSettings) -> CycleStages:
        def plan(ticks: beam.PCollection) -> Planned:
            planned = ticks | "PlanJobs" >> PlanJobs(settings, job)
            return Planned(planned.items, planned.plans, (planned.tallies,))

        replace = config.period if job.kind == REPROCESS else None
        return CycleStages(plan, CommitJobs(settings), replace_period=replace)

    return make


class JobCycle(beam.PTransform):
    """The job's cycle as one composite step, beside the regular cycle of a ``serve`` tick."""

    def __init__(self, config: RatebeamConfig, rater: RaterFactory, settings: StateSettings,
                 job: JobSettings, failures_sink: beam.PTransform | None = None) -> None:
        super().__init__()
        self._args = (config, rater, settings, failures_sink)
        self._job = job

    def expand(self, ticks: beam.PCollection) -> beam.PCollection:
        """The cycle graph after ``ticks`` with the job's stages."""
        config, rater, settings, sink = self._args
        return build_cycle(ticks, config, rater, settings, sink, job_stages(config, self._job)(settings)).results


@dataclass
class JobsReport:
    """What a job run did: periods done of the total, points written, what is left and why."""

    total: int
    done: int = 0
    points: int = 0
    rounds: int = 0
    left: list[JobRange] = field(default_factory=list)
    failures: list[FrameOutcome] = field(default_factory=list)
    busy_scopes: int = 0

    @property
    def ok(self) -> bool:
        """Every range finished and no frame failed."""
        return not self.left and not self.failures


def job_store(config: RatebeamConfig) -> JobStore:
    """The job store of the configured database and (scope_key, fetcher, collector)."""
    return JobStore(make_engine(config.database_url), config.scope_key, config.fetcher.backend,
                    config.collector.backend)


def run_jobs(
    config: RatebeamConfig, rater: ChainRaterFactory, job: JobSettings, label: str, *,
    now: datetime, runner: str = "FnApiRunner", extra_options: list[str] | None = None,
) -> JobsReport:
    """Run rounds of the job's graph until its ranges are done or a round moves nothing."""
    store = job_store(config)
    try:
        pending = pending_jobs(store, job, config.period)
        report = JobsReport(total=sum(j.remaining(config.period) for j in pending))
        if not pending:
            return report
        with progress(report.total, "period", desc=label) as shown:
            while pending:
                cycle = run_cycle(config, rater, now=now, runner=runner, extra_options=extra_options,
                                  stages=job_stages(config, job))
                report.rounds += 1
                report.points += cycle.counters.get("points_written", 0)
                report.failures += cycle.failures
                report.busy_scopes = cycle.counters.get("job_scopes_busy", 0)
                after = pending_jobs(store, job, config.period)
                report.done = report.total - sum(j.remaining(config.period) for j in after)
                shown.set(report.done, report.total, points=report.points)
                moved = {(j.id, j.current) for j in after} != {(j.id, j.current) for j in pending}
                pending = after
                if not moved:
                    break
        report.left = pending
        return report
    finally:
        store.engine.dispose()

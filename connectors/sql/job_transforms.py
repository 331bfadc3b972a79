"""``PlanJobs`` and ``CommitJobs``: the planning and commit stages of reprocessing and backfill jobs.

They replace ``PlanPeriods`` / ``CommitState`` in the cycle's graph (``pipelines.cycle``): the
(scope, period) items come from explicit ranges (``connectors.sql.jobs``) instead of the scope
state, and the commit advances each range's progress mark instead of ``last_processed_timestamp``.

* Leases: a job takes the scope's lease like a regular run (owner ``<run>@<kind>@<tick>``, renewed
  by the run's heartbeat), so a regular run and a job never rate and write one scope at once; a
  scope whose lease is held elsewhere is skipped this round and planned again the next one.
* Several ranges of one scope are planned together under its one lease; a period two ranges
  share (CloudKitty's API refuses that, a hand-made row may not) is rated once.
* Progress is fenced by the lease and forward only: a range advances over the contiguous prefix
  of its planned periods that every backend acknowledged.  Each round plans at most ``chunk``
  periods per range, so a crash loses at most the round in flight, which the next run re-rates.
* The dead letters of the periods a range advances over are resolved in the same transaction.
* A backfill also moves the scope's regular state — forward only, and only when the periods it
  completed start where the regular cycle would continue (no gap is ever skipped).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import apache_beam as beam

from ratebeam.connectors.sql.dead_letters import resolve_frames
from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.jobs import BACKFILL, REPROCESS, JobRange, JobStore, Kind
from ratebeam.connectors.sql.state_store import ScopeState, StateStore
from ratebeam.connectors.sql.state_transforms import (
    OUTCOMES,
    PLANS,
    CommitByScope,
    Plan,
    StateSettings,
    committable_prefix,
)
from ratebeam.failpoints import failpoint
from ratebeam.transforms.frames import FrameOutcome
from ratebeam.transforms.periods import month_start
from ratebeam.transforms.tallies import TALLIES, Tallies

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobSettings:
    """Which jobs a run takes, and how many periods of each range one round plans."""

    kind: Kind
    chunk: int
    #: Backfill rows of this run (reprocessing takes every pending schedule).
    ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class JobPlan:
    """The ranges planned for one scope in one round, with their periods, under ``owner``'s lease."""

    owner: str
    now: datetime
    jobs: tuple[tuple[JobRange, tuple[datetime, ...]], ...]


def job_owner(run_owner: str, kind: Kind, now: datetime) -> str:
    """The lease owner of a job round (``StateStore.heartbeat(run_owner)`` renews it)."""
    return f"{run_owner}@{kind}@{now.isoformat()}"


def pending_jobs(store: JobStore, job: JobSettings, period: int) -> list[JobRange]:
    """The unfinished ranges a run of ``job`` works on."""
    if job.kind == REPROCESS:
        return store.pending_schedules()
    return store.backfills(list(job.ids), period)


def _stores(s: StateSettings) -> tuple[StateStore, JobStore]:
    engine = make_engine(s.database_url)
    return (StateStore(engine, s.scope_key, s.fetcher, s.collector),
            JobStore(engine, s.scope_key, s.fetcher, s.collector))


class _PlanJobsFn(beam.DoFn):
    def __init__(self, settings: StateSettings, job: JobSettings) -> None:
        self._s = settings
        self._job = job
        self._tallies = Tallies()

    def setup(self) -> None:
        self._state, self._jobs = _stores(self._s)

    def process(self, now: datetime):
        """The ranges' plans and work items, then what was counted."""
        yield from self._plan(now)
        yield from self._tallies.drain()

    def _plan(self, now: datetime):
        s, kind = self._s, self._job.kind
        by_scope: dict[str, list[JobRange]] = {}
        for job in pending_jobs(self._jobs, self._job, s.period):
            by_scope.setdefault(job.scope, []).append(job)
        owner = job_owner(s.owner, kind, now)
        for scope, jobs in sorted(by_scope.items()):
            if self._state.acquire(scope, owner, s.lease_seconds, datetime.now(UTC)) is None:
                self._tallies.inc("job_scopes_busy")
                LOG.info("scope %s: %s skipped this round, another run holds its lease", scope, kind)
                continue
            planned = tuple((job, job.next_begins(s.period, self._job.chunk)) for job in jobs)
            begins = sorted({b for _, bs in planned for b in bs})
            if not begins:  # only ranges that end before they start (a hand-made row): nothing to rate
                LOG.warning("scope %s: %s range(s) %s end before they start; skipped", scope, kind,
                            ", ".join(str(job.id) for job in jobs))
                self._state.release(scope, owner)
                continue
            self._tallies.inc("job_scopes_leased")
            self._tallies.inc("job_periods_planned", len(begins))
            LOG.info("scope %s: %s of %d period(s) from %s", scope, kind, len(begins), begins[0].isoformat())
            yield beam.pvalue.TaggedOutput(PLANS, (scope, JobPlan(owner, now, planned)))
            for begin in begins:
                yield scope, begin

    def teardown(self) -> None:
        state = getattr(self, "_state", None)
        if state is not None:
            state.engine.dispose()


class PlanJobs(beam.PTransform):
    """Ticks → (scope, period begin) items (main) + one ``JobPlan`` per leased scope (``plans``) + ``tallies``."""

    def __init__(self, settings: StateSettings, job: JobSettings) -> None:
        super().__init__()
        self._settings = settings
        self._job = job

    def expand(self, ticks: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        """Read the pending ranges, lease their scopes and plan the next periods of each."""
        return ticks | beam.ParDo(_PlanJobsFn(self._settings, self._job)).with_outputs(PLANS, TALLIES, main="items")


class _CommitJobsFn(beam.DoFn):
    def __init__(self, settings: StateSettings) -> None:
        self._s = settings
        self._tallies = Tallies()

    def setup(self) -> None:
        self._state, self._jobs = _stores(self._s)

    def process(self, keyed: tuple[str, dict[str, list]]):
        """Advance the scope's ranges, then what was counted."""
        yield from self._commit(*keyed)
        yield from self._tallies.drain()

    def _commit(self, scope_id: str, events: dict[str, list]):
        plans: list[JobPlan] = list(events[PLANS])
        outcomes: list[FrameOutcome] = list(events[OUTCOMES])
        if not plans:
            LOG.error("scope %s: job outcomes without a plan, progress left unchanged", scope_id)
            return
        plan = plans[0]
        failpoint("job-commit")
        failed: list[FrameOutcome] = []
        try:
            state = self._state.get(scope_id)
            with self._state.holding(scope_id, plan.owner, "advancing the jobs") as conn:
                if conn is None:
                    self._tallies.inc("job_scopes_lease_lost")
                    LOG.error("scope %s: lease lost before the job commit; progress unchanged", scope_id)
                for job, begins in plan.jobs:
                    last, job_failed = committable_prefix(Plan(begins, plan.owner), outcomes)
                    failed += job_failed
                    if conn is None or last is None or not self._jobs.advance(conn, job, last):
                        continue
                    # the frames just re-rated were maybe dead letters: closed with the progress
                    resolve_frames(conn, scope_id, [b for b in begins if b <= last])
                    self._tallies.inc("job_periods_done", begins.index(last) + 1)
                    if last >= job.last:
                        self._tallies.inc("jobs_finished")
                        LOG.info("scope %s: %s %d finished", scope_id, job.kind, job.id)
                    if job.kind == BACKFILL and _continues_state(job, last, state, plan.now, self._s.period):
                        self._state.commit_in(conn, scope_id, last)
        finally:
            self._state.release(scope_id, plan.owner)
        failed = sorted(set(failed), key=lambda o: o.begin)
        if failed:
            self._tallies.inc("scopes_with_failures")
        yield scope_id, None, failed

    def teardown(self) -> None:
        state = getattr(self, "_state", None)
        if state is not None:
            state.engine.dispose()


def _continues_state(job: JobRange, last: datetime, state: ScopeState | None, now: datetime, period: int) -> bool:
    """Whether a backfill done up to ``last`` may carry the regular state there (no gap skipped).

    True when the next period the regular cycle would rate (after the state, or the month start
    for a scope never rated) lies inside what the backfill completed, and the state is behind.
    """
    processed = None if state is None else state.last_processed
    following = month_start(now) if processed is None else processed + timedelta(seconds=period)
    return job.start <= following <= last


class CommitJobs(CommitByScope):
    """Advance each range over its acknowledged periods; emits (scope, None, failures)."""

    def __init__(self, settings: StateSettings) -> None:
        super().__init__(_CommitJobsFn(settings))

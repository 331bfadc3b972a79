"""``PlanPeriods`` and ``CommitState``: the scope state around a rating cycle, with a lease.

PlanPeriods takes (tick, scope) pairs — the tick is the ``now`` of the cycle, so a streaming job
plans each tick with its own clock — takes a lease on each scope (an atomic conditional upsert, so
two concurrent runs never rate the same scope), reads the state *after* taking it, skips inactive
scopes and emits every due period (catch-up, capped per cycle).  The lease lives in wall-clock
time and is kept alive by the launcher's heartbeat (``StateStore.heartbeat``).  CommitState gathers the outcome of every planned frame of a
scope, advances ``last_processed_timestamp`` over the contiguous prefix of acknowledged periods —
only while the lease is still ours (fencing) —, records the points each committed period stored
per metric type (``cell_points``) and releases the lease.  A period that failed
anywhere is not committed: the next run retries it, and idempotent writes make the retry harmless.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

import apache_beam as beam
from apache_beam.metrics import Metrics

from ratebeam.connectors.sql.cell_points import CellPointsStore
from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.state_store import StateStore
from ratebeam.failpoints import failpoint
from ratebeam.transforms.frames import FrameOutcome
from ratebeam.transforms.periods import due_periods, periods_left
from ratebeam.transforms.tallies import TALLIES, Tallies

LOG = logging.getLogger(__name__)
PLANS = "plans"
#: Namespace of the per-scope counters of failed frames (one counter per scope id).
SCOPE_FAILURES = "ratebeam.scope_failures"
OUTCOMES = "outcomes"


@dataclass(frozen=True)
class StateSettings:
    """What the state DoFns need; picklable so workers can rebuild their SQL clients."""

    database_url: str
    scope_key: str
    fetcher: str
    collector: str
    owner: str
    period: int
    wait_periods: int
    max_periods: int
    lease_seconds: int
    #: The rating types of metrics.yml: a committed period records its points for each (0 included).
    metric_types: tuple[str, ...] = ()

    def store(self) -> StateStore:
        """A state store on a new engine (engines do not pickle, so each worker makes its own)."""
        return StateStore(make_engine(self.database_url), self.scope_key, self.fetcher, self.collector)


@dataclass(frozen=True)
class Plan:
    """The periods PlanPeriods emitted for a scope (CommitState's list of what to expect).

    ``owner`` is the lease holder: the run's owner and the tick (``tick_owner``), so the ticks of
    one streaming run never share a lease and a tick that is still working on a scope makes the
    next tick skip it instead of rating it twice at once.
    """

    begins: tuple[datetime, ...]
    owner: str


def tick_owner(run_owner: str, now: datetime) -> str:
    """The lease owner of one tick of a run (``StateStore.heartbeat(run_owner)`` renews it)."""
    return f"{run_owner}@{now.isoformat()}"


class _PlanPeriodsFn(beam.DoFn):
    def __init__(self, settings: StateSettings) -> None:
        self._s = settings
        self._tallies = Tallies()
        #: How far the oldest due period lags behind the tick's clock (seconds): alert on it.
        self._lag = Metrics.gauge("ratebeam", "oldest_due_period_lag_seconds")

    def setup(self) -> None:
        self._store = self._s.store()

    def process(self, tick: tuple[datetime, str]):
        """The scope's plan and work items, then what was counted (every fetched scope comes here once)."""
        self._tallies.inc("scopes_fetched")
        yield from self._plan(*tick)
        yield from self._tallies.drain()

    def _plan(self, now: datetime, scope_id: str):
        s = self._s
        # Leases live in wall-clock time; ``now`` may be a pretend time (``run --now``).
        owner = tick_owner(s.owner, now)
        lease = self._store.acquire(scope_id, owner, s.lease_seconds, datetime.now(UTC))
        if lease is None:
            self._tallies.inc("scopes_skipped_leased_elsewhere")
            holder = self._store.holder(scope_id)
            if holder is None:
                LOG.info("scope %s: skipped, another run held its lease", scope_id)
            else:
                LOG.warning("scope %s: skipped, run %s holds its lease until %s (last heartbeat %s)", scope_id,
                            holder.owner, holder.expires_at.isoformat(), holder.heartbeat_at.isoformat())
            return
        if not lease.active:
            self._tallies.inc("scopes_skipped_inactive")
            LOG.info("scope %s: skipped, inactive", scope_id)
            self._store.release(scope_id, owner)
            return
        begins = tuple(due_periods(lease.last_processed, now, s.period, s.wait_periods, s.max_periods))
        if not begins:
            self._tallies.inc("scopes_up_to_date")
            self._store.release(scope_id, owner)
            return
        self._tallies.inc("scopes_leased")
        self._tallies.inc("periods_planned", len(begins))
        self._lag.set(int((now - begins[0]).total_seconds()))
        if len(begins) == s.max_periods:  # capped: the next run continues, and says how far behind
            self._tallies.inc("periods_left_by_cap", periods_left(begins[-1], now, s.period, s.wait_periods))
        LOG.info("scope %s: %d period(s) due from %s", scope_id, len(begins), begins[0].isoformat(),
                 extra={"periods_due": len(begins)})  # read by `ratebeam run`'s progress bar
        yield beam.pvalue.TaggedOutput(PLANS, (scope_id, Plan(begins, owner)))
        for begin in begins:
            yield scope_id, begin

    def teardown(self) -> None:
        store = getattr(self, "_store", None)
        if store is not None:
            store.engine.dispose()


class PlanPeriods(beam.PTransform):
    """(tick, scope id) → (scope, period begin) work items (main) + one ``Plan`` per leased scope (``plans``) + ``tallies``."""

    def __init__(self, settings: StateSettings) -> None:
        super().__init__()
        self._settings = settings

    def expand(self, scopes: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        """Lease each scope and plan its periods."""
        return scopes | beam.ParDo(_PlanPeriodsFn(self._settings)).with_outputs(PLANS, TALLIES, main="items")


def committable_prefix(plan: Plan, outcomes: list[FrameOutcome]) -> tuple[datetime | None, list[FrameOutcome]]:
    """The last begin of the contiguous run of planned periods whose every outcome is ok.

    A period counts as done when at least one ok outcome and no failure was reported for it.
    Returns that begin (None if the first period is not done) and the failures, oldest first.
    """
    ok = {o.begin for o in outcomes if o.ok}
    failed = sorted((o for o in outcomes if not o.ok), key=lambda o: o.begin)
    bad = {o.begin for o in failed}
    last = None
    for begin in plan.begins:
        if begin in bad or begin not in ok:
            break
        last = begin
    return last, failed


class _CommitStateFn(beam.DoFn):
    def __init__(self, settings: StateSettings) -> None:
        self._s = settings
        self._tallies = Tallies()

    def setup(self) -> None:
        self._store = self._s.store()
        self._cells = CellPointsStore(self._store.engine)

    def process(self, keyed: tuple[str, dict[str, list]]):
        """Commit the scope, then what was counted."""
        yield from self._commit(*keyed)
        yield from self._tallies.drain()

    def _commit(self, scope_id: str, events: dict[str, list]):
        plans: list[Plan] = list(events[PLANS])
        outcomes: list[FrameOutcome] = list(events[OUTCOMES])
        if not plans:  # outcomes without a plan cannot happen; refuse to guess
            LOG.error("scope %s: outcomes without a plan, state left unchanged", scope_id)
            return
        plan = plans[0]
        last, failed = committable_prefix(plan, outcomes)
        failpoint("commit")
        released = False
        try:
            if last is not None:
                done = plan.begins.index(last) + 1
                # One transaction per scope: the state moves, its cells are recorded and the lease is
                # given back together (three transactions per scope cost more than a scope's rating).
                moved = False
                with self._store.holding(scope_id, plan.owner, "committing the state") as conn:
                    if conn is not None and self._store.commit_in(conn, scope_id, last):
                        moved = True
                        self._cells.record_in(conn, scope_id, plan.begins[:done], outcomes, self._s.metric_types)
                        released = self._store.release_in(conn, scope_id, plan.owner)
                if moved:
                    self._tallies.inc("periods_committed", done)
                    LOG.info("scope %s: committed %d/%d period(s), now at %s", scope_id, done,
                             len(plan.begins), last.isoformat(), extra={"periods_committed": done})
                else:
                    self._tallies.inc("scopes_lease_lost")
                    LOG.error("scope %s: lease lost before commit; state unchanged (will be re-rated)", scope_id)
        finally:
            if not released:
                self._store.release(scope_id, plan.owner)
        if failed:
            self._tallies.inc("scopes_with_failures")
            Metrics.counter(SCOPE_FAILURES, scope_id).inc(len(failed))
        yield scope_id, last, failed

    def teardown(self) -> None:
        store = getattr(self, "_store", None)
        if store is not None:
            store.engine.dispose()


class CommitByScope(beam.PTransform):
    """``{PLANS: (scope, plan), OUTCOMES: FrameOutcome}`` joined by scope, then ``fn`` per scope.

    The two inputs stay separate, typed PCollections, joined by scope (CoGroupByKey); ``fn``
    receives (scope, {PLANS: [...], OUTCOMES: [...]}).  The commit of a regular cycle and of a job
    (``job_transforms.CommitJobs``) differ only in ``fn``.
    """

    def __init__(self, fn: beam.DoFn) -> None:
        super().__init__()
        self._fn = fn

    def expand(self, inputs: dict[str, beam.PCollection]) -> beam.pvalue.DoOutputsTuple:
        """Join plans and outcomes by scope and commit each scope: ``results`` and ``tallies``."""
        outcomes = inputs[OUTCOMES] | "KeyByScope" >> beam.Map(lambda o: (o.scope_id, o))
        return (
            {PLANS: inputs[PLANS], OUTCOMES: outcomes}
            | "ByScope" >> beam.CoGroupByKey()
            | "Commit" >> beam.ParDo(self._fn).with_outputs(TALLIES, main="results")
        )


class CommitState(CommitByScope):
    """Commit each scope's state over its acknowledged periods; emits (scope, last committed, failures)."""

    def __init__(self, settings: StateSettings) -> None:
        super().__init__(_CommitStateFn(settings))

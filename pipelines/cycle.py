"""The rating cycle as one Beam graph, and the launcher that runs it and reads its counters.

```
Ticks ─► FetchScopes ─► PlanPeriods ─► Reshuffle ─► CollectUsage ─► ConvertUsage ─► RateFrames ─► WriteToStorage
                              │ plans                      └──────────────┴─ failures ──┴─────────────┴─ outcomes
                              └──────────────────────────────────────────────────────────────► CommitState (by scope)
```
Every stage reports frames as ``FrameOutcome``; CommitState joins them with the plans by scope.
Every counting stage also emits its ``tallies`` (``transforms.tallies``): ``run_cycle`` sums them
into SQL under the run id (``RecordTallies``) and reads them back, so the summary, the exit status
and the "every scope busy" decision are the same on every runner, Dask's included (it has no
Beam metrics); ``serve`` reads the Beam counters of the same names while its job runs.
The planning stage (FetchScopes + PlanPeriods) and the commit are swappable (``CycleStages``):
reprocessing and backfill jobs (``pipelines.jobs``) feed the same graph with explicit ranges.
The ticks are the cycle's clock: one ``now`` for ``ratebeam run`` (``Create``), one per firing of
``PeriodicImpulse`` for ``ratebeam serve`` (``pipelines.serve``), each tick in its own window so
CommitState commits each tick on its own.  Both build the graph after the ticks with
:func:`build_cycle`, and both keep their leases alive with :func:`keep_leases` while they run.
Everything a worker needs travels in picklable settings; clients are built in ``DoFn.setup`` and
closed in ``teardown``, so the same graph runs on the DirectRunner (FnApiRunner, in memory), on
Prism (LOOPBACK, or an EXTERNAL worker process: tests/test_portable_runners.py) and on Flink.

A run that fails for any reason — an exception, a ``BaseException`` such as a Polars panic or
``KeyboardInterrupt`` — gives back every lease it took (they would block the scopes until they
expire, ``lease_seconds`` after the last heartbeat, otherwise; that is what a killed run leaves); a ``FatalConnectorError`` raised in a DoFn, which Beam hands back re-wrapped or only as
text, is found again (``connectors.errors.fatal_in``) and raised as such, without Beam's traceback
in the log, so the command line prints one line.  A Dask job that stalls is cancelled by its
runner (``pipelines.runners.dask_runner``) and ends here the same way: its leases given back, one line.
"""

from __future__ import annotations

import logging
import operator
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, redirect_stderr
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineResult
from sqlalchemy.exc import SQLAlchemyError

from ratebeam.connectors.collectors.collect_transform import FAILURES, CollectUsage
from ratebeam.connectors.errors import FATAL_MARKER, ConnectorError, fatal_in
from ratebeam.connectors.fetchers.fetch_transform import FetchScopes
from ratebeam.connectors.sql.dead_letters import DeadLetterStore, WriteDeadLetters
from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.lease_owner import make_owner
from ratebeam.connectors.sql.run_tallies import RecordTallies, RunTallyStore
from ratebeam.connectors.sql.state_store import LeaseHolder, StateStore
from ratebeam.connectors.sql.state_transforms import OUTCOMES, PLANS, CommitState, PlanPeriods, StateSettings
from ratebeam.connectors.storage.write_transform import WriteToStorage
from ratebeam.pipelines.config import RatebeamConfig
from ratebeam.transforms import arrow_coder
from ratebeam.transforms.chain_rater import ChainRaterFactory
from ratebeam.transforms.convert_usage import ConvertUsage
from ratebeam.transforms.frames import FrameOutcome
from ratebeam.transforms.rate_dofn import RateFrames, RaterFactory
from ratebeam.transforms.tallies import TALLIES

LOG = logging.getLogger(__name__)


@dataclass
class CycleReport:
    """What a cycle did: the tallies its graph recorded (``counters``) and its dead letters."""

    run_id: str
    counters: dict[str, int] = field(default_factory=dict)
    failures: list[FrameOutcome] = field(default_factory=list)
    #: Leases of other runs on this store's scopes when the cycle ended (why scopes were skipped).
    held_elsewhere: list[LeaseHolder] = field(default_factory=list)
    #: What the configuration takes but probably does not mean (``factor: 0``), said in the summary.
    warnings: list[str] = field(default_factory=list)
    #: (path, why) of each usage file the collector found and did not read, said in the summary.
    not_read: list[tuple[str, str]] = field(default_factory=list)

    @property
    def blocked(self) -> bool:
        """Nothing could be rated because other runs hold the leases of the due scopes."""
        c = self.counters
        return bool(c.get("scopes_skipped_leased_elsewhere", 0)) and not c.get("scopes_leased", 0)

    @property
    def ok(self) -> bool:
        """Whether every frame was rated and every scope committed (``ratebeam run`` exits 0)."""
        return not self.failures and not self.counters.get("scopes_lease_lost", 0) and not self.blocked


def state_settings(config: RatebeamConfig, run_id: str) -> StateSettings:
    """The state DoFns' settings of run ``run_id`` (its lease owner; the clock comes with each tick)."""
    return StateSettings(
        database_url=config.database_url,
        scope_key=config.scope_key,
        fetcher=config.fetcher.backend,
        collector=config.collector.backend,
        owner=make_owner(run_id),
        period=config.period,
        wait_periods=config.wait_periods,
        max_periods=config.max_periods_per_run,
        lease_seconds=config.lease_seconds,
        metric_types=config.metrics.rating_types if config.metrics is not None else (),
    )


@dataclass(frozen=True)
class Planned:
    """What a planning stage makes of the ticks: work items, plans and what it counted."""

    #: (scope, period begin) work items.
    items: beam.PCollection
    #: (scope, plan): what CommitState expects of each scope.
    plans: beam.PCollection
    tallies: tuple[beam.PCollection, ...]


#: ticks → ``Planned``: the swappable planning stage.
Planner = Callable[[beam.PCollection], Planned]


@dataclass(frozen=True)
class CycleOutputs:
    """The cycle graph's ends: per-scope commit results (scope, last, failures), and every stage's tallies."""

    results: beam.PCollection
    tallies: beam.PCollection


@dataclass(frozen=True)
class CycleStages:
    """What differs between a regular cycle and a job (reprocessing, backfill) in the one graph.

    ``plan`` makes the work items and the plans, ``commit`` joins the plans with the frames'
    outcomes (``{PLANS, OUTCOMES}``) and emits (scope, last, failures); ``replace_period`` set
    (the period, in seconds) makes the writer also remove the types a re-rated period no longer
    has (``WriteToStorage``), which only a re-rating needs.
    """

    plan: Planner
    commit: beam.PTransform
    replace_period: int | None = None


def regular_stages(config: RatebeamConfig, settings: StateSettings,
                   stage: Callable[[str, beam.PTransform], beam.PTransform] = operator.rshift) -> CycleStages:
    """The regular cycle's stages: fetch the scopes, plan what is due under leases, commit the state.

    ``stage(label, transform)`` labels a transform (and adds its resource hints, in ``build_cycle``).
    """

    def plan(ticks: beam.PCollection) -> Planned:
        fetched = ticks | stage("FetchScopes", FetchScopes(config.fetcher))
        planned = fetched.scopes | stage("PlanPeriods", PlanPeriods(settings))
        return Planned(planned.items, planned[PLANS], (fetched[TALLIES], planned[TALLIES]))

    return CycleStages(plan, CommitState(settings))


def stage_labeler(resource_hints: dict[str, dict[str, str]] | None) -> Callable[[str, beam.PTransform], beam.PTransform]:
    """``stage(label, transform)``: the transform labelled, with the runner config's resource hints of that label.

    Prism runs a stage with hints of its own in an SDK environment, so a worker process, of its own.
    """
    hints = resource_hints or {}

    def stage(label: str, transform: beam.PTransform) -> beam.PTransform:
        return label >> (transform.with_resource_hints(**hints[label]) if label in hints else transform)

    return stage


def build_cycle(
    ticks: beam.PCollection, config: RatebeamConfig, rater: RaterFactory, settings: StateSettings,
    failures_sink: beam.PTransform | None = None, stages: CycleStages | None = None,
    resource_hints: dict[str, dict[str, str]] | None = None,
) -> CycleOutputs:
    """Add the rating cycle after ``ticks`` (``now`` instants); returns the per-scope commit results and the tallies.

    ``rater`` makes the rater of each worker (a ``ChainRaterFactory``, or ``serve``'s per-tick one);
    ``stages`` default to :func:`regular_stages` (``pipelines.jobs`` passes a job's).
    ``resource_hints`` are Beam resource hints by stage label (``runner_config.CYCLE_STAGES``).
    """
    stage = stage_labeler(resource_hints)
    arrow_coder.register_arrow_coder()
    stages = stages or regular_stages(config, settings, stage)
    planned = stages.plan(ticks)
    items = planned.items | "Reshuffle" >> beam.Reshuffle()
    collected = items | stage("CollectUsage", CollectUsage(
        config.collector, config.metrics.metrics, config.period, config.scope_key, config.rebatch_rows
    ))
    usage = collected["samples"] | stage("ConvertUsage", ConvertUsage(config.metrics.metrics, config.rebatch_rows))
    rated = usage.usage | stage("Rate", RateFrames(rater, config.rebatch_rows))
    written = rated.rated | stage("Write", WriteToStorage(config.storage, stages.replace_period, config.scope_key))
    outcomes = ((collected[FAILURES], usage.failures, rated.failures, written.outcomes)
                | "Outcomes" >> beam.Flatten())
    committed = {PLANS: planned.plans, OUTCOMES: outcomes} | stage("CommitState", stages.commit)
    if failures_sink is not None:
        committed.results | "ReportFailures" >> failures_sink
    tallies = ((*planned.tallies, collected[TALLIES], usage.tallies, rated.tallies, written.tallies,
                committed.tallies) | "Tallies" >> beam.Flatten())
    return CycleOutputs(committed.results, tallies)


def run_cycle(
    config: RatebeamConfig,
    rater: ChainRaterFactory,
    now: datetime | None = None,
    runner: str = "FnApiRunner",
    extra_options: list[str] | None = None,
    run_id: str | None = None,
    stages: Callable[[StateSettings], CycleStages] | None = None,
    resource_hints: dict[str, dict[str, str]] | None = None,
) -> CycleReport:
    """Run one cycle to completion and report its tallies and failed frames.

    ``stages`` makes the stages from the run's settings (default: the regular cycle's).
    """
    run_id = run_id or uuid.uuid4().hex[:16]
    now = now or datetime.now(UTC)
    settings = state_settings(config, run_id)
    options = PipelineOptions([f"--runner={runner}", *(extra_options or [])])
    pipeline = beam.Pipeline(options=options)
    ticks = pipeline | "Tick" >> beam.Create([now])
    outputs = build_cycle(ticks, config, rater, settings, WriteDeadLetters(config.database_url, run_id),
                          stages(settings) if stages else None, resource_hints)
    outputs.tallies | "RecordTallies" >> RecordTallies(config.database_url, run_id)
    counters, failures = run_to_completion(pipeline, config.database_url, run_id, keep_leases(settings),
                                           lambda: release_leases(settings, "run failed"))
    held = leases_held_elsewhere(settings) if counters.get("scopes_skipped_leased_elsewhere") else []
    return CycleReport(run_id, counters, failures, held)


def run_to_completion(pipeline: beam.Pipeline, database_url: str, run_id: str,
                      guard: AbstractContextManager[Any] | None = None,
                      on_death: Callable[[], None] | None = None) -> tuple[dict[str, int], list[FrameOutcome]]:
    """Run a bounded ``pipeline`` to its end; run ``run_id``'s tallies and failed frames, as the graph stored them.

    ``guard`` is held while it runs (the cycle's lease keeper); on any death, a Rust panic or Ctrl-C
    included, ``on_death`` runs first (the cycle gives its leases back).  A fatal connector error
    anywhere in the graph is raised as itself, in one line, without Beam's traceback.
    """
    try:
        with quiet_fatal_tracebacks(), guard or nullcontext():
            pipeline.run().wait_until_finish()
    except BaseException as exc:
        if on_death is not None:
            on_death()
        fatal = fatal_in(exc)
        if fatal is None:
            raise
        raise fatal from None
    tallies, dead_letters = RunTallyStore(database_url), DeadLetterStore(database_url)
    try:
        return tallies.take(run_id), dead_letters.for_run(run_id)
    finally:
        tallies.engine.dispose()
        dead_letters.engine.dispose()


def beam_counters(result: PipelineResult, namespace: str = "ratebeam") -> dict[str, int]:
    """The pipeline's counters of ``namespace``, summed over steps (committed values where the runner has them)."""
    counters: dict[str, int] = {}
    for c in result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]:
        value = c.committed if c.committed is not None else c.attempted
        counters[c.key.metric.name] = counters.get(c.key.metric.name, 0) + (value or 0)
    return counters


def _store(settings: StateSettings) -> StateStore:
    return StateStore(make_engine(settings.database_url), settings.scope_key, settings.fetcher, settings.collector)


def release_leases(settings: StateSettings, why: str) -> int:
    """Give back every lease of the run (and of its ticks); returns how many."""
    store = _store(settings)
    try:
        released = store.release_all(settings.owner)
        LOG.info("%s: released %d lease(s) of %s", why, released, settings.owner)
        return released
    finally:
        store.engine.dispose()


def leases_held_elsewhere(settings: StateSettings) -> list[LeaseHolder]:
    """The leases other runs hold on this store's scopes."""
    store = _store(settings)
    try:
        return [h for h in store.leases() if h.owner != settings.owner and not h.owner.startswith(f"{settings.owner}@")]
    finally:
        store.engine.dispose()


def heartbeat_interval(lease_seconds: int) -> float:
    """How often a run renews its leases: three beats per lease, so one lost beat costs nothing."""
    return lease_seconds / 3


@contextmanager
def keep_leases(settings: StateSettings) -> Iterator[None]:
    """Renew the run's leases every :func:`heartbeat_interval` while the block runs.

    The launcher beats for every worker (one UPDATE covers every lease of the run, wherever it was
    taken), so a lease outlives a long cycle, and dies ``lease_seconds`` after the launcher does.
    A failed beat is logged and tried again at the next one.
    """
    stop = threading.Event()
    store = _store(settings)

    def beat() -> None:
        while not stop.wait(heartbeat_interval(settings.lease_seconds)):
            try:
                store.heartbeat(settings.owner, settings.lease_seconds, datetime.now(UTC))
            except (ConnectorError, SQLAlchemyError) as exc:  # keep beating: the database may come back
                LOG.warning("lease heartbeat of %s failed: %s", settings.owner, exc)

    thread = threading.Thread(target=beat, name="ratebeam-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        store.engine.dispose()


class _DropFatal(logging.Filter):
    """Drops Beam's log records of a fatal connector error (it is reported once, by the caller)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return FATAL_MARKER not in record.getMessage()


#: Loggers through which Beam reports a DoFn's exception with its traceback (the root logger:
#: the portable runner logs the job server's messages, Prism's "bundle ... failed: Traceback" there).
_BEAM_ERROR_LOGGERS = ("apache_beam.runners.common", "apache_beam.runners.worker.sdk_worker", "")


class _DropFatalText:
    """``sys.stderr`` without the tracebacks of fatal errors a LOOPBACK SDK worker prints itself.

    The worker runs in this process on a portable runner and prints them besides logging them.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        """Write ``text`` unless it carries a fatal error (already reported in one line)."""
        return len(text) if FATAL_MARKER in text else self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def quiet_fatal_tracebacks() -> Iterator[None]:
    """Keep Beam's and the LOOPBACK worker's tracebacks of a fatal error out of the log: it is reported in one line."""
    dropper = _DropFatal()
    loggers = [logging.getLogger(name) for name in _BEAM_ERROR_LOGGERS]
    for logger in loggers:
        logger.addFilter(dropper)
    try:
        with redirect_stderr(_DropFatalText(sys.stderr)):
            yield
    finally:
        for logger in loggers:
            logger.removeFilter(dropper)

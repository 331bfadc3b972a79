"""``ratebeam serve``: the rating cycle as one unbounded streaming job, like ``cloudkitty-processor``.

```
PeriodicImpulse (every interval, and once at start; one window per tick: pipelines.ticks) ─► build_cycle(...)
PeriodicImpulse "Heartbeat" (every 30 s at most) ─► CountBeats (``heartbeats``, for the watchdog)
```
The graph after the ticks is ``pipelines.cycle.build_cycle``, the one ``ratebeam run`` uses: each
tick fetches the scopes (new ones are picked up), plans what is due at its ``now`` under a lease
of its own (a scope a slower tick still holds is skipped), collects, rates, writes and commits
that tick's frames (CommitState groups per window).  A tick after downtime catches up (up to
``max_periods_per_run`` periods per scope).  So N ticks store what N bounded runs at the same
instants store, row for row.

* The clock: a tick's ``now`` is its impulse timestamp (wall clock), or, with ``--now``, simulated
  time: tick ``k`` rates up to ``--now + k × --step`` (tests, replays).
* Rules, module states and scripts are read again for each tick, on each worker, at the tick's
  first batch (:class:`ReloadingRaterFactory`, a handful of SQL statements), so a rule change
  made between two ticks applies from the next tick on, as it would between two ``ratebeam run``.
* The launcher beats for the run's leases (``cycle.keep_leases``), polls the job, logs its Beam
  counters per poll and serves them, with the database's figures (open dead letters, each scope's
  lag), on an optional Prometheus ``/metrics`` endpoint beside ``/healthz/live`` (the poll loop
  beats) and ``/healthz/ready`` (database reachable, job running) (``serve_metrics``).
* SIGTERM/SIGINT: the launcher waits for the current tick to finish (the run holds no lease any
  more), cancels the job, releases what is left and exits 0.
* A job that fails (a worker died, the runner lost it) is started again, as a new run, up to
  ``--max-restarts`` times: its leases are released first, and the new job's first tick catches
  up on what the dead one did not commit (writes are idempotent, commits fenced by the lease).
  A launcher that is killed itself stops beating: its leases expire ``lease_seconds`` later and
  the next ``serve`` or ``run`` takes the scopes over.
* A job whose heartbeat stops (not a beat for ``--stall-timeout`` seconds: the runner lost its SDK
  worker between two bundles and waits for it for ever) is cancelled and started again the same
  way (``ops.watchdog``).

It needs a runner that runs unbounded sources: Prism (``PortableRunner``) in tests, Flink in
production; the in-memory DirectRunner is refused with a clear message.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from types import FrameType

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineResult, PipelineState
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse

from ratebeam.connectors.sql.dead_letters import WriteDeadLetters
from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.job_transforms import JobSettings
from ratebeam.connectors.sql.jobs import REPROCESS
from ratebeam.connectors.sql.state_transforms import SCOPE_FAILURES, StateSettings
from ratebeam.pipelines.config import RatebeamConfig
from ratebeam.pipelines.cycle import (
    beam_counters,
    build_cycle,
    keep_leases,
    quiet_fatal_tracebacks,
    release_leases,
    state_settings,
)
from ratebeam.pipelines.jobs import JobCycle
from ratebeam.pipelines.ops.heartbeat import HEARTBEAT_S, CountBeats
from ratebeam.pipelines.ops.watchdog import STALL_TIMEOUT_S, STALLED, StallWatch
from ratebeam.pipelines.serve_metrics import ServiceMetrics
from ratebeam.pipelines.ticks import TickClock, impulse_span, run_seconds, tick_clock
from ratebeam.transforms.metric_defs import MetricsConfig
from ratebeam.transforms.rate_dofn import Rater

LOG = logging.getLogger(__name__)

#: Runners that execute unbounded sources (the Python DirectRunner/FnApiRunner do not, for PeriodicImpulse).
STREAMING_RUNNERS = ("PortableRunner", "FlinkRunner", "PrismRunner")
DONE_STATES = (PipelineState.DONE, PipelineState.CANCELLED, PipelineState.DRAINED)
FAILED_STATES = (PipelineState.FAILED, PipelineState.UNRECOGNIZED)


class ServeError(Exception):
    """``serve`` cannot run as asked (wrong runner, a job that keeps failing)."""


@dataclass(frozen=True)
class ReloadingRaterFactory:
    """A ``Rater`` factory that reads the rating setup from the database again for each tick."""

    database_url: str
    metrics: MetricsConfig

    def __call__(self) -> _ReloadingRater:
        """A rater for one worker (built in ``DoFn.setup``)."""
        return _ReloadingRater(self)


class _ReloadingRater:
    """The rater of each tick (a ``transforms.rate_dofn.PerTick``), read at the tick's first batch.

    A tick is a window of its own; the raters of the last :attr:`KEPT` ticks a worker saw are kept,
    so a tick whose bundles interleave with the next one's reads its setup once, not at each switch.
    """

    KEPT = 4

    def __init__(self, factory: ReloadingRaterFactory) -> None:
        self._factory = factory
        self._by_tick: dict[window.BoundedWindow, Rater] = {}

    def for_tick(self, tick: window.BoundedWindow) -> Rater:
        """The rater of ``tick``: the rules, module states and scripts as the tick's first batch found them."""
        rater = self._by_tick.get(tick)
        if rater is None:
            from ratebeam.pipelines.rating import load_rater

            engine = make_engine(self._factory.database_url)
            try:
                rater = self._by_tick[tick] = load_rater(engine, self._factory.metrics)()
            finally:
                engine.dispose()
            while len(self._by_tick) > self.KEPT:
                del self._by_tick[next(iter(self._by_tick))]  # the oldest tick seen
        return rater


@dataclass(frozen=True)
class ServeOptions:
    """How ``serve`` runs: runner and its options, tick interval, clock, how many ticks, metrics."""

    runner: str
    extra_options: tuple[str, ...] = ()
    interval: float = 3600.0
    simulated_from: datetime | None = None
    step: int = 0
    ticks: int | None = None  # None: forever
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    max_restarts: int = 3
    poll_s: float = 1.0
    resource_hints: dict[str, dict[str, str]] = field(default_factory=dict)  # by stage of the cycle
    stall_timeout: float = STALL_TIMEOUT_S  # seconds without a firing of the job's clock: stuck (ops.watchdog)


def build_serve(pipeline: beam.Pipeline, config: RatebeamConfig, options: ServeOptions, first: int,
                settings: StateSettings, run_id: str) -> beam.PCollection:
    """The streaming graph: ticks ``first``, ``first + 1``... from ``PeriodicImpulse``, then the shared cycle."""
    start = time.time()
    _ = (pipeline
         | "Heartbeat" >> PeriodicImpulse(start_timestamp=start, fire_interval=heartbeat_s(options.interval),
                                          **impulse_span(_run_seconds(options, first), start))
         | "CountBeats" >> beam.ParDo(CountBeats()))
    clock = TickClock(options.simulated_from, options.step)
    now = tick_clock(pipeline, clock, options.interval, _tick_range(options, first), start)
    rater = ReloadingRaterFactory(config.database_url, config.metrics)
    # Each tick also re-rates what the reprocessing schedules ask (pipelines.jobs), under leases.
    reprocess = JobSettings(REPROCESS, config.max_periods_per_run)
    now | "Reprocess" >> JobCycle(config, rater, settings, reprocess, WriteDeadLetters(config.database_url, run_id))
    return build_cycle(now, config, rater, settings, WriteDeadLetters(config.database_url, run_id),
                       resource_hints=options.resource_hints).results


def heartbeat_s(interval: float) -> float:
    """Seconds between two beats: :data:`HEARTBEAT_S`, or half the tick interval when that is shorter."""
    return min(HEARTBEAT_S, interval / 2)


def _tick_range(options: ServeOptions, first: int) -> range | None:
    """The ticks of a job starting at tick ``first`` (None: until it is stopped)."""
    return None if options.ticks is None else range(first, options.ticks)


def _run_seconds(options: ServeOptions, first: int) -> float | None:
    """How long the ticks of a job starting at tick ``first`` last (None: until it is stopped)."""
    return run_seconds(_tick_range(options, first), options.interval)


def heartbeats_in_all(options: ServeOptions, first: int) -> int | None:
    """How many beats a job starting at tick ``first`` counts at least in all (None: it beats for ever)."""
    seconds = _run_seconds(options, first)
    return None if seconds is None else math.floor(seconds / heartbeat_s(options.interval))


class StopRequest:
    """Set by SIGTERM/SIGINT: the launcher lets the current tick finish, then stops the job (``events serve``: at once)."""

    def __init__(self, stopping: str = "stopping after the current tick") -> None:
        self.event = threading.Event()
        #: What the log says the stop does.
        self.stopping = stopping

    def install(self) -> None:
        """Handle SIGTERM and SIGINT from now on."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        LOG.info("%s: %s", signal.Signals(signum).name, self.stopping)
        self.event.set()


def serve(config: RatebeamConfig, options: ServeOptions) -> int:
    """Run the streaming job until its ticks are done or SIGTERM; returns how many jobs it started."""
    if options.runner not in STREAMING_RUNNERS:
        raise ServeError(
            f"serve needs a runner that runs unbounded sources ({', '.join(STREAMING_RUNNERS)}); "
            f"{options.runner} does not: pass --runner-config with Prism or Flink "
            "(for one bounded cycle use `ratebeam run`)"
        )
    if options.simulated_from is not None and options.ticks is None:
        raise ServeError("serve --now (simulated time) needs --ticks: how many ticks to simulate")
    stop = StopRequest()
    stop.install()
    metrics = ServiceMetrics(config, options.metrics_port, options.metrics_host)
    try:
        return _serve_jobs(config, options, stop, metrics)
    finally:
        metrics.close()


def _serve_jobs(config: RatebeamConfig, options: ServeOptions, stop: StopRequest, metrics: ServiceMetrics) -> int:
    """Start jobs one after the other until the ticks are done, a stop request, or too many failures."""
    start = time.monotonic()
    jobs = 0
    while True:
        jobs += 1
        run_id = uuid.uuid4().hex[:16]
        # A restarted job continues the tick sequence where the wall clock says it stands.
        first = int((time.monotonic() - start) // options.interval) if jobs > 1 else 0
        if options.ticks is not None and first >= options.ticks:
            return jobs - 1
        state = _run_job(config, options, first, run_id, stop, metrics)
        if state in DONE_STATES or stop.event.is_set():
            return jobs
        if jobs > options.max_restarts:
            raise ServeError(f"the streaming job failed {jobs} times (last: run {run_id}, {state}); giving up")
        LOG.warning("streaming job of run %s ended %s: starting it again", run_id, state)


def _run_job(config: RatebeamConfig, options: ServeOptions, first: int, run_id: str, stop: StopRequest, metrics: ServiceMetrics) -> str:
    settings = state_settings(config, run_id)
    flags = [f"--runner={options.runner}", *options.extra_options]
    if "--streaming" not in flags:
        flags.append("--streaming")
    pipeline = beam.Pipeline(options=PipelineOptions(flags))
    build_serve(pipeline, config, options, first, settings, run_id)
    LOG.info("serve: run %s, a tick every %ss from tick %d%s", run_id, options.interval, first,
             f" to {options.ticks - 1}" if options.ticks else "")
    with quiet_fatal_tracebacks(), keep_leases(settings):
        try:
            result = pipeline.run()
        except BaseException:
            release_leases(settings, "job did not start")
            raise
        try:
            watch = StallWatch("heartbeats", options.stall_timeout, heartbeats_in_all(options, first))
            state = _watch(result, settings, stop, metrics, options.poll_s, watch)
        except BaseException:  # the launcher dies (a panic, Ctrl-C twice): its leases go back first
            release_leases(settings, "launcher failed")
            raise
    release_leases(settings, f"job {state}")
    return state


def _watch(result: PipelineResult, settings: StateSettings, stop: StopRequest, metrics: ServiceMetrics, poll_s: float,
           watch: StallWatch) -> str:
    """Poll the job until it ends, or until a stop request (then finish the tick and cancel), or until it is stuck."""
    while True:
        state = result.state
        metrics.job.state = str(state)
        counters = job_metrics(result)
        metrics.update(*counters)
        if state in DONE_STATES or state in FAILED_STATES:
            return state
        if stop.event.is_set():
            metrics.job.state = "STOPPING"
            _finish_tick(settings, poll_s)
            result.cancel()
            return PipelineState.CANCELLED
        if watch.stalled(counters[0]):
            LOG.error("serve: %s", watch.explain())
            metrics.job.state = STALLED
            result.cancel()
            return STALLED
        time.sleep(poll_s)


def _finish_tick(settings: StateSettings, poll_s: float) -> None:
    """Wait until the run holds no lease: the current tick committed (or ``lease_seconds`` passed)."""
    from ratebeam.connectors.sql.state_store import StateStore

    store = StateStore(make_engine(settings.database_url), settings.scope_key, settings.fetcher, settings.collector)
    deadline = time.monotonic() + settings.lease_seconds
    try:
        while time.monotonic() < deadline:
            mine = [h for h in store.leases() if h.owner.startswith(f"{settings.owner}@")]
            if not mine:
                return
            time.sleep(poll_s)
        LOG.warning("the current tick did not finish within %ss: stopping it", settings.lease_seconds)
    finally:
        store.engine.dispose()


def job_metrics(result: PipelineResult) -> tuple[dict[str, int], dict[str, int]]:
    """The job's ``ratebeam`` counters and its failed frames per scope ({} where the runner has none).

    Beam's portable ``PipelineResult.metrics()`` keeps the first answer of the job server for good
    (made for finished jobs); a running job's counters grow, so that answer is dropped first.
    """
    if hasattr(result, "_metrics"):
        result._metrics = None
    try:
        return beam_counters(result), beam_counters(result, SCOPE_FAILURES)
    except Exception as exc:  # a runner may not report metrics of a running job
        LOG.debug("no metrics from the runner: %s", exc)
        return {}, {}

"""The launcher of the event stream (``ratebeam events serve``): run the job, start it again if it dies, stop on SIGTERM.

Each job gets a new run id, so its source reads every unfinished notification of the inbox again
and rebuilds the open trigger instances (``pipelines.events.graph``).  Nothing of a job needs to be
waited for on SIGTERM: a message is acknowledged only after the inbox holds it, and a frame's
notifications are finished only after it is stored, so the job is cancelled at once and the next
one goes on from the inbox.  A job whose source stopped polling, or whose scope step stopped
taking the source's batches, for ``--stall-timeout`` seconds (the runner lost an SDK worker between
bundles) is cancelled and started again (``ops.watchdog``).  The job's Beam counters are logged at
every poll, at debug level, and once at the end.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineResult, PipelineState

from ratebeam.connectors.errors import RetriableConnectorError
from ratebeam.connectors.notifications.client import NotificationConsumer
from ratebeam.pipelines.cycle import quiet_fatal_tracebacks
from ratebeam.pipelines.events.graph import EventJob, build_events
from ratebeam.pipelines.ops.stream import StreamMonitor
from ratebeam.pipelines.ops.watchdog import STALL_TIMEOUT_S, STALLED, StallWatch, first_stalled
from ratebeam.pipelines.runners.gc_thresholds import apply_gc_thresholds
from ratebeam.pipelines.serve import (
    DONE_STATES,
    FAILED_STATES,
    STREAMING_RUNNERS,
    ServeError,
    StopRequest,
    job_metrics,
)
from ratebeam.transforms.rate_dofn import RaterFactory

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class EventsServeOptions:
    """The runner and its options, how often a failed job is started again, how often the job is polled."""

    runner: str
    extra_options: tuple[str, ...] = ()
    max_restarts: int = 3
    poll_s: float = 1.0
    resource_hints: dict[str, dict[str, str]] = field(default_factory=dict)  # by stage of the event stream
    stall_timeout: float = STALL_TIMEOUT_S  # seconds the source's polls or the scope step stand still: stuck


def serve_events(job: EventJob, rater: RaterFactory, options: EventsServeOptions,
                 monitor: StreamMonitor | None = None) -> int:
    """Run the event stream until SIGTERM/SIGINT (or the runner ends it); returns how many jobs it started.

    ``monitor`` (``pipelines.ops.stream``) is polled at each turn of the loop: health and metrics.
    """
    if options.runner not in STREAMING_RUNNERS:
        raise ServeError(
            f"events serve needs a runner that runs unbounded sources ({', '.join(STREAMING_RUNNERS)}); "
            f"{options.runner} does not: pass --runner-config with Prism or Flink"
        )
    try:  # before any job: what is published from now on waits in the queue; a broker that is not there is one line
        NotificationConsumer(job.source).declare()
    except RetriableConnectorError as exc:
        raise ServeError(f"events.source: {exc}") from None
    stop = StopRequest("cancelling the event-stream job (what it did not commit stays in the inbox and on the queue "
                       "for the next one)")
    stop.install()
    apply_gc_thresholds()  # the stream's steps run here with LOOPBACK (runners.gc_thresholds)
    jobs = 0
    while True:
        jobs += 1
        run = replace(job, run_id=uuid.uuid4().hex[:16])
        state = _run_job(run, rater, options, stop, monitor)
        if state in DONE_STATES or stop.event.is_set():
            return jobs
        if jobs > options.max_restarts:
            raise ServeError(f"the event stream failed {jobs} times (last: run {run.run_id}, {state}); giving up")
        LOG.warning("event stream of run %s ended %s: starting it again", run.run_id, state)


#: Asks Prism not to split bundles dynamically.  Prism 2.75 (``engine/elementmanager.go``,
#: ``splitBundle``) released every key of a split's residual from its in-progress set even when the
#: primary still held elements of that key; a second bundle of the same scope then ran beside the
#: first from a copy of the state taken before the first's writes, and persisting it afterwards
#: dropped them.  Prism splits a bundle whose input made no progress between two 100 ms progress
#: ticks, so a slow scope step (a starved CPU) lost events.  Prism 2.78 (``PRISM_VERSION``) fixed it;
#: the experiment stays for a Prism endpoint older than that.  Other runners ignore it; Flink
#: serializes a key's state by key group and is not concerned.  ``tests/test_prism_stateful_split.py``.
NO_DYNAMIC_SPLITS = "--experiments=prism_disable_sdf_split"


def job_flags(options: EventsServeOptions) -> list[str]:
    """The Beam flags of one event-stream job: the runner's, ``--streaming``, and :data:`NO_DYNAMIC_SPLITS`."""
    flags = [f"--runner={options.runner}", *options.extra_options]
    if "--streaming" not in flags:
        flags.append("--streaming")
    return [*flags, NO_DYNAMIC_SPLITS]


def _run_job(job: EventJob, rater: RaterFactory, options: EventsServeOptions, stop: StopRequest,
             monitor: StreamMonitor | None) -> str:
    pipeline = beam.Pipeline(options=PipelineOptions(job_flags(options)))
    build_events(pipeline, job, rater, options.resource_hints)
    index, count = job.shard
    LOG.info("events serve: run %s, queue %s on %s%s", job.run_id, job.source.queue, ", ".join(job.source.exchanges),
             f", shard {index}/{count} of the scopes" if count > 1 else "")
    with quiet_fatal_tracebacks():
        result = pipeline.run()
        state = _watch(result, stop, options.poll_s, monitor, _watches(options.stall_timeout))
    if stop.event.is_set():
        _quiet_worker()  # quiet_fatal_tracebacks put the process's stderr back; see _quiet_worker
    LOG.info("events serve: run %s ended %s; counters %s", job.run_id, state, job_metrics(result)[0])
    return state


def _watches(timeout: float) -> tuple[StallWatch, ...]:
    """The source's polls (its worker), and the scope step catching up with them (it may run in a worker of its own)."""
    return (StallWatch("source_polls", timeout),
            StallWatch("scope_batches_applied", timeout, behind="scope_batches_emitted"))


def _watch(result: PipelineResult, stop: StopRequest, poll_s: float, monitor: StreamMonitor | None,
           watches: tuple[StallWatch, ...]) -> str:
    """Poll the job until it ends, a stop is asked for (then cancel it) or it is stuck (the same)."""
    while True:
        counters = job_metrics(result)[0]
        state = result.state
        if monitor is not None:
            monitor.poll(str(state), counters)
        if state in DONE_STATES or state in FAILED_STATES:
            return state
        if stop.event.is_set():
            return _cancel(result, poll_s)
        stuck = first_stalled(watches, counters)
        if stuck is not None:
            LOG.error("events serve: %s", stuck.explain())
            _cancel(result, poll_s, quiet=False)
            return STALLED
        LOG.debug("events serve: %s", counters)
        time.sleep(poll_s)


#: How long a cancelled job is given to end before its in-process worker is stopped all the same.
CANCEL_WAIT_S = 60.0


class _WorkerNoise(logging.Filter):
    """Once a stop is asked: Beam's records of the bundles the cancel cut short are dropped (not errors of the job)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(("apache_beam", "grpc"))


class _MainThreadOnly:
    """``sys.stderr`` keeping only what the launcher's own thread writes (the worker's threads print tracebacks)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        """Write ``text`` if the main thread writes it."""
        return self._stream.write(text) if threading.current_thread() is threading.main_thread() else len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


_NOISE = _WorkerNoise()


def _quiet_worker() -> None:
    """From now on (the process is stopping), keep the in-process worker's noise out of the log and stderr.

    Called again once ``quiet_fatal_tracebacks`` has put its own ``sys.stderr`` back: a worker thread
    may still print after the job ended.  Doing it twice changes nothing.
    """
    for handler in logging.getLogger().handlers:
        handler.addFilter(_NOISE)  # logging keeps a filter once
    if not isinstance(sys.stderr, _MainThreadOnly):
        sys.stderr = _MainThreadOnly(sys.stderr)  # type: ignore[assignment]  # a stream for every purpose here


def _cancel(result: PipelineResult, poll_s: float, quiet: bool = True) -> str:
    """Cancel the job, wait until the runner says it ended, only then stop its in-process (LOOPBACK) worker.

    Beam's portable ``PipelineResult.cancel`` stops the worker right after sending the cancel (its
    ``_cleanup_callbacks``): the worker's threads, still running the job's bundles, then printed
    tracebacks (``KeyError`` of an instruction, gRPC ``UNAVAILABLE``), and a process ending while
    they ran was sometimes aborted.  So the callbacks are held back until the job's state is final.
    The bundle running when the job ends still fails in the worker (Beam discards its processor
    first): from the stop on, Beam's log records and the worker threads' prints are dropped, unless
    not ``quiet`` (a stuck job: the process goes on with a new job, whose records are kept).
    """
    if quiet:
        _quiet_worker()
    cleanup = getattr(result, "_cleanup_callbacks", ())
    if cleanup:
        result._cleanup_callbacks = ()  # type: ignore[attr-defined]  # the portable runner's, see above
    try:
        result.cancel()
        deadline = time.monotonic() + CANCEL_WAIT_S
        state = result.state
        while state not in DONE_STATES and state not in FAILED_STATES and time.monotonic() < deadline:
            time.sleep(min(poll_s, 0.2))
            state = result.state
        if state not in DONE_STATES and state not in FAILED_STATES:
            LOG.warning("the cancelled job did not end within %ss (%s): stopping its worker all the same",
                        CANCEL_WAIT_S, state)
        return PipelineState.CANCELLED
    finally:
        for callback in cleanup:
            callback()

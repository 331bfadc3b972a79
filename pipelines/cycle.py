"""The rating cycle as one Beam graph, and the launcher that runs it and reads its counters.

```
Impulse ─► FetchScopes ─► PlanPeriods ─► Reshuffle ─► CollectUsage ─► ConvertUsage ─► RateFrames ─► WriteToStorage
                              │ plans                      └──────────────┴─ failures ──┴─────────────┴─ outcomes
                              └──────────────────────────────────────────────────────────────► CommitState (by scope)
```
Every stage reports frames as ``FrameOutcome``; CommitState joins them with the plans by scope.
Everything a worker needs travels in picklable settings; clients are built in ``DoFn.setup`` and
closed in ``teardown``, so the same graph runs on the DirectRunner (FnApiRunner, in memory), on
Prism (LOOPBACK, or an EXTERNAL worker process: tests/test_portable_runners.py) and on Flink.
Beam counters are read from the result and summed over steps: FnApiRunner and Prism name the
steps differently but report the ``ratebeam`` namespace alike.

A run that fails gives back every lease it took (they would block the scopes for ``lease_seconds``
otherwise); a ``FatalConnectorError`` raised in a DoFn, which Beam hands back re-wrapped or only as
text, is found again (``connectors.errors.fatal_in``) and raised as such, without Beam's traceback
in the log, so the command line prints one line.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from ratebeam.connectors.collectors.collect_transform import CollectUsage
from ratebeam.connectors.errors import FATAL_MARKER, fatal_in
from ratebeam.connectors.fetchers.fetch_transform import FetchScopes
from ratebeam.connectors.sql.dead_letters import DeadLetterStore, WriteDeadLetters
from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.state_store import StateStore, make_owner
from ratebeam.connectors.sql.state_transforms import OUTCOMES, PLANS, CommitState, PlanPeriods, StateSettings
from ratebeam.connectors.storage.write_transform import WriteToStorage
from ratebeam.pipelines.config import RatebeamConfig
from ratebeam.transforms import arrow_coder
from ratebeam.transforms.chain_rater import ChainRaterFactory
from ratebeam.transforms.convert_usage import ConvertUsage
from ratebeam.transforms.frames import FrameOutcome
from ratebeam.transforms.rate_dofn import RateFrames

LOG = logging.getLogger(__name__)


@dataclass
class CycleReport:
    """What a cycle did, from the pipeline's Beam counters and the per-scope commit results."""

    run_id: str
    counters: dict[str, int] = field(default_factory=dict)
    failures: list[FrameOutcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every frame was rated and every scope committed (``ratebeam run`` exits 0)."""
        return not self.failures and not self.counters.get("scopes_lease_lost", 0)


def build_cycle(
    pipeline: beam.Pipeline, config: RatebeamConfig, rater: ChainRaterFactory, settings: StateSettings,
    failures_sink: beam.PTransform | None = None,
) -> beam.PCollection:
    """Add one rating cycle to ``pipeline``; returns the per-scope commit results."""
    arrow_coder.register_arrow_coder()
    scopes = pipeline | "FetchScopes" >> FetchScopes(config.fetcher, settings.now)
    planned = scopes | "PlanPeriods" >> PlanPeriods(settings)
    items = planned.items | "Reshuffle" >> beam.Reshuffle()
    collected = items | "CollectUsage" >> CollectUsage(
        config.collector, config.metrics.metrics, config.period, config.scope_key
    )
    usage = collected.samples | "ConvertUsage" >> ConvertUsage(config.metrics.metrics, config.rebatch_rows)
    rated = usage.usage | "Rate" >> RateFrames(rater, config.rebatch_rows)
    written = rated.rated | "Write" >> WriteToStorage(config.storage)
    outcomes = (collected.failures, usage.failures, rated.failures, written) | "Outcomes" >> beam.Flatten()
    results = {PLANS: planned.plans, OUTCOMES: outcomes} | "CommitState" >> CommitState(settings)
    if failures_sink is not None:
        results | "ReportFailures" >> failures_sink
    return results


def run_cycle(
    config: RatebeamConfig,
    rater: ChainRaterFactory,
    now: datetime | None = None,
    runner: str = "FnApiRunner",
    extra_options: list[str] | None = None,
    run_id: str | None = None,
) -> CycleReport:
    """Run one cycle to completion and report its counters and failed frames."""
    run_id = run_id or uuid.uuid4().hex[:16]
    now = now or datetime.now(UTC)
    settings = StateSettings(
        database_url=config.database_url,
        scope_key=config.scope_key,
        fetcher=config.fetcher.backend,
        collector=config.collector.backend,
        owner=make_owner(run_id),
        now=now,
        period=config.period,
        wait_periods=config.wait_periods,
        max_periods=config.max_periods_per_run,
        lease_seconds=config.lease_seconds,
    )
    options = PipelineOptions([f"--runner={runner}", *(extra_options or [])])
    pipeline = beam.Pipeline(options=options)
    build_cycle(pipeline, config, rater, settings, WriteDeadLetters(config.database_url, run_id))
    try:
        with _quiet_fatal_tracebacks():
            result = pipeline.run()
            result.wait_until_finish()
    except Exception as exc:
        _release_leases(settings)
        fatal = fatal_in(exc)
        if fatal is None:
            raise
        raise fatal from None
    counters: dict[str, int] = {}
    for c in result.metrics().query(MetricsFilter().with_namespace("ratebeam"))["counters"]:
        value = c.committed if c.committed is not None else c.attempted
        counters[c.key.metric.name] = counters.get(c.key.metric.name, 0) + (value or 0)
    dead_letters = DeadLetterStore(config.database_url)
    try:
        failures = dead_letters.for_run(run_id)
    finally:
        dead_letters.engine.dispose()
    return CycleReport(run_id, counters, failures)


def _release_leases(settings: StateSettings) -> None:
    engine = make_engine(settings.database_url)
    try:
        store = StateStore(engine, settings.scope_key, settings.fetcher, settings.collector)
        released = store.release_all(settings.owner)
        LOG.info("run failed: released %d lease(s) of %s", released, settings.owner)
    finally:
        engine.dispose()


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
def _quiet_fatal_tracebacks() -> Iterator[None]:
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

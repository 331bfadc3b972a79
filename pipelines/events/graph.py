"""``ratebeam events serve``: OpenStack notifications rated as one streaming Beam job (seed 002's triggers).

```
ReadNotifications ────────► Scopes ───────────────────► Rate ────────► Write ──────────► Commit
 (events.source: bus →       (events.scope: keyed by      (the cycle's   (the cycle's     (frame stored,
  SQL inbox → Beam, matched   scope; its trigger           rating chain)  writers)         its notifications
  by events.match: the        instances and frames in                                      finished; a failed
  definitions, the triggers,  state, one event-time                                        one a dead letter)
  keyed by scope; watermark:  timer: fire, expire,
  the notifications' time)    period ends, frame closes)
        └─────────── late events (counted, logged, in the inbox, for ``events reprocess``) ◄──┘
```
Each step's module says what it does and why; this one wires them and commits the writers'
outcomes.  The commit's (empty) output goes on past a fusion break (``_LastStageOutput``) only so
that Prism does not spin while the writers' stage runs.  Point ids are the cycle's (scope, type,
begin, groupby): rewriting a frame stores it once.
"""

from __future__ import annotations

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics

from ratebeam.connectors.sql.dead_letters import DeadLetterStore
from ratebeam.connectors.storage.write_transform import WriteToStorage
from ratebeam.pipelines.cycle import stage_labeler
from ratebeam.pipelines.events.job import LATE, NAMESPACE, EventJob, InboxStep
from ratebeam.pipelines.events.scope import ScopeFn
from ratebeam.pipelines.events.source import ReadNotifications
from ratebeam.transforms import arrow_coder
from ratebeam.transforms.frames import FrameOutcome
from ratebeam.transforms.rate_dofn import RateFrames, RaterFactory

__all__ = ["CommitFrame", "EventJob", "build_events"]


class CommitFrame(InboxStep):
    """After the writers acknowledged a frame, one transaction records it and finishes its notifications.

    A failed frame becomes a dead letter; its notifications stay unfinished and are read again by
    the next job.
    """

    def setup(self) -> None:
        """Open the inbox and the dead-letter store; the counters."""
        super().setup()
        self._dead = DeadLetterStore(self._job.database_url)
        self._stored = Metrics.counter(NAMESPACE, "frames_stored")
        self._finished = Metrics.counter(NAMESPACE, "notifications_finished")

    def process(self, outcome: FrameOutcome) -> None:
        """Commit one frame's outcome."""
        if outcome.ok:
            self._finished.inc(self._inbox.commit_frame(outcome.scope_id, outcome.begin, outcome.points))
            self._stored.inc()
        else:
            self._dead.add(self._job.run_id, [outcome])

    def teardown(self) -> None:
        """Close both stores' connections."""
        dead = getattr(self, "_dead", None)
        if dead is not None:
            dead.engine.dispose()
        super().teardown()


def build_events(pipeline: beam.Pipeline, job: EventJob, rater: RaterFactory,
                 resource_hints: dict[str, dict[str, str]] | None = None) -> beam.PCollection:
    """The streaming graph of the module docstring; returns the writer's outcomes.

    ``resource_hints`` are Beam resource hints by stage label (``runner_config.EVENT_STAGES``): on Prism
    with an EXTERNAL worker pool, ``Scopes`` with hints of its own runs in a second worker process
    beside the other steps (docs/performance.md).
    """
    stage = stage_labeler(resource_hints)
    arrow_coder.register_arrow_coder()
    scopes = (pipeline
              | stage("ReadNotifications", ReadNotifications(job))
              | stage("Scopes", beam.ParDo(ScopeFn(job)).with_output_types(pa.RecordBatch)
                      .with_outputs(LATE, main="frames")))
    rated = scopes.frames | stage("Rate", RateFrames(rater, job.rebatch_rows))
    # The writer's tallies feed a bounded run's figures; the stream's figures are its Beam counters.
    written = (rated.rated | stage("Write", WriteToStorage(job.storage, None, job.scope_key))).outcomes
    # Each output committed by its own step: through a Flatten, Prism 2.75 held some of the writer's
    # outcomes back indefinitely (a frame stored, never committed).
    committed = written | stage("Commit", beam.ParDo(CommitFrame(job)))
    rated.failures | "CommitRateFailures" >> beam.ParDo(CommitFrame(job))
    committed | "AfterCommit" >> _LastStageOutput()
    return written


class _LastStageOutput(beam.PTransform):
    """Consumes the commit's (empty) output past a fusion break, so the writers' stage has an output.

    Why: Prism 2.78 waits for a bundle's response in a loop that spins on its data channel once
    every output of the stage has ended (``internal/stage.go``, ``Execute``), and a stage without
    an output has them ended from the start: the stage of Rate, Write and Commit spun a core for as
    long as each of its bundles ran (4.5 s of a 10,000-instance drain, traced with a counting
    Prism).  With this output its end comes with the bundle's.  A ``Reshuffle`` is the break: Prism
    elides it (its consumer becomes a stage root, no shuffle); elsewhere it groups no element.
    """

    def expand(self, committed: beam.PCollection) -> beam.PCollection:
        return committed | beam.Reshuffle() | beam.FlatMap(_nothing)


def _nothing(_element: object) -> tuple[()]:
    """The commit step outputs nothing; were it to, this drops it."""
    return ()

"""``ratebeam events serve``: OpenStack notifications rated as one streaming Beam job (seed 002's triggers).

```
ReadNotifications ─► Convert+Match ─► Instances ─────────► Frames ─────────► RateFrames ─► WriteToStorage ─► Commit
 (SDF: bus → SQL     (definitions,    keyed (trigger,       keyed (scope,     (the cycle's   (the cycle's       (frame stored,
  inbox → Beam;       triggers)        key): the trigger     period): the      rating chain)  writers)           its notifications
  watermark: the                       instance in state,    complete frame                                     finished)
  notifications'                       event-time timers     at period end
  time)                                (fire, expire, each   + fire_delay
                                       period end)
```
* **Source** (:class:`ReadNotifications`, a splittable DoFn): each poll drains the queue into the
  SQL inbox (acknowledged after the commit, ``connectors.notifications``) and emits the inbox's rows
  this job has not read, oldest first, each stamped with its notification time.  Its watermark is
  the latest notification time read (and, with ``wall_clock_lag``, at least the wall clock minus
  it): event time moves with the notifications, so a replay or a test is deterministic.  A new job
  (a restart: Prism keeps no state) reads every unfinished row again, so the open trigger
  instances are rebuilt in Beam state from their events.
* **Instances** (:class:`_InstanceFn`): Beam state holds one ``TriggerInstance`` per (trigger,
  distinguishing traits); an event-time timer fires at the earliest of the instance's own due time
  (fire / expire, ``TriggerInstance.next_timer``) and the next period end + ``fire_delay``.  At a
  period end the lifecycle usage of the periods just closed is emitted (an instance still alive is
  billed when the period closes); at a fire or expiry the rest, and the instance is done.
* **Late events**: an event that arrives when the stream's time is already past its time +
  ``fire_delay``, or whose instance is done, is not added to any usage: it is counted
  (``events_late``), logged, and recorded in the inbox (``late_at``, ``late_reason``) for the
  reprocessing job.  So the stored rows depend only on the events that came in time.
* **Frames** (:class:`_FrameFn`): storage backends replace whole (scope, period, type) slices, so the
  rows of every instance of a scope and period are gathered, keyed by (scope, period begin), and
  sent on together once the period + the largest ``fire_delay`` has passed.  A frame the stream
  already stored (``ratebeam_event_frames``) is not written again: a restarted job that rebuilt
  only the instances still open would otherwise replace it with part of its rows.
* **Commit**: after the writers acknowledged a frame, one transaction records it and finishes the
  notifications whose usage ended in it.  A failed frame becomes a dead letter; its notifications
  stay unfinished and are read again by the next job.

Point ids are the cycle's (scope, type, begin, groupby): rewriting a frame stores it once.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam import coders
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.metrics import Metrics
from apache_beam.transforms import core, userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp

from ratebeam.connectors.errors import RetriableConnectorError
from ratebeam.connectors.notifications.client import NotificationConsumer
from ratebeam.connectors.notifications.config import NotificationSourceConfig
from ratebeam.connectors.notifications.inbox import Inbox
from ratebeam.connectors.sql.dead_letters import DeadLetterStore
from ratebeam.connectors.storage.write_transform import WriteToStorage
from ratebeam.transforms import arrow_coder, schema
from ratebeam.transforms.events.definitions import EventConversionError, EventDefinitions
from ratebeam.transforms.events.instance import Added, TriggerInstance
from ratebeam.transforms.events.lifecycle import LifecycleSettings, lifecycle_usage, period_begin, period_end
from ratebeam.transforms.events.model import Event, Notification
from ratebeam.transforms.events.triggers import TriggerDefinition, TriggerSet
from ratebeam.transforms.frames import Frame, FrameOutcome, concat_batches, to_batch, to_frame, with_manifest
from ratebeam.transforms.rate_dofn import RateFrames, RaterFactory
from ratebeam.transforms.time_keys import add_time_keys

LOG = logging.getLogger(__name__)
NAMESPACE = "ratebeam"
LATE = "late"
#: Inbox rows one poll reads into the job at most.
TAKE_ROWS = 5000


@dataclass(frozen=True)
class EventJob:
    """Everything the workers need, loaded and validated at the edge (picklable)."""

    database_url: str
    source: NotificationSourceConfig
    definitions: EventDefinitions
    triggers: TriggerSet
    pipelines: Mapping[str, LifecycleSettings]
    period: int
    run_id: str = ""
    rebatch_rows: int = 250_000
    storage: tuple[Any, ...] = field(default=())
    scope_key: str = "project_id"

    def lifecycle(self, pipeline: str | None) -> LifecycleSettings | None:
        """The lifecycle settings a trigger's fire or expire ``pipeline`` runs (None: no pipeline, no usage)."""
        if pipeline is None:
            return None
        return self.pipelines[pipeline]

    @property
    def frame_delay(self) -> timedelta:
        """How long after its period a frame waits for the instances' rows: the largest ``fire_delay``."""
        return max((t.fire_delay for t in self.triggers.triggers), default=timedelta(0))


# ---------------------------------------------------------------------------------------------- source


class _Polls(core.RestrictionProvider):
    """Poll ``k`` of the source is offset ``k`` of an endless range (as ``PeriodicImpulse``'s firings)."""

    def initial_restriction(self, element: Any) -> OffsetRange:
        return OffsetRange(0, sys.maxsize)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element: Any, restriction: OffsetRange) -> int:
        return 1

    def truncate(self, element: Any, restriction: OffsetRange) -> None:
        return None  # a drained job stops polling


class _InboxFn(beam.DoFn):
    """A step of the job that reads or writes the inbox: it opens it in ``setup`` and closes it in ``teardown``."""

    def __init__(self, job: EventJob) -> None:
        self._job = job

    def setup(self) -> None:
        self._inbox = Inbox(self._job.database_url)

    def teardown(self) -> None:
        inbox = getattr(self, "_inbox", None)
        if inbox is not None:
            inbox.engine.dispose()


class _ReadFn(_InboxFn):
    """Each poll: the bus into the inbox, then the inbox's unread rows into the job (see the module docstring)."""

    def setup(self) -> None:
        super().setup()
        self._consumer = NotificationConsumer(self._job.source)
        self._received = Metrics.counter(NAMESPACE, "notifications_received")
        self._duplicates = Metrics.counter(NAMESPACE, "notifications_duplicate")
        self._rejected = Metrics.counter(NAMESPACE, "notifications_dead_letter")
        self._read = Metrics.counter(NAMESPACE, "notifications_read")

    @beam.DoFn.unbounded_per_element()
    def process(self, _impulse: Any,
                tracker: Any = beam.DoFn.RestrictionParam(_Polls()),  # noqa: B008  (Beam's parameter markers)
                watermark: Any = beam.DoFn.WatermarkEstimatorParam(ManualWatermarkEstimator.default_provider()),  # noqa: B008
                ) -> Iterator[TimestampedValue]:
        """One poll (then the rest of the range is deferred to the next)."""
        poll = tracker.current_restriction().start
        if not tracker.try_claim(poll):
            return
        try:
            recorded = self._inbox.drain(self._consumer, wait=0.0)
            self._received.inc(recorded.new)
            self._duplicates.inc(recorded.duplicates)
            self._rejected.inc(recorded.rejected)
        except RetriableConnectorError as exc:  # the one retrying layer: the next poll connects again
            LOG.warning("notification source: %s (trying again at the next poll)", exc)
        rows = self._inbox.take(self._job.run_id, TAKE_ROWS)
        self._read.inc(len(rows))
        before = watermark.current_watermark()
        stream_time = None if before is None else before.micros
        latest = before
        for n in rows:
            at = Timestamp.from_utc_datetime(n.timestamp)
            latest = at if latest is None or at > latest else latest
            yield TimestampedValue((n, stream_time), at)
        lag = self._job.source.wall_clock_lag
        if lag is not None:
            wall = Timestamp.now() - Duration(lag)
            latest = wall if latest is None or wall > latest else latest
        if before is not None and latest is not None and latest <= before:
            # Prism runs a stateful step (its new elements, its timers already due) only when its input
            # watermark moves: a poll that moves it no further (stragglers only, or nothing) moves it 1 ms
            # (Prism's clock unit), or that work would wait for the next newer notification.
            latest = before + Duration(micros=1000)
        if latest is not None and (before is None or latest > before):
            watermark.set_watermark(latest)
        tracker.defer_remainder(Duration(0 if len(rows) == TAKE_ROWS else self._job.source.poll_seconds))

    def teardown(self) -> None:
        consumer = getattr(self, "_consumer", None)
        if consumer is not None:
            consumer.close()
        super().teardown()


class ReadNotifications(beam.PTransform):
    """The unbounded source: ``(Notification, stream time in µs when read or None)``, at the notification's time."""

    def __init__(self, job: EventJob) -> None:
        super().__init__()
        self._job = job

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        """Impulse, then the polling splittable DoFn."""
        return pipeline | beam.Impulse() | beam.ParDo(_ReadFn(self._job))


# ------------------------------------------------------------------------------------ convert + match


class _MatchFn(_InboxFn):
    """Notification → event (the definitions) → one element per trigger instance it joins.

    What no trigger wants is finished in the inbox at once; what the definitions cannot convert is
    a dead letter with the reason (and finished): the stream goes on.
    """

    def setup(self) -> None:
        super().setup()
        self._unmatched = Metrics.counter(NAMESPACE, "events_unmatched")
        self._failed = Metrics.counter(NAMESPACE, "events_conversion_failed")

    def start_bundle(self) -> None:
        self._finished: list[str] = []

    def process(self, element: tuple[Notification, int | None]) -> Iterator[tuple[tuple[str, str], tuple[Event, int | None]]]:
        """The (trigger, key) → (event, stream time) pairs of one notification."""
        notification, stream_time = element
        try:
            event = self._job.definitions.convert(notification)
        except EventConversionError as exc:
            self._failed.inc()
            LOG.warning("notification %s (%s): %s", notification.message_id, notification.event_type, exc)
            self._inbox.reject(notification.message_id, f"event conversion: {exc}")
            return
        matches = [] if event is None else self._job.triggers.matches(event)
        if not matches:
            self._unmatched.inc()
            self._finished.append(notification.message_id)
            return
        for trigger, key in matches:
            yield (trigger.name, _key_text(key)), (event, stream_time)

    def finish_bundle(self) -> None:
        self._inbox.finish(self._finished)


def _key_text(key: tuple[Any, ...]) -> str:
    """A distinguishing key as a deterministic string (Beam keys must encode deterministically)."""
    return "\x1f".join("" if v is None else v.isoformat() if isinstance(v, datetime) else str(v) for v in key)


# ------------------------------------------------------------------------------------------ instances


@dataclass
class _Held:
    """One trigger instance in Beam state: the pure instance and up to when its usage was emitted."""

    instance: TriggerInstance
    billed_until: datetime | None = None


def _scope_of(events: list[Event], scope_trait: str) -> str:
    """The scope of an instance that produced no row (its finish still needs a frame)."""
    return next((str(v) for e in events if (v := e.trait(scope_trait)) is not None), "")


def _epoch(when: datetime) -> int:
    """A period begin as a frame key (Beam keys need a deterministic encoding; a datetime has none)."""
    return int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp())


class _InstanceFn(_InboxFn):
    """The stateful step: one trigger instance per key, its timers, its usage (module docstring)."""

    HELD = userstate.ReadModifyWriteStateSpec("instance", coders.PickleCoder())
    DUE = userstate.TimerSpec("due", TimeDomain.WATERMARK)

    def setup(self) -> None:
        super().setup()
        self._late = Metrics.counter(NAMESPACE, "events_late")
        self._fired = Metrics.counter(NAMESPACE, "instances_fired")
        self._expired = Metrics.counter(NAMESPACE, "instances_expired")
        self._discrepancies = Metrics.counter(NAMESPACE, "lifecycle_discrepancies")

    def process(self, element: tuple[tuple[str, str], tuple[Event, int | None]],
                held_state: Any = beam.DoFn.StateParam(HELD),  # noqa: B008
                due: Any = beam.DoFn.TimerParam(DUE),  # noqa: B008
                ) -> Iterator[Any]:
        """Add an event that came in time to its instance (and move its timer); record a late one."""
        (name, key_text), (event, stream_time) = element
        trigger = self._job.triggers.by_name(name)
        held: _Held = held_state.read() or _Held(TriggerInstance(name, trigger.key(event) or ()))
        reason = None
        if stream_time is not None and Timestamp.from_utc_datetime(event.generated + trigger.fire_delay).micros <= stream_time:
            stream = Timestamp(micros=stream_time).to_utc_datetime().replace(tzinfo=UTC)
            reason = (f"came when the stream was at {stream.isoformat()}, past its time {event.generated.isoformat()} "
                      f"+ fire_delay {trigger.fire_delay}")
        else:
            added = held.instance.add(event, trigger)
            if added is Added.LATE:
                reason = f"trigger {name} instance {key_text!r} already {'fired' if held.instance.fired else 'expired'}"
            elif added is Added.NOT_MATCHED:  # its time criteria, relative to the instance, are not met
                self._inbox.finish([event.message_id])
                return
            elif added is Added.DUPLICATE:
                return
        if reason is not None:
            self._late.inc()
            LOG.warning("late event %s (%s): %s", event.message_id, event.event_type, reason)
            self._inbox.late(event.message_id, reason)
            yield beam.pvalue.TaggedOutput(LATE, (event.message_id, reason))
            return
        held_state.write(held)
        due.set(Timestamp.from_utc_datetime(self._next_due(held, trigger)))

    def _next_due(self, held: _Held, trigger: TriggerDefinition) -> datetime:
        """The instance's next timer: its own due time, or the end of its first unbilled period + fire_delay."""
        first = held.instance.events[0].generated
        billed = held.billed_until or period_begin(first, self._job.period)
        period_close = billed + timedelta(seconds=self._job.period) + trigger.fire_delay
        own = held.instance.next_timer(trigger)
        return period_close if own is None else min(own, period_close)

    @userstate.on_timer(DUE)
    def on_due(self, key: Any = beam.DoFn.KeyParam, when: Any = beam.DoFn.TimestampParam,
               held_state: Any = beam.DoFn.StateParam(HELD),  # noqa: B008
               due: Any = beam.DoFn.TimerParam(DUE),  # noqa: B008
               ) -> Iterator[tuple[tuple[str, int], tuple[pa.RecordBatch | None, tuple[str, ...]]]]:
        """Fire, expire, or close the periods now past: emit their usage rows to their frames."""
        held: _Held | None = held_state.read()
        if held is None or held.instance.closed:
            return
        name, _ = key
        trigger = self._job.triggers.by_name(name)
        now = when.to_utc_datetime().replace(tzinfo=UTC)
        instance = held.instance
        fired = instance.fire(trigger, now)
        expired = None if fired is not None else instance.expire(trigger, now)
        if fired is not None or expired is not None:
            pipeline = trigger.fire_pipeline if fired is not None else trigger.expire_pipeline
            events = fired if fired is not None else expired
            assert events is not None
            closed_until = period_end(events[-1].generated, self._job.period)
            (self._fired if fired is not None else self._expired).inc()
            yield from self._usage(held, events, self._job.lifecycle(pipeline), closed_until, final=True)
            instance.events = []  # done: only the tombstone stays, so a straggler is known late
            held_state.write(held)
            return
        closed_until = period_begin(now - trigger.fire_delay, self._job.period)
        yield from self._usage(held, instance.events, self._job.lifecycle(trigger.fire_pipeline), closed_until,
                               final=False)
        held.billed_until = max(closed_until, held.billed_until or closed_until)
        held_state.write(held)
        due.set(Timestamp.from_utc_datetime(self._next_due(held, trigger)))

    def _usage(self, held: _Held, events: list[Event], settings: LifecycleSettings | None, closed_until: datetime,
               final: bool) -> Iterator[tuple[tuple[str, int], tuple[pa.RecordBatch | None, tuple[str, ...]]]]:
        """The rows of the periods in [billed_until, closed_until), one element per frame.

        A final call (fire, expiry) also hands the instance's message ids to the last frame it
        touches: they are finished when that frame is stored.
        """
        rows = None
        if settings is not None:
            rows, discrepancies = lifecycle_usage(events, settings, self._job.period, closed_until)
            for d in discrepancies:
                self._discrepancies.inc()
                LOG.warning("lifecycle %s %s: %s", held.instance.trigger, held.instance.key, d)
        frames: dict[tuple[str, int], pa.RecordBatch | None] = {}
        if rows is not None and rows.num_rows:
            table = to_frame(rows)
            if held.billed_until is not None:
                import polars as pl

                table = table.filter(pl.col(schema.BEGIN) >= held.billed_until)
            for (scope, begin), part in table.partition_by(schema.SCOPE, schema.BEGIN, as_dict=True,
                                                           maintain_order=True).items():
                frames[(str(scope), _epoch(begin))] = to_batch(part, [Frame(str(scope), begin)])
        if final:
            ids = tuple(e.message_id for e in events)
            last = max(frames, key=lambda f: f[1]) if frames else (
                _scope_of(events, settings.scope_trait if settings else "tenant_id"), _epoch(period_begin(events[-1].generated, self._job.period)))
            frames.setdefault(last, None)
            for frame, batch in frames.items():
                yield frame, (batch, ids if frame == last else ())
            return
        for frame, batch in frames.items():
            yield frame, (batch, ())


# ---------------------------------------------------------------------------------------------- frames


class _FrameFn(_InboxFn):
    """Gathers a frame's rows from every instance; sends the complete frame on when its period has closed."""

    ROWS = userstate.BagStateSpec("rows", coders.PickleCoder())
    SENT = userstate.ReadModifyWriteStateSpec("sent", coders.BooleanCoder())
    CLOSE = userstate.TimerSpec("close", TimeDomain.WATERMARK)

    def setup(self) -> None:
        super().setup()
        self._after = Metrics.counter(NAMESPACE, "rows_after_frame_closed")
        self._skipped = Metrics.counter(NAMESPACE, "frames_already_stored")

    def process(self, element: tuple[tuple[str, int], tuple[pa.RecordBatch | None, tuple[str, ...]]],
                rows: Any = beam.DoFn.StateParam(ROWS),  # noqa: B008
                sent: Any = beam.DoFn.StateParam(SENT),  # noqa: B008
                close: Any = beam.DoFn.TimerParam(CLOSE),  # noqa: B008
                ) -> None:
        """Keep the rows until the frame closes."""
        (scope, epoch), (batch, ids) = element
        begin = datetime.fromtimestamp(epoch, UTC)
        if sent.read() and batch is not None and batch.num_rows:
            self._after.inc()  # cannot happen while event time holds; counted, never written over the frame
            LOG.warning("frame %s %s: rows after it was sent, not written", scope, begin.isoformat())
            batch = None
        rows.add((batch, ids))
        end = begin + timedelta(seconds=self._job.period) + self._job.frame_delay
        close.set(Timestamp.from_utc_datetime(end) + Duration(micros=1000))  # after the rows due at `end` (Prism: ms)

    @userstate.on_timer(CLOSE)
    def on_close(self, key: Any = beam.DoFn.KeyParam,
                 rows: Any = beam.DoFn.StateParam(ROWS),  # noqa: B008
                 sent: Any = beam.DoFn.StateParam(SENT),  # noqa: B008
                 ) -> Iterator[pa.RecordBatch]:
        """The frame's batch (its manifest names it) to rating, unless the stream stored it already."""
        scope, epoch = key
        begin = datetime.fromtimestamp(epoch, UTC)
        held = list(rows.read())
        rows.clear()
        ids = [i for _, part in held for i in part]
        batches = [b for b, _ in held if b is not None and b.num_rows]
        if self._inbox.frame_stored(scope, begin):
            self._skipped.inc(bool(batches))
            self._inbox.finish(ids)
            sent.write(True)
            return
        self._inbox.await_frame(ids, scope, begin)
        sent.write(True)
        yield frame_batch(batches, Frame(scope, begin))


def frame_batch(batches: list[pa.RecordBatch], frame: Frame) -> pa.RecordBatch:
    """One usage batch of a frame's rows (time keys added), its manifest naming the frame."""
    from ratebeam.transforms.frames import empty_usage_batch

    table = concat_batches(batches)
    if table is None:
        return with_manifest(empty_usage_batch(), [frame])
    usage = to_frame(table)
    if schema.TIME_KEYS[0] not in usage.columns:
        usage = add_time_keys(usage.lazy()).collect()
    return to_batch(usage, [frame])


# ---------------------------------------------------------------------------------------------- commit


class _CommitFn(_InboxFn):
    """A stored frame is recorded and finishes its notifications; a failed one is a dead letter."""

    def setup(self) -> None:
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
        dead = getattr(self, "_dead", None)
        if dead is not None:
            dead.engine.dispose()
        super().teardown()


# ----------------------------------------------------------------------------------------------- graph


def build_events(pipeline: beam.Pipeline, job: EventJob, rater: RaterFactory) -> beam.PCollection:
    """The streaming graph of the module docstring; returns the writer's outcomes."""
    arrow_coder.register_arrow_coder()
    matched = (pipeline
               | "ReadNotifications" >> ReadNotifications(job)
               | "ConvertMatch" >> beam.ParDo(_MatchFn(job)))
    instances = matched | "Instances" >> beam.ParDo(_InstanceFn(job)).with_outputs(LATE, main="rows")
    frames = (instances.rows
              | "Frames" >> beam.ParDo(_FrameFn(job)).with_output_types(pa.RecordBatch))
    rated = frames | "Rate" >> RateFrames(rater, job.rebatch_rows)
    written = rated.rated | "Write" >> WriteToStorage(job.storage, None, job.scope_key)
    # Each output committed by its own step: through a Flatten, Prism 2.75 held some of the writer's
    # outcomes back indefinitely (a frame stored, never committed).
    written | "Commit" >> beam.ParDo(_CommitFn(job))
    rated.failures | "CommitRateFailures" >> beam.ParDo(_CommitFn(job))
    return written

"""The event stream's stateful step: every trigger instance of a scope, and the frames their rows make.

Keyed by scope, Beam state holds a :class:`_Scope`: the open trigger instances (seed 002's
``TriggerInstance``, one per trigger and distinguishing traits), the closed ones' tombstones, and
the rows waiting for their frame.  One event-time timer per scope fires at the earliest of

* an instance's own due time (fire or expire, ``TriggerInstance.next_timer``);
* the end of an instance's first unbilled period + its trigger's ``fire_delay`` (an instance still
  alive is billed when the period closes, not only when it is deleted);
* a frame's close: its period's end + the largest ``fire_delay`` (``EventJob.frame_delay``).

Each firing first moves every instance that is due — its rows go into the frames of their
periods — and then sends the frames that are closed, in time order.  Why one step and not an
instance step feeding a frame step: storage backends replace whole (scope, period, type) slices,
so a frame must hold the rows of every instance of its scope; across two steps the frame step's
close could run before an instance's rows reached it when event time jumped past both in one poll
(a runner orders a key's timers, not two steps' outputs), and the frame was stored incomplete.
Here the rows and the frame are in one key's state, and the timer runs them in order.

An event that arrives when the stream's time is already past its time + ``fire_delay``, or whose
instance has fired or expired, is late: not added to any usage, counted (``events_late``), logged,
recorded in the inbox for the reprocessing job, and sent to the ``late`` output.  So the stored
rows depend only on the events that came in time.  A frame the stream already stored
(``ratebeam_event_frames``) is not written again: a restarted job that rebuilt only the instances
still open would otherwise replace it with part of its rows.

A tombstone is kept for ``TOMBSTONE_DAYS`` of event time after its instance closed, so an event
of a deleted resource arriving later (a straggling update, the next audit's ``exists``) is known
late instead of opening a new instance; past that it would, and it is reported as a discrepancy
(``end_without_start`` / ``start_not_seen``) when its usage is computed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import apache_beam as beam
import polars as pl
import pyarrow as pa
from apache_beam import coders
from apache_beam.metrics import Metrics
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp

from ratebeam.connectors.notifications.discrepancies import DiscrepancyStore
from ratebeam.pipelines.events_job import LATE, NAMESPACE, InboxStep
from ratebeam.pipelines.events_match import Matched
from ratebeam.transforms import schema
from ratebeam.transforms.events.instance import Added, TriggerInstance
from ratebeam.transforms.events.lifecycle import LifecycleSettings, lifecycle_usage, period_begin, period_end
from ratebeam.transforms.events.model import Event
from ratebeam.transforms.events.triggers import TriggerDefinition
from ratebeam.transforms.frames import (
    Frame,
    concat_batches,
    empty_usage_batch,
    to_batch,
    to_frame,
    with_manifest,
)

LOG = logging.getLogger(__name__)
#: How long (event time) a closed instance's tombstone is kept; a month and a day: Nova's longest audit period.
TOMBSTONE_DAYS = 32

Ident = tuple[str, str]  # (trigger name, instance key text)


@dataclass
class _Held:
    """One open trigger instance: the pure instance and up to when its usage went into frames."""

    instance: TriggerInstance
    billed_until: datetime | None = None


@dataclass
class _Pending:
    """A frame's rows so far, and the notifications finished when it is stored."""

    batches: list[pa.RecordBatch] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)


@dataclass
class _Scope:
    """The Beam state of one scope (module docstring)."""

    open: dict[Ident, _Held] = field(default_factory=dict)
    #: closed instances → when they closed (event time), so their stragglers are known late
    closed: dict[Ident, datetime] = field(default_factory=dict)
    #: frame period begin → its rows so far
    frames: dict[datetime, _Pending] = field(default_factory=dict)
    #: the latest frame sent (or found stored by an earlier job): frames close in period order, so every
    #: frame that begins at or before it is done
    sent_through: datetime | None = None


class ScopeFn(InboxStep):
    """The instances and frames of one scope (module docstring); main output: the frames' usage batches."""

    STATE = userstate.ReadModifyWriteStateSpec("scope", coders.PickleCoder())
    DUE = userstate.TimerSpec("due", TimeDomain.WATERMARK)

    def setup(self) -> None:
        """Open the inbox; the counters."""
        super().setup()
        self._late = Metrics.counter(NAMESPACE, "events_late")
        self._fired = Metrics.counter(NAMESPACE, "instances_fired")
        self._expired = Metrics.counter(NAMESPACE, "instances_expired")
        self._discrepancies = Metrics.counter(NAMESPACE, "lifecycle_discrepancies")
        self._after = Metrics.counter(NAMESPACE, "rows_after_frame_closed")
        self._skipped = Metrics.counter(NAMESPACE, "frames_already_stored")
        self._findings = DiscrepancyStore(self._job.database_url)

    def teardown(self) -> None:
        """Close the inbox's and the discrepancy store's connections."""
        findings = getattr(self, "_findings", None)
        if findings is not None:
            findings.engine.dispose()
        super().teardown()

    def process(self, element: Matched,
                state: Any = beam.DoFn.StateParam(STATE),  # noqa: B008  (Beam's parameter markers)
                due: Any = beam.DoFn.TimerParam(DUE),  # noqa: B008
                ) -> Iterator[Any]:
        """Add an event that came in time to its instance (and move the scope's timer); record a late one."""
        scope, (name, key, event, stream_time) = element
        trigger = self._job.triggers.by_name(name)
        held_scope: _Scope = state.read() or _Scope()
        ident = (name, key)
        reason = _late_by_time(event, trigger, stream_time)
        if reason is None and ident in held_scope.closed:
            reason = f"trigger {name} instance {key!r} already fired or expired"
        if reason is None:
            held = held_scope.open.get(ident) or _Held(TriggerInstance(name, trigger.key(event) or ()))
            added = held.instance.add(event, trigger)
            if added is Added.NOT_MATCHED:  # its time criteria, relative to the instance, are not met
                self._inbox.finish([event.message_id])
                return
            if added is Added.DUPLICATE:
                return
            assert added is Added.ADDED  # a closed instance is in `closed`, never in `open`
            LOG.debug("scope %s: %s (%s) joins %s %r", scope, event.message_id, event.generated.isoformat(), name, key)
            held_scope.open[ident] = held
            state.write(held_scope)
            due.set(Timestamp.from_utc_datetime(self._next_due(held_scope)))
            return
        self._late.inc()
        LOG.warning("late event %s (%s): %s", event.message_id, event.event_type, reason)
        self._inbox.late(event.message_id, reason)
        yield beam.pvalue.TaggedOutput(LATE, (event.message_id, reason))

    @userstate.on_timer(DUE)
    def on_due(self, key: Any = beam.DoFn.KeyParam, when: Any = beam.DoFn.TimestampParam,
               state: Any = beam.DoFn.StateParam(STATE),  # noqa: B008
               due: Any = beam.DoFn.TimerParam(DUE),  # noqa: B008
               ) -> Iterator[pa.RecordBatch]:
        """Move the instances that are due, then send the frames now closed (module docstring)."""
        held_scope: _Scope | None = state.read()
        if held_scope is None:
            return
        now = when.to_utc_datetime().replace(tzinfo=UTC)
        LOG.debug("scope %s: timer at %s, open %s, frames %s", key, now.isoformat(),
                  {i: len(h.instance.events) for i, h in held_scope.open.items()}, sorted(held_scope.frames))
        for ident in sorted(held_scope.open):
            held = held_scope.open[ident]
            trigger = self._job.triggers.by_name(ident[0])
            if self._instance_due(held, trigger) <= now:
                self._advance(key, ident, held, trigger, now, held_scope)
        yield from self._send(key, held_scope, now)
        horizon = now - timedelta(days=TOMBSTONE_DAYS)
        held_scope.closed = {i: at for i, at in held_scope.closed.items() if at > horizon}
        state.write(held_scope)
        following = self._next_due(held_scope)
        if following is not None:
            due.set(Timestamp.from_utc_datetime(following))

    # -------------------------------------------------------------------------------------- instances

    def _instance_due(self, held: _Held, trigger: TriggerDefinition) -> datetime:
        """The instance's next timer: its own due time, or the end of its first unbilled period + fire_delay."""
        first = held.instance.events[0].generated
        billed = held.billed_until or period_begin(first, self._job.period)
        period_close = billed + timedelta(seconds=self._job.period) + trigger.fire_delay
        own = held.instance.next_timer(trigger)
        return period_close if own is None else min(own, period_close)

    def _next_due(self, held_scope: _Scope) -> datetime | None:
        """The scope's timer: the earliest instance due time or frame close (``None``: nothing pending)."""
        times = [self._instance_due(h, self._job.triggers.by_name(i[0])) for i, h in held_scope.open.items()]
        times += [self._frame_close(begin) for begin in held_scope.frames]
        return min(times, default=None)

    def _advance(self, scope: str, ident: Ident, held: _Held, trigger: TriggerDefinition, now: datetime,
                 held_scope: _Scope) -> None:
        """Fire, expire, or bill the periods now closed: the instance's rows into their frames."""
        instance = held.instance
        fired = instance.fire(trigger, now)
        expired = None if fired is not None else instance.expire(trigger, now)
        if fired is not None or expired is not None:
            events = fired if fired is not None else expired
            assert events is not None
            pipeline = trigger.fire_pipeline if fired is not None else trigger.expire_pipeline
            (self._fired if fired is not None else self._expired).inc()
            closed_until = period_end(events[-1].generated, self._job.period)
            self._collect(scope, ident, held, events, self._job.lifecycle(pipeline), closed_until, held_scope,
                          final=True)
            del held_scope.open[ident]
            held_scope.closed[ident] = now
            return
        closed_until = period_begin(now - trigger.fire_delay, self._job.period)
        self._collect(scope, ident, held, instance.events, self._job.lifecycle(trigger.fire_pipeline), closed_until,
                      held_scope, final=False)
        held.billed_until = max(closed_until, held.billed_until or closed_until)

    def _collect(self, scope: str, ident: Ident, held: _Held, events: list[Event], settings: LifecycleSettings | None,
                 closed_until: datetime, held_scope: _Scope, final: bool) -> None:
        """The rows of the periods in [billed_until, closed_until) into their frames.

        A final call (fire, expiry) also hands the instance's message ids to the last frame it
        touches (its last event's period when it has no row): they are finished when it is stored.
        """
        if settings is None:  # a trigger whose pipeline bills nothing: its events are done when it closes
            if final:
                self._inbox.finish([e.message_id for e in events])
            return
        rows, found = lifecycle_usage(events, settings, self._job.period, closed_until)
        # Every computation of an instance finds its discrepancies again: stored once, counted and logged when new.
        for d in self._findings.record(ident[0], ident[1], found, run_id=self._job.run_id):
            self._discrepancies.inc()
            LOG.warning("lifecycle %s %r: %s (%s)", ident[0], ident[1], d.detail, d.kind)
        parts: dict[datetime, pa.RecordBatch] = {}
        if rows is not None and rows.num_rows:
            table = to_frame(rows)
            if held.billed_until is not None:
                table = table.filter(pl.col(schema.BEGIN) >= held.billed_until)
            for (begin,), part in table.partition_by(schema.BEGIN, as_dict=True, maintain_order=True).items():
                parts[_aware(begin)] = to_batch(part, [Frame(scope, _aware(begin))])
        for begin, batch in sorted(parts.items()):
            self._pending(scope, held_scope, begin, batch, [])
        if final:
            last = max(parts, default=period_begin(events[-1].generated, self._job.period))
            self._pending(scope, held_scope, last, None, [e.message_id for e in events])

    def _pending(self, scope: str, held_scope: _Scope, begin: datetime, batch: pa.RecordBatch | None,
                 message_ids: list[str]) -> None:
        """Add rows (and the ids they finish) to frame ``begin``; a frame already sent takes nothing."""
        if held_scope.sent_through is not None and begin <= held_scope.sent_through:
            if batch is not None:  # cannot happen while event time holds; counted, never written over the frame
                self._after.inc()
                LOG.warning("frame %s %s: rows after it was sent, not written", scope, begin.isoformat())
            self._inbox.finish(message_ids)
            return
        pending = held_scope.frames.setdefault(begin, _Pending())
        if batch is not None:
            pending.batches.append(batch)
        pending.message_ids.extend(message_ids)

    # ----------------------------------------------------------------------------------------- frames

    def _frame_close(self, begin: datetime) -> datetime:
        return begin + timedelta(seconds=self._job.period) + self._job.frame_delay

    def _send(self, scope: str, held_scope: _Scope, now: datetime) -> Iterator[pa.RecordBatch]:
        """The frames closed by ``now``, oldest first, to rating — except those the stream stored already."""
        for begin in sorted(b for b in held_scope.frames if self._frame_close(b) <= now):
            pending = held_scope.frames.pop(begin)
            held_scope.sent_through = begin  # sorted, and every frame closes after the ones before it
            if self._inbox.frame_stored(scope, begin):
                self._skipped.inc(bool(pending.batches))
                self._inbox.finish(pending.message_ids)
                continue
            self._inbox.await_frame(pending.message_ids, scope, begin)
            yield frame_batch(pending.batches, Frame(scope, begin))


def _late_by_time(event: Event, trigger: TriggerDefinition, stream_time: int | None) -> str | None:
    """Why ``event`` is late for the stream (read when its time + fire_delay had passed), or ``None``."""
    if stream_time is None or Timestamp.from_utc_datetime(event.generated + trigger.fire_delay).micros > stream_time:
        return None
    stream = Timestamp(micros=stream_time).to_utc_datetime().replace(tzinfo=UTC)
    return (f"came when the stream was at {stream.isoformat()}, past its time {event.generated.isoformat()} "
            f"+ fire_delay {trigger.fire_delay}")


def _aware(when: datetime) -> datetime:
    """A period begin from Polars (zoneinfo UTC, or naive) as ``datetime.UTC``: Beam's timestamps take only that."""
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def frame_batch(batches: list[pa.RecordBatch], frame: Frame) -> pa.RecordBatch:
    """One usage batch of a frame's rows (``lifecycle_usage`` gave them their time keys), its manifest naming the frame."""
    table = concat_batches(batches)
    if table is None:
        return with_manifest(empty_usage_batch(), [frame])
    return to_batch(to_frame(table), [frame])

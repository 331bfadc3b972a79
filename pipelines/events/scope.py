"""The event stream's stateful step: every trigger instance of a scope, and the frames their rows make.

Keyed by scope.  The scope's state is the open trigger instances (seed 002's ``TriggerInstance``,
one per trigger and distinguishing traits) with how far each was billed, the closed ones'
tombstones, and the rows waiting for their frame.  The scope's event-time timers — a timer
family, one timer per instant it waits for — fire at

* an instance's own due time (fire or expire, ``TriggerInstance.next_timer``);
* the end of an instance's first unbilled period + its trigger's ``fire_delay`` (an instance still
  alive is billed when the period closes, not only when it is deleted);
* a frame's close: its period's end + the largest ``fire_delay`` (``EventJob.frame_delay``).

Each firing first moves every instance that is due; it bills it (a fire or an expiry bills the
rest of its life and closes it), and the bills are made into rows — all of the scope's waiting
bills through ``lifecycle_usages`` in one call per pipeline — at the firing at which the first
frame they can touch closes; then it sends the frames that are closed, in time order.  Why a
timer per instant and not one timer moved to the next instant: instances fire at their own times
(delete + ``fire_delay``), and when event time jumps past many of them (a backlog drained after an
outage) one timer made a chain of firings, one runner round trip each; a family's timers that are
due fire together.  Why one step and not an instance step feeding a frame step: storage
backends replace whole (scope, period, type) slices, so a frame must hold the rows of every
instance of its scope; across two steps the frame step's close could run before an instance's
rows reached it when event time jumped past both in one poll (a runner orders a key's timers, not
two steps' outputs), and the frame was stored incomplete.  Here the rows and the frame are in one
key's state, and the timer runs them in order.

**How the state is kept** — a log of records and a worker's view of it — and why that is
race-free: ``events.scope_state``.

**The stream's instance timers are coarse** (``STREAM_TIMER_STEP``, ``EventJob.timer_step``): an
instance's timer is set at its due time rounded up to the step, so the instances due within one
step of a scope fire in one firing.  Prism's work and the worker's grow with the timers set and
fired: with a timer at each instance's own instant, a backlog of 10,000 deletes made 10,000
firings, each a bundle element, a state read and append, and Prism spent as much CPU on them as
the worker on everything.  Nothing that is stored changes: (1) a firing handles each due instance
*at its own due time* (the bills and the close time are those an exact timer gives) and goes on
until no instance is due; (2) a frame's timer is exact, and its firing first handles every
instance due by then, so its rows are all in it; (3) whether an event still finds its instance
open does not depend on when the timer ran: an instance whose own fire or expiry time is before
the stream's time when the event was read counts as fired (the rule below), which is what an exact
timer gives when the runner fires it before the next poll's element — the one order a runner does
not promise.  The reprocessing (``events.replay``) feeds its in-memory step in time order with
exact timers (``timer_step`` 0), which is the same rule.

An event that arrives when the stream's time is already past its time + ``fire_delay``, or whose
instance has fired or expired (or was due to, before the stream's time), is late: not added to any
usage, counted (``events_late``), logged, recorded in the inbox for the reprocessing job, and sent
to the ``late`` output.  So the stored
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
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam import coders
from apache_beam.metrics import Metrics
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp

from ratebeam.connectors.notifications.discrepancies import DiscrepancyStore
from ratebeam.pipelines.events.job import LATE, NAMESPACE, InboxStep
from ratebeam.pipelines.events.match import Match, ScopeBatch
from ratebeam.pipelines.events.scope_state import (
    ADD,
    BILLED,
    BILLS_MADE,
    CLOSED,
    FORGET,
    OPEN_BILL,
    ROWS,
    SENT,
    VIEWS,
    Bill,
    Book,
    Ident,
    ScopeView,
)
from ratebeam.transforms import schema
from ratebeam.transforms.events.instance import Added, TriggerInstance
from ratebeam.transforms.events.lifecycle import UsageRequest, lifecycle_usages, period_begin, period_end
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
#: The log is rewritten as a snapshot once this many records (or twice the last snapshot's size, if larger)
#: were appended: each record is written about twice (once appended, once in a snapshot), and the log holds
#: at most three times the live records.
COMPACT_AFTER = 4096
#: Seconds: the stream's instance timers are set at their due time rounded up to a minute (module docstring).
STREAM_TIMER_STEP = 60
#: Records per bag entry of a snapshot.  Each entry is pickled on its own: a pickle's memo of tens of thousands of
#: objects made one snapshot record cost 2.4 times an appended one (9.5 against 4 µs, measured).
SNAPSHOT_CHUNK = 512


class ScopeFn(InboxStep):
    """The instances and frames of one scope (module docstring); main output: the frames' usage batches."""

    HEAD = userstate.ReadModifyWriteStateSpec("head", coders.StrUtf8Coder())
    LOG = userstate.BagStateSpec("log", coders.PickleCoder())
    #: A timer family: one timer per instant the scope waits for (module docstring).
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
        self._applied = Metrics.counter(NAMESPACE, "scope_batches_applied")  # the source's batches (ops.watchdog)
        self._findings = DiscrepancyStore(self._job.database_url)

    def teardown(self) -> None:
        """Close the inbox's and the discrepancy store's connections."""
        findings = getattr(self, "_findings", None)
        if findings is not None:
            findings.engine.dispose()
        super().teardown()

    def process(self, element: tuple[str, ScopeBatch],
                head: Any = beam.DoFn.StateParam(HEAD),  # noqa: B008  (Beam's parameter markers)
                log: Any = beam.DoFn.StateParam(LOG),  # noqa: B008
                due: Any = beam.DoFn.TimerParam(DUE),  # noqa: B008
                ) -> Iterator[Any]:
        """Add the events that came in time to their instances (and move the scope's timer); record the late ones."""
        scope, (stream_time, matches) = element
        book = Book(VIEWS.get(self._job, scope, head, log))
        finished: list[str] = []
        for match in matches:
            yield from self._take(book, match, stream_time, finished)
        self._inbox.finish(finished)
        self._commit(book, head, log, due)
        self._applied.inc()

    @userstate.on_timer(DUE)
    def on_due(self, key: Any = beam.DoFn.KeyParam, when: Any = beam.DoFn.TimestampParam,
               head: Any = beam.DoFn.StateParam(HEAD),  # noqa: B008
               log: Any = beam.DoFn.StateParam(LOG),  # noqa: B008
               due: Any = beam.DoFn.TimerParam(DUE),  # noqa: B008
               ) -> Iterator[pa.RecordBatch]:
        """Move the instances that are due, then send the frames now closed (module docstring)."""
        book = Book(VIEWS.get(self._job, key, head, log))
        now = when.to_utc_datetime().replace(tzinfo=UTC)
        view = book.view
        view.timers.discard(now)
        LOG.debug("scope %s: timer at %s, open %d, frames %s", key, now.isoformat(), len(view.open),
                  sorted(view.frames))
        while due_now := view.due_instances(now):  # each at its own due time; a period bill may make it due again
            self._advance(book, due_now)
        view.drop_outdated()
        if view.bills and view.bills_due() <= now:
            self._make_rows(key, book)
        yield from self._send(key, book, now)
        horizon = now - timedelta(days=TOMBSTONE_DAYS)
        if view.closed_since is not None and view.closed_since <= horizon:
            book.write((FORGET, horizon))
        self._commit(book, head, log, due)

    def _commit(self, book: Book, head: Any, log: Any, due: Any) -> None:
        """Append the changes to the log (or rewrite it as a snapshot), move ``head`` and the timer."""
        view = book.view
        if book.records:
            view.appended += len(book.records)
            if view.appended > max(COMPACT_AFTER, 2 * view.snapshot_size):
                snapshot = view.snapshot()
                log.clear()
                for start in range(0, len(snapshot), SNAPSHOT_CHUNK):
                    log.add(snapshot[start:start + SNAPSHOT_CHUNK])
                view.snapshot_size, view.appended = len(snapshot), 0
            else:
                log.add(book.records)
            token = uuid.uuid4().hex
            head.write(token)
            view.token = token
        for when in sorted(view.to_set):
            at = Timestamp.from_utc_datetime(when)
            due.set(at, dynamic_timer_tag=str(at.micros))
        view.timers |= view.to_set
        view.to_set = set()

    # -------------------------------------------------------------------------------------- instances

    def _take(self, book: Book, match: Match, stream_time: int | None, finished: list[str]) -> Iterator[Any]:
        """One event: into its instance (a record), or late, or not wanted by its instance (finished)."""
        name, key, event = match
        trigger = self._job.triggers.by_name(name)
        view = book.view
        ident = (name, key)
        reason = _late_by_time(event, trigger, stream_time)
        if reason is None and ident in view.closed:
            reason = f"trigger {name} instance {key!r} already fired or expired"
        held = view.open.get(ident)
        if reason is None and held is not None:
            reason = _closed_by_time(held.instance, trigger, stream_time)
        if reason is None:
            instance = held.instance if held is not None else TriggerInstance(name, trigger.key(event) or ())
            added = instance.check(event, trigger)
            if added is Added.NOT_MATCHED:  # its time criteria, relative to the instance, are not met
                finished.append(event.message_id)
            elif added is Added.ADDED:  # DUPLICATE: nothing; LATE cannot be (a closed instance is in `closed`)
                LOG.debug("%s (%s) joins %s %r", event.message_id, event.generated, name, key)
                book.write((ADD, ident, instance.key, event))
            return
        self._late.inc()
        LOG.warning("late event %s (%s): %s", event.message_id, event.event_type, reason)
        self._inbox.late(event.message_id, reason)
        yield beam.pvalue.TaggedOutput(LATE, (event.message_id, reason))

    def _advance(self, book: Book, idents: list[Ident]) -> None:
        """Fire, expire, or bill the periods closed of the due instances, each at its own due time: a bill each.

        A bill is made into rows later.  Why its own due time and not the firing's: the stream's timers
        are coarse (module docstring), and a bill or a close time must be the one an exact timer gives.
        """
        for ident in idents:
            held = book.view.open[ident]
            assert held.due is not None  # a due instance has its due time
            now = held.due
            trigger = self._job.triggers.by_name(ident[0])
            instance = held.instance
            fired = instance.fire_due(trigger, now)
            if fired or instance.expire_due(trigger, now):
                (self._fired if fired else self._expired).inc()
                pipeline = trigger.fire_pipeline if fired else trigger.expire_pipeline
                closed_until = period_end(instance.events[-1].generated, self._job.period)
                if self._job.lifecycle(pipeline) is None:  # its pipeline bills nothing: its events are done
                    self._inbox.finish([e.message_id for e in instance.events])
                else:
                    book.write((OPEN_BILL, ident, pipeline, closed_until, held.billed_until, True))
                book.write((CLOSED, ident, now))
                continue
            closed_until = period_begin(now - trigger.fire_delay, self._job.period)
            if self._job.lifecycle(trigger.fire_pipeline) is not None:
                book.write((OPEN_BILL, ident, trigger.fire_pipeline, closed_until, held.billed_until, False))
            book.write((BILLED, ident, max(closed_until, held.billed_until or closed_until)))

    def _make_rows(self, scope: str, book: Book) -> None:
        """Every bill waiting into rows, one ``lifecycle_usages`` call per pipeline, the rows into their frames.

        A final bill (fire, expiry) also hands the instance's message ids to the last frame it
        touches (its last event's period when it has no row): they are finished when it is stored.
        """
        bills: dict[str, list[Bill]] = {}
        for bill in book.view.bills:
            bills.setdefault(bill.pipeline, []).append(bill)
        book.write((BILLS_MADE,))
        closing: dict[datetime, list[str]] = {}
        for pipeline, items in bills.items():
            settings = self._job.lifecycle(pipeline)
            assert settings is not None  # a bill is made only for a pipeline that bills
            requests = [UsageRequest(b.events, b.closed_until, b.billed_from) for b in items]
            rows, usages = lifecycle_usages(requests, settings, self._job.period)
            # Every computation of an instance finds its discrepancies again: stored once, counted and logged when new.
            for bill, usage in zip(items, usages, strict=True):
                for d in self._findings.record(bill.ident[0], bill.ident[1], usage.found, run_id=self._job.run_id):
                    self._discrepancies.inc()
                    LOG.warning("lifecycle %s %r: %s (%s)", bill.ident[0], bill.ident[1], d.detail, d.kind)
                if bill.final:
                    last = usage.begins[-1] if usage.begins else period_begin(bill.events[-1].generated,
                                                                              self._job.period)
                    closing.setdefault(last, []).extend(e.message_id for e in bill.events)
            if rows is not None:
                parts = to_frame(rows).partition_by(schema.BEGIN, as_dict=True, maintain_order=True)
                for (begin,), part in sorted(parts.items(), key=lambda kv: _aware(kv[0][0])):
                    self._pending(scope, book, _aware(begin), to_batch(part, [Frame(scope, _aware(begin))]), [])
        for begin, message_ids in sorted(closing.items()):
            self._pending(scope, book, begin, None, message_ids)

    def _pending(self, scope: str, book: Book, begin: datetime, batch: pa.RecordBatch | None,
                 message_ids: list[str]) -> None:
        """Add rows (and the ids they finish) to frame ``begin``; a frame already sent takes nothing."""
        sent_through = book.view.sent_through
        if sent_through is not None and begin <= sent_through:
            if batch is not None:  # cannot happen while event time holds; counted, never written over the frame
                self._after.inc()
                LOG.warning("frame %s %s: rows after it was sent, not written", scope, begin.isoformat())
            self._inbox.finish(message_ids)
            return
        book.write((ROWS, begin, batch, message_ids))

    # ----------------------------------------------------------------------------------------- frames

    def _send(self, scope: str, book: Book, now: datetime) -> Iterator[pa.RecordBatch]:
        """The frames closed by ``now``, oldest first, to rating — except those the stream stored already."""
        view = book.view
        for begin in sorted(b for b in view.frames if view.frame_close(b) <= now):
            pending = view.frames[begin]
            book.write((SENT, begin))  # sorted, and every frame closes after the ones before it
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
    return (f"came when the stream was at {_instant(stream_time).isoformat()}, "
            f"past its time {event.generated.isoformat()} + fire_delay {trigger.fire_delay}")


def _closed_by_time(instance: TriggerInstance, trigger: TriggerDefinition, stream_time: int | None) -> str | None:
    """Why an open ``instance`` takes no more events: its fire or expiry time is before the stream's time.

    Its timer may not have run yet (coarse timers, module docstring); it fires at that time all the same.
    """
    due = instance.next_timer(trigger)
    if stream_time is None or due is None or Timestamp.from_utc_datetime(due).micros >= stream_time:
        return None
    fate = "fire" if instance.fire_at(trigger) is not None else "expire"
    return (f"trigger {instance.trigger} instance {instance.key!r} was due to {fate} at {due.isoformat()}, "
            f"before the stream's time {_instant(stream_time).isoformat()}")


def _instant(micros: int) -> datetime:
    """A stream time (Beam's microseconds) as an aware UTC datetime, for the late reasons."""
    return Timestamp(micros=micros).to_utc_datetime().replace(tzinfo=UTC)


def _aware(when: datetime) -> datetime:
    """A period begin from Polars (zoneinfo UTC, or naive) as ``datetime.UTC``: Beam's timestamps take only that."""
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def frame_batch(batches: list[pa.RecordBatch], frame: Frame) -> pa.RecordBatch:
    """One usage batch of a frame's rows (``lifecycle_usage`` gave them their time keys), its manifest naming the frame."""
    table = concat_batches(batches)
    if table is None:
        return with_manifest(empty_usage_batch(), [frame])
    return to_batch(to_frame(table), [frame])


__all__ = ["ScopeFn", "ScopeView", "frame_batch"]

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

**How the state is kept: a log, and a view of it.**  An element is a batch: every match of one
poll for this scope (``events.match``).  The state is not one value holding the whole scope (that
made each event cost O(live instances of its scope): the value was read and written, pickled, per
event).  It is

* ``log`` — a bag of records, each one change: an event added to an instance, an instance billed
  up to a period (a bill naming the instance, whose events the log already holds), closed, a
  frame's rows, a frame sent, tombstones forgotten.  A bundle appends
  its changes (one ``add`` per element or firing, whatever the scope's size), and the log is
  rewritten as a snapshot of the live records once it has grown by as much again as the last
  snapshot held (so each record is written a bounded number of times);
* ``head`` — the token of the last committed change: a random id, new for every element or firing
  that changes anything, written in the same bundle as the records;
* in the worker's memory, a ``ScopeView`` per scope — the instances, tombstones, pending frames
  and a heap of due times that the log's records build — which the step reads and changes.  A
  view is used only while its token is the committed ``head``; otherwise (another worker had the
  key, the job restarted, the view was evicted) it is rebuilt from the log.

So an element costs O(its matches) and a firing O(the instances due), and neither grows with the
scope's live instances: the state requests per bundle are one read of ``head``, one append and
one write, and pending rows are written once, when made.

**Why this is race-free.**  The frame argument above holds unchanged: the rows and the frames are
still one key's state, changed only by that key's elements and timer, which a runner runs one at a
time per key (``events.serve.NO_DYNAMIC_SPLITS`` keeps Prism from running two bundles of a key at
once).  The view adds no race: (1) every change is a record applied to the view *and* appended
to the log, the one function ``ScopeView.apply`` making both, so a view rebuilt from the log is the
view that wrote it; (2) before its first change an element or firing replaces the view's token by
a fresh one, which reaches ``head`` only if the bundle commits — a bundle that fails or is retried
elsewhere leaves a view whose token is no committed ``head``, so it is never used again; (3) the
token is random, so no other worker's or job's view can hold it.  A worker holding a stale view of
a key another worker moved on therefore rebuilds it from the log that worker committed.

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

import heapq
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
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
from ratebeam.pipelines.events.job import LATE, NAMESPACE, EventJob, InboxStep
from ratebeam.pipelines.events.match import Match, ScopeBatch
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
#: The log is rewritten as a snapshot once this many records (or the last snapshot's size, if larger) were appended.
COMPACT_AFTER = 4096
#: Scopes whose views one worker keeps (least recently used dropped first: rebuilt from the log if needed again).
VIEWS_KEPT = 100_000

Ident = tuple[str, str]  # (trigger name, instance key text)
#: One change of a scope's state (``ScopeView.apply``): its kind first.
Record = tuple[Any, ...]
ADD, BILLED, CLOSED, BILL, OPEN_BILL, BILLS_MADE, ROWS, SENT, FORGET = (
    "add", "billed", "closed", "bill", "open_bill", "bills_made", "rows", "sent", "forget")


@dataclass
class _Held:
    """One open trigger instance: the pure instance, up to when its usage went into frames, its due time."""

    instance: TriggerInstance
    billed_until: datetime | None = None
    due: datetime | None = None


@dataclass(frozen=True)
class _Bill:
    """An instance's usage to make into rows: its events then, up to ``closed_until``, from ``billed_from``.

    Why bills and not rows at once: an instance fires at its own time (its delete + fire_delay), so
    rows made at once cost one usage frame per instance; bills wait for the firing at which the
    first frame they can touch closes, and all of a scope's are made in one call (module docstring).
    """

    ident: Ident
    pipeline: str
    events: tuple[Event, ...]
    closed_until: datetime
    billed_from: datetime | None
    final: bool

    @property
    def first_period(self) -> datetime:
        """The earliest period it can have rows in (the billed one, or its first event's): its frame closes first."""
        return self.billed_from or self.events[0].generated


@dataclass
class _Pending:
    """A frame's rows so far, and the notifications finished when it is stored."""

    batches: list[pa.RecordBatch] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)


class ScopeView:
    """One scope's state in memory, made by applying its log's records in order (module docstring)."""

    def __init__(self, job: EventJob) -> None:
        self._job = job
        self.open: dict[Ident, _Held] = {}
        #: closed instances → when they closed (event time), so their stragglers are known late; the earliest
        self.closed: dict[Ident, datetime] = {}
        self.closed_since: datetime | None = None
        #: frame period begin → its rows so far
        self.frames: dict[datetime, _Pending] = {}
        #: the instances' usage not made into rows yet, in order, and the earliest period they can reach
        self.bills: list[_Bill] = []
        self._bills_from: datetime | None = None
        #: the latest frame sent (or found stored by an earlier job): frames close in period order, so every
        #: frame that begins at or before it is done
        self.sent_through: datetime | None = None
        #: (due time, instance): an entry is current while it is its instance's ``due`` (others are skipped)
        self._heap: list[tuple[datetime, Ident]] = []
        #: the committed ``head`` this view is (``None``: a change not committed yet, or nothing committed)
        self.token: str | None = None
        #: the instants a timer is set for (one timer per instant: a timer family), and those still to set
        self.timers: set[datetime] = set()
        self.to_set: set[datetime] = set()
        #: records in the log: at its last snapshot, and appended since
        self.snapshot_size = 0
        self.appended = 0

    @classmethod
    def rebuild(cls, job: EventJob, log: Iterable[list[Record]], token: str | None) -> ScopeView:
        """The view the committed ``log`` (lists of records, in order) makes."""
        view = cls(job)
        for records in log:
            for record in records:
                view.apply(record, schedule=False)
                view.snapshot_size += 1
        for ident, held in view.open.items():
            view._schedule(ident, held)
        # Which timers the runner holds is not in the log: every instant the view waits for is set again
        # (a timer set twice is set once).
        view.to_set |= {view.frame_close(begin) for begin in view.frames}
        if view.bills:
            view.to_set.add(view.bills_due())
        view.token = token
        return view

    def apply(self, record: Record, schedule: bool = True) -> None:
        """Change the view by one record (the only way it changes: live and rebuilt views are the same)."""
        kind = record[0]
        if kind == ADD:
            _, ident, key, event = record
            held = self.open.get(ident)
            if held is None:
                held = self.open[ident] = _Held(TriggerInstance(ident[0], key))
            held.instance.insert(event)
        elif kind == BILLED:
            _, ident, until = record
            held = self.open[ident]
            held.billed_until = until
        elif kind == CLOSED:  # also a tombstone of a snapshot (its instance is not in it)
            _, ident, at = record
            self.open.pop(ident, None)
            self.closed[ident] = at
            self.closed_since = at if self.closed_since is None else min(self.closed_since, at)
            return
        elif kind in (BILL, OPEN_BILL):
            # An open instance's bill names it: its events are the view's then (not pickled twice into
            # the log); a snapshot's bills carry theirs, their instances may have closed since.
            bill = record[1] if kind == BILL else _Bill(record[1], record[2], tuple(self.open[record[1]].instance.events),
                                                        *record[3:])
            self.bills.append(bill)
            first = bill.first_period
            self._bills_from = first if self._bills_from is None else min(self._bills_from, first)
            if schedule:
                self._wait_for(self.bills_due())
            return
        elif kind == BILLS_MADE:
            self.bills, self._bills_from = [], None
            return
        elif kind == ROWS:
            _, begin, batch, message_ids = record
            pending = self.frames.setdefault(begin, _Pending())
            if schedule:
                self._wait_for(self.frame_close(begin))
            if batch is not None:
                pending.batches.append(batch)
            pending.message_ids.extend(message_ids)
            return
        elif kind == SENT:
            self.frames.pop(record[1], None)
            self.sent_through = record[1]
            return
        elif kind == FORGET:
            self.closed = {i: at for i, at in self.closed.items() if at > record[1]}
            self.closed_since = min(self.closed.values(), default=None)
            return
        else:
            raise ValueError(f"unknown record {kind!r}")
        if schedule:
            self._schedule(ident, held)

    def snapshot(self) -> list[Record]:
        """Records that make this view again (the log rewritten without what no longer counts)."""
        records: list[Record] = []
        if self.sent_through is not None:
            records.append((SENT, self.sent_through))
        records += [(CLOSED, ident, at) for ident, at in self.closed.items()]
        for ident, held in self.open.items():
            records += [(ADD, ident, held.instance.key, e) for e in held.instance.events]
            if held.billed_until is not None:
                records.append((BILLED, ident, held.billed_until))
        records += [(BILL, bill) for bill in self.bills]
        records += [(ROWS, begin, batch, []) for begin, p in self.frames.items() for batch in p.batches]
        records += [(ROWS, begin, None, p.message_ids) for begin, p in self.frames.items() if p.message_ids]
        return records

    # -------------------------------------------------------------------------------------- due times

    def instance_due(self, ident: Ident, held: _Held) -> datetime:
        """The instance's next timer: its own due time, or the end of its first unbilled period + fire_delay."""
        trigger = self._job.triggers.by_name(ident[0])
        first = held.instance.events[0].generated
        billed = held.billed_until or period_begin(first, self._job.period)
        period_close = billed + timedelta(seconds=self._job.period) + trigger.fire_delay
        own = held.instance.next_timer(trigger)
        return period_close if own is None else min(own, period_close)

    def frame_close(self, begin: datetime) -> datetime:
        """When frame ``begin`` is sent: its period's end + the largest fire_delay."""
        return begin + timedelta(seconds=self._job.period) + self._job.frame_delay

    def bills_due(self) -> datetime:
        """When the bills must be made into rows: the first close of a frame one of them can touch."""
        assert self._bills_from is not None  # there are bills
        return self.frame_close(period_begin(self._bills_from, self._job.period))

    def _wait_for(self, when: datetime) -> None:
        """A timer at ``when``, unless one is set for it already."""
        if when not in self.timers:
            self.to_set.add(when)

    def _schedule(self, ident: Ident, held: _Held) -> None:
        held.due = self.instance_due(ident, held)
        self._wait_for(held.due)
        heapq.heappush(self._heap, (held.due, ident))
        if len(self._heap) > 2 * len(self.open) + 64:  # mostly outdated entries: keep only the current ones
            self._heap = [(h.due, i) for i, h in self.open.items() if h.due is not None]
            heapq.heapify(self._heap)

    def _current(self, entry: tuple[datetime, Ident]) -> bool:
        held = self.open.get(entry[1])
        return held is not None and held.due == entry[0]

    def drop_outdated(self) -> None:
        """Take the outdated entries off the heap's top (the moved instances' old due times)."""
        while self._heap and not self._current(self._heap[0]):
            heapq.heappop(self._heap)

    def due_instances(self, now: datetime) -> list[Ident]:
        """The open instances due at ``now``, in order.

        Read off the heap without changing it (only the records a firing writes change a view):
        the entries at or before ``now`` are a subtree at the heap's root.
        """
        due, todo = set(), [0]
        while todo:
            index = todo.pop()
            if index < len(self._heap) and self._heap[index][0] <= now:
                if self._current(self._heap[index]):
                    due.add(self._heap[index][1])
                todo += [2 * index + 1, 2 * index + 2]
        return sorted(due)


class _Book:
    """The changes of one element or firing: applied to the view at once, appended to the log at the end."""

    def __init__(self, view: ScopeView) -> None:
        self.view = view
        self.records: list[Record] = []

    def write(self, record: Record) -> None:
        if not self.records:  # the view no longer is the committed head until this bundle commits (docstring)
            self.view.token = None
        self.view.apply(record)
        self.records.append(record)


class _Views:
    """The views this worker process keeps, by (run, scope); shared by the step's instances (one lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._views: OrderedDict[tuple[str, str], ScopeView] = OrderedDict()

    def get(self, job: EventJob, scope: str, head: Any, log: Any) -> ScopeView:
        """The view of ``scope`` whose token is ``head``'s: the one kept, or rebuilt from ``log``."""
        token = head.read()
        key = (job.run_id, scope)
        with self._lock:
            view = self._views.get(key)
            if view is not None:
                self._views.move_to_end(key)
        if view is None or token is None or view.token != token:
            view = ScopeView(job) if token is None else ScopeView.rebuild(job, log.read(), token)
            with self._lock:
                self._views[key] = view
                while len(self._views) > VIEWS_KEPT:
                    self._views.popitem(last=False)
        return view


_VIEWS = _Views()


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
        book = _Book(_VIEWS.get(self._job, scope, head, log))
        finished: list[str] = []
        for match in matches:
            yield from self._take(book, match, stream_time, finished)
        self._inbox.finish(finished)
        self._commit(book, head, log, due)

    @userstate.on_timer(DUE)
    def on_due(self, key: Any = beam.DoFn.KeyParam, when: Any = beam.DoFn.TimestampParam,
               head: Any = beam.DoFn.StateParam(HEAD),  # noqa: B008
               log: Any = beam.DoFn.StateParam(LOG),  # noqa: B008
               due: Any = beam.DoFn.TimerParam(DUE),  # noqa: B008
               ) -> Iterator[pa.RecordBatch]:
        """Move the instances that are due, then send the frames now closed (module docstring)."""
        book = _Book(_VIEWS.get(self._job, key, head, log))
        now = when.to_utc_datetime().replace(tzinfo=UTC)
        view = book.view
        view.timers.discard(now)
        LOG.debug("scope %s: timer at %s, open %d, frames %s", key, now.isoformat(), len(view.open),
                  sorted(view.frames))
        self._advance(book, view.due_instances(now), now)
        view.drop_outdated()
        if view.bills and view.bills_due() <= now:
            self._make_rows(key, book)
        yield from self._send(key, book, now)
        horizon = now - timedelta(days=TOMBSTONE_DAYS)
        if view.closed_since is not None and view.closed_since <= horizon:
            book.write((FORGET, horizon))
        self._commit(book, head, log, due)

    def _commit(self, book: _Book, head: Any, log: Any, due: Any) -> None:
        """Append the changes to the log (or rewrite it as a snapshot), move ``head`` and the timer."""
        view = book.view
        if book.records:
            view.appended += len(book.records)
            if view.appended > max(COMPACT_AFTER, view.snapshot_size):
                snapshot = view.snapshot()
                log.clear()
                log.add(snapshot)
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

    def _take(self, book: _Book, match: Match, stream_time: int | None, finished: list[str]) -> Iterator[Any]:
        """One event: into its instance (a record), or late, or not wanted by its instance (finished)."""
        name, key, event = match
        trigger = self._job.triggers.by_name(name)
        view = book.view
        ident = (name, key)
        reason = _late_by_time(event, trigger, stream_time)
        if reason is None and ident in view.closed:
            reason = f"trigger {name} instance {key!r} already fired or expired"
        if reason is None:
            held = view.open.get(ident)
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

    def _advance(self, book: _Book, idents: list[Ident], now: datetime) -> None:
        """Fire, expire, or bill the periods now closed of the due instances: each a bill, made into rows later."""
        for ident in idents:
            held = book.view.open[ident]
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

    def _make_rows(self, scope: str, book: _Book) -> None:
        """Every bill waiting into rows, one ``lifecycle_usages`` call per pipeline, the rows into their frames.

        A final bill (fire, expiry) also hands the instance's message ids to the last frame it
        touches (its last event's period when it has no row): they are finished when it is stored.
        """
        bills: dict[str, list[_Bill]] = {}
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

    def _pending(self, scope: str, book: _Book, begin: datetime, batch: pa.RecordBatch | None,
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

    def _send(self, scope: str, book: _Book, now: datetime) -> Iterator[pa.RecordBatch]:
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


__all__ = ["ScopeFn", "ScopeView", "frame_batch"]

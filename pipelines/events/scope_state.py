"""The state of the event stream's scope step: a log of records, and a worker's view of it.

**How the state is kept.**  An element of the scope step (``events.scope``) is a batch: every
match of one poll for this scope (``events.match``).  The state is not one value holding the whole scope (that
made each event cost O(live instances of its scope): the value was read and written, pickled, per
event).  It is

* ``log`` — a bag of records, each one change: an event added to an instance, an instance billed
  up to a period (a bill naming the instance, whose events the log already holds), closed, a
  frame's rows, a frame sent, tombstones forgotten.  A bundle appends its changes (one ``add``
  per element or firing, whatever the scope's size), and the log is
  rewritten as a snapshot of the live records once it has grown by twice what the last
  snapshot held (so each record is written about twice, and the log holds at most three times the
  live records);
* ``head`` — the token of the last committed change: a random id, new for every element or firing
  that changes anything, written in the same bundle as the records;
* in the worker's memory, a ``ScopeView`` per scope — the instances, tombstones, pending frames
  and a heap of due times that the log's records build — which the step reads and changes.  A
  view is used only while its token is the committed ``head``; otherwise (another worker had the
  key, the job restarted, the view was evicted) it is rebuilt from the log.

So an element costs O(its matches) and a firing O(the instances due), and neither grows with the
scope's live instances: the state requests per bundle are one read of ``head``, one append and
one write, and pending rows are written once, when made.

**Why this is race-free.**  The frame argument of ``events.scope`` (why the rows and the frames
are one step) holds unchanged: the rows and the frames are
still one key's state, changed only by that key's elements and timer, which a runner runs one at a
time per key (``events.serve.NO_DYNAMIC_SPLITS`` keeps Prism from running two bundles of a key at
once).  The view adds no race: (1) every change is a record applied to the view *and* appended
to the log, the one function ``ScopeView.apply`` making both, so a view rebuilt from the log is the
view that wrote it; (2) before its first change an element or firing replaces the view's token by
a fresh one, which reaches ``head`` only if the bundle commits — a bundle that fails or is retried
elsewhere leaves a view whose token is no committed ``head``, so it is never used again; (3) the
token is random, so no other worker's or job's view can hold it.  A worker holding a stale view of
a key another worker moved on therefore rebuilds it from the log that worker committed.
"""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa

from ratebeam.pipelines.events.job import EventJob
from ratebeam.transforms.events.instance import TriggerInstance
from ratebeam.transforms.events.lifecycle import period_begin
from ratebeam.transforms.events.model import Event

#: Scopes whose views one worker keeps (least recently used dropped first: rebuilt from the log if needed again).
VIEWS_KEPT = 100_000

Ident = tuple[str, str]  # (trigger name, instance key text)
#: One change of a scope's state (``ScopeView.apply``): its kind first.
Record = tuple[Any, ...]
ADD, BILLED, CLOSED, BILL, OPEN_BILL, BILLS_MADE, ROWS, SENT, FORGET = (
    "add", "billed", "closed", "bill", "open_bill", "bills_made", "rows", "sent", "forget")


@dataclass
class Held:
    """One open trigger instance: the pure instance, up to when its usage went into frames, its due time."""

    instance: TriggerInstance
    billed_until: datetime | None = None
    due: datetime | None = None


@dataclass(frozen=True)
class Bill:
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
class Pending:
    """A frame's rows so far, and the notifications finished when it is stored."""

    batches: list[pa.RecordBatch] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)


class ScopeView:
    """One scope's state in memory, made by applying its log's records in order (module docstring)."""

    def __init__(self, job: EventJob) -> None:
        self._job = job
        self.open: dict[Ident, Held] = {}
        #: closed instances → when they closed (event time), so their stragglers are known late; the earliest
        self.closed: dict[Ident, datetime] = {}
        self.closed_since: datetime | None = None
        #: frame period begin → its rows so far
        self.frames: dict[datetime, Pending] = {}
        #: the instances' usage not made into rows yet, in order, and the earliest period they can reach
        self.bills: list[Bill] = []
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
                held = self.open[ident] = Held(TriggerInstance(ident[0], key))
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
            bill = record[1] if kind == BILL else Bill(record[1], record[2], tuple(self.open[record[1]].instance.events),
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
            pending = self.frames.setdefault(begin, Pending())
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

    def instance_due(self, ident: Ident, held: Held) -> datetime:
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

    def _timer_at(self, due: datetime) -> datetime:
        """The instant of an instance's timer: ``due`` rounded up to the job's ``timer_step`` (``events.scope``)."""
        step = self._job.timer_step
        if step <= 0:
            return due
        begin = period_begin(due, step)  # the epoch-aligned step holding it, as a rating period is
        return due if begin == due else begin + timedelta(seconds=step)

    def _wait_for(self, when: datetime) -> None:
        """A timer at ``when``, unless one is set for it already."""
        if when not in self.timers:
            self.to_set.add(when)

    def _schedule(self, ident: Ident, held: Held) -> None:
        held.due = self.instance_due(ident, held)
        self._wait_for(self._timer_at(held.due))
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


class Book:
    """The changes of one element or firing: applied to the view at once, appended to the log at the end."""

    def __init__(self, view: ScopeView) -> None:
        self.view = view
        self.records: list[Record] = []

    def write(self, record: Record) -> None:
        """Apply ``record`` to the view now; it is appended to the log when the element or firing commits."""
        if not self.records:  # the view no longer is the committed head until this bundle commits (docstring)
            self.view.token = None
        self.view.apply(record)
        self.records.append(record)


class Views:
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


VIEWS = Views()

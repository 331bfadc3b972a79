"""The scope step's state: a log of records and a worker's view of it (``pipelines/events/scope.py``).

The step runs here as ``events reprocess`` runs it, with its head cell, log bag and timer in
memory (``events_replay``'s), over a real SQLite inbox.  What is checked is what the module
docstring claims: an element costs O(its matches) in state — one append, the log never read while
the view is the committed head — whatever the scope's size; a view rebuilt from the log (after a
dropped bundle, or from a compacted log) is the view that wrote it; a firing bills every due
instance with the rows one ``lifecycle_usage`` per instance gives.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.timestamp import Timestamp
from events_support import EVENTS_DATA, at, default_definitions_data, default_triggers_data, nova

from ratebeam.connectors.notifications.config import NotificationSourceConfig
from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.migrations import upgrade
from ratebeam.pipelines.events import scope as events_scope
from ratebeam.pipelines.events import scope_state
from ratebeam.pipelines.events.config import read_pipelines
from ratebeam.pipelines.events.job import EventJob
from ratebeam.pipelines.events.match import key_text
from ratebeam.pipelines.events.replay import _Bag, _Cell, _Timer
from ratebeam.pipelines.events.scope import ScopeFn
from ratebeam.pipelines.events.scope_state import ScopeView
from ratebeam.transforms.events.definitions import EventDefinitions
from ratebeam.transforms.events.lifecycle import lifecycle_usage, period_end
from ratebeam.transforms.events.model import Event
from ratebeam.transforms.events.triggers import TriggerSet
from ratebeam.transforms.frames import manifest, to_frame

HOUR = 3600
SCOPE = "t-1"


class _CountingBag(_Bag):
    """The in-memory log, counting its reads and appends."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = self.adds = 0

    def read(self) -> list[Any]:
        self.reads += 1
        return super().read()

    def add(self, value: Any) -> None:
        self.adds += 1
        super().add(value)


@pytest.fixture
def step(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'ratebeam.db'}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    pipelines = {name: p.settings("project_id") for name, p in read_pipelines(
        EVENTS_DATA / "lifecycles.yaml", "lifecycles.yaml").items()}
    job = EventJob(database_url=url, source=NotificationSourceConfig(transport_url="rabbit://127.0.0.1:1/"),
                   definitions=EventDefinitions.from_yaml_data(default_definitions_data(), "event_definitions.yaml"),
                   triggers=TriggerSet.from_yaml_data(default_triggers_data(), "triggers.yaml", set(pipelines)),
                   pipelines=pipelines, period=HOUR, run_id=f"test-{tmp_path.name}")
    fn = ScopeFn(job)
    fn.setup()
    yield fn
    fn.teardown()


def matches(step: ScopeFn, *notes):
    out = []
    for note in notes:
        event = step._job.definitions.convert(note)
        [(trigger, key)] = step._job.triggers.matches(event)
        out.append((trigger.name, key_text(key), event))
    return out


def feed(step: ScopeFn, state, *notes) -> list[Any]:
    head, log, timer = state
    return list(step.process((SCOPE, (None, matches(step, *notes))), head=head, log=log, due=timer))


def fire(step: ScopeFn, state, when: datetime) -> list[Any]:
    head, log, timer = state
    return list(step.on_due(key=SCOPE, when=Timestamp.from_utc_datetime(when), head=head, log=log, due=timer))


def view_of(step: ScopeFn, state) -> ScopeView:
    return scope_state.VIEWS.get(step._job, SCOPE, state[0], state[1])


def shape(view: ScopeView) -> tuple:
    """What a view holds, comparable."""
    return ({i: ([e.message_id for e in h.instance.events], h.billed_until, h.due) for i, h in view.open.items()},
            dict(view.closed), {b: (sum(x.num_rows for x in p.batches), p.message_ids) for b, p in view.frames.items()},
            [(b.ident, b.closed_until, b.final) for b in view.bills], view.sent_through)


def created(n: int) -> list:
    return [nova("compute.instance.create.end", f"10:{n % 60:02d}", instance_id=f"i-{n}") for n in range(n)]


def test_an_element_costs_one_append_whatever_the_scope_s_size(step):
    state = (_Cell(), _CountingBag(), _Timer())
    feed(step, state, *created(300))
    assert state[1].adds == 1 and state[1].reads == 0
    for n in range(5):  # one event each into a scope of 300 open instances
        feed(step, state, nova("compute.instance.resize.confirm.end", "10:59", instance_id=f"i-{n}",
                               flavor="m1.large"))
    assert state[1].adds == 6 and state[1].reads == 0  # never read back: the view is the committed head
    assert [len(records) for records in state[1].read()] == [300, 1, 1, 1, 1, 1]
    assert state[2].next() == Timestamp.from_utc_datetime(datetime(2026, 3, 2, 11, 5, tzinfo=UTC))  # 11:00 + delay


def test_a_firing_bills_every_due_instance_as_lifecycle_usage_does_one_by_one(step):
    state = (_Cell(), _Bag(), _Timer())
    notes = created(40) + [nova("compute.instance.delete.end", "12:30", instance_id=f"i-{n}") for n in range(0, 40, 3)]
    feed(step, state, *notes)
    frames = []
    while (when := state[2].next()) is not None and when <= Timestamp.from_utc_datetime(datetime(2026, 3, 2, 14, tzinfo=UTC)):
        state[2].fired(when)
        frames += fire(step, state, when.to_utc_datetime().replace(tzinfo=UTC))
    stored = {(r["begin"], r["groupby.instance_id"]): r["qty"] for f in frames for r in to_frame(f).to_dicts()}
    expected = {}
    settings = step._job.pipelines["instance"]
    for n in range(40):
        events = [step._job.definitions.convert(x) for x in notes if x.payload["instance_id"] == f"i-{n}"]
        closed = period_end(events[-1].generated, HOUR) if len(events) == 2 else datetime(2026, 3, 2, 13, tzinfo=UTC)
        batch, _ = lifecycle_usage(events, settings, HOUR, closed)
        expected |= {(r["begin"], r["groupby.instance_id"]): r["qty"] for r in to_frame(batch).to_dicts()}
    assert stored == expected
    assert sum(stored.values(), Decimal(0)) > 0
    assert sorted({f.begin.hour for batch in frames for f in manifest(batch)}) == [10, 11, 12]


def test_a_dropped_bundle_s_changes_are_never_used_the_view_is_rebuilt_from_the_log(step):
    state = (_Cell(), _CountingBag(), _Timer())
    feed(step, state, *created(3))
    before = shape(view_of(step, state))
    committed = (state[0].read(), state[1].read())
    feed(step, state, nova("compute.instance.create.end", "10:30", instance_id="i-dropped"))
    assert ("instance_lifecycle", "i-dropped") in view_of(step, state).open
    state[0].write(committed[0])  # the runner drops that bundle: head and log as they were committed
    state[1].clear()
    for records in committed[1]:
        state[1].add(records)
    reads = state[1].reads
    view = view_of(step, state)
    assert state[1].reads == reads + 1  # rebuilt from the log
    assert shape(view) == before
    assert ("instance_lifecycle", "i-dropped") not in view.open


def test_a_compacted_log_rebuilds_the_same_view(step, monkeypatch):
    monkeypatch.setattr(events_scope, "COMPACT_AFTER", 10)
    state = (_Cell(), _Bag(), _Timer())
    feed(step, state, *created(12))
    for n in range(12):
        feed(step, state, nova("compute.instance.resize.confirm.end", f"10:{n + 30}", instance_id=f"i-{n}",
                               flavor="m1.large"))
        if n % 3 == 0:
            feed(step, state, nova("compute.instance.delete.end", f"11:{n + 10}", instance_id=f"i-{n}"))
    sent = fire(step, state, datetime(2026, 3, 2, 12, 6, tzinfo=UTC))  # 11:00 billed, 4 fired, frames sent
    feed(step, state, nova("compute.instance.create.end", "12:10", instance_id="i-late"))
    live = view_of(step, state)
    log = state[1].read()
    assert len(log) < 12 + 4 + 2  # rewritten as a snapshot at least once
    rebuilt = ScopeView.rebuild(step._job, log, state[0].read())
    assert shape(rebuilt) == shape(live)
    assert sorted(f.begin.hour for batch in sent for f in manifest(batch)) == [10, 11]  # closed at 11:05, 12:05
    assert live.sent_through == datetime(2026, 3, 2, 11, tzinfo=UTC) and len(live.closed) == 4
    assert all(b >= datetime(2026, 3, 2, 12, tzinfo=UTC) for b in live.frames)
    assert all(when > datetime(2026, 3, 2, 12, 6, tzinfo=UTC) for when in rebuilt.to_set)  # set again on rebuild
    assert {h.due for h in live.open.values()} <= rebuilt.to_set


def test_a_bill_in_the_log_names_its_instance_and_a_rebuilt_view_holds_the_same_bill(step):
    """A fired instance's bill waits for its frame's close; the log's record of it names the instance
    (its events are in the log once, from their ``add`` records, not pickled again), and a view rebuilt
    from that log holds the same bill with the same events, whose frame then closes as the live one's."""
    state = (_Cell(), _Bag(), _Timer())
    feed(step, state, nova("compute.instance.create.end", "10:30", instance_id="i-1"),
         nova("compute.instance.delete.end", "10:40", instance_id="i-1"))
    assert fire(step, state, datetime(2026, 3, 2, 10, 46, tzinfo=UTC)) == []  # fired at 10:45: its frame closes at 11:05
    live = view_of(step, state)
    records = [r for batch in state[1].read() for r in batch]
    bills = [r for r in records if r[0] in (scope_state.BILL, scope_state.OPEN_BILL)]
    assert [r[0] for r in bills] == [scope_state.OPEN_BILL]
    assert not any(isinstance(part, Event) for part in bills[0])
    rebuilt = ScopeView.rebuild(step._job, state[1].read(), state[0].read())
    assert [b.events for b in rebuilt.bills] == [b.events for b in live.bills] and len(live.bills[0].events) == 2
    assert shape(rebuilt) == shape(live)
    state[0].write("a token no view holds")  # the next firing rebuilds the view from the log
    sent = fire(step, state, datetime(2026, 3, 2, 11, 5, tzinfo=UTC))
    assert [f.begin.hour for batch in sent for f in manifest(batch)] == [10]
    assert sum(batch.num_rows for batch in sent) > 0


def test_the_replay_s_timers_fire_in_order_and_a_moved_timer_fires_at_its_new_instant():
    """The in-memory timer family ``events reprocess`` drives the step with: earliest first, a tag set
    again moves its timer (Beam's semantics), and firing an instant fires every tag set for it."""
    timer = _Timer()
    at = [Timestamp(seconds=s) for s in (30, 10, 20, 40)]
    for n, when in enumerate(at):
        timer.set(when, dynamic_timer_tag=f"t{n}")
    timer.set(Timestamp(seconds=50), dynamic_timer_tag="t1")  # t1 moves from 10 to 50
    timer.set(Timestamp(seconds=20), dynamic_timer_tag="t4")  # a second tag at 20
    order = []
    while (when := timer.next()) is not None:
        order.append((when.seconds(), sorted(tag for tag, t in timer.timers.items() if t == when)))
        timer.fired(when)
    assert order == [(20, ["t2", "t4"]), (30, ["t0"]), (40, ["t3"]), (50, ["t1"])]
    assert timer.timers == {}


def _stream(step: ScopeFn, polls: list[tuple[str, list]], until: datetime) -> tuple[dict, list, int]:
    """``polls`` (stream time when read, notifications) through ``step`` as a runner that fires each timer as
    soon as event time passes it would: the timers before a poll's stream time fire before the poll.
    The stored rows by (period, instance), the late message ids, and the firings."""
    state = (_Cell(), _Bag(), _Timer())
    frames, late, firings = [], [], 0

    def fire_before(limit: datetime) -> None:
        nonlocal firings
        while (when := state[2].next()) is not None and when < Timestamp.from_utc_datetime(limit):
            state[2].fired(when)
            firings += 1
            frames.extend(fire(step, state, when.to_utc_datetime().replace(tzinfo=UTC)))

    for stream_time, notes in polls:
        moment = at(stream_time)
        fire_before(moment)
        for out in step.process((SCOPE, (Timestamp.from_utc_datetime(moment).micros, matches(step, *notes))),
                                head=state[0], log=state[1], due=state[2]):
            if isinstance(out, TaggedOutput):
                late.append(out.value[0])
            else:
                frames.append(out)
    fire_before(until)
    rows = {(r["begin"], r["groupby.instance_id"]): r["qty"] for f in frames for r in to_frame(f).to_dicts()}
    return rows, sorted(late), firings


def test_coarse_timers_store_what_exact_timers_store_and_fire_fewer_times(step):
    """The stream's instance timers are rounded up to a minute (``STREAM_TIMER_STEP``): the same polls through
    a step with exact timers and one with coarse timers store the same rows and record the same events
    late, with fewer firings.  The case that needs the rule of ``_closed_by_time``: i-1 fires at 10:45:10
    (delete 10:40:10 + 5 min), its coarse timer runs at 10:46; an update of i-1 read at 10:45:20 is late on
    both (its instance was due before the stream's time), though its own time + fire_delay is not past."""
    exact = step
    coarse = ScopeFn(dataclasses.replace(step._job, timer_step=events_scope.STREAM_TIMER_STEP,
                                         run_id=step._job.run_id + "-coarse"))
    coarse.setup()
    try:
        polls = [
            ("10:00", [nova("compute.instance.create.end", f"10:{n:02d}:{7 * n % 60:02d}", instance_id=f"i-{n}")
                       for n in range(1, 30)]),
            ("10:30", [nova("compute.instance.delete.end", f"10:{38 + n % 20:02d}:{11 * n % 60:02d}",
                            instance_id=f"i-{n}") for n in range(2, 30, 3)]
             + [nova("compute.instance.delete.end", "10:40:10", instance_id="i-1")]),
            ("10:45:20", [nova("compute.instance.resize.confirm.end", "10:44:30", instance_id="i-1",
                               flavor="m1.large", message_id="straggler-i-1")]),
            ("11:03", [nova("compute.instance.delete.end", f"11:0{n % 3}:{13 * n % 60:02d}", instance_id=f"i-{n}")
                       for n in range(3, 30, 3)]),
            ("12:30", [nova("compute.instance.create.end", "12:29", instance_id="i-clock")]),
        ]
        until = datetime(2026, 3, 2, 13, 10, tzinfo=UTC)
        exact_rows, exact_late, exact_firings = _stream(exact, polls, until)
        coarse_rows, coarse_late, coarse_firings = _stream(coarse, polls, until)
    finally:
        coarse.teardown()
    assert exact_late == coarse_late == ["straggler-i-1"]
    assert coarse_rows == exact_rows
    assert len({k[1] for k in exact_rows}) >= 20 and sum(exact_rows.values(), Decimal(0)) > 0
    assert coarse_firings < exact_firings, (coarse_firings, exact_firings)  # 9 deletes in 3 minutes: 3 firings

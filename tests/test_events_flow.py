"""The pure event path end to end, as the streaming job drives it, with the package's default files.

Notifications (Nova's shapes, out of order, each delivered twice) → definitions → triggers → trigger
instance → lifecycle rows at each period end while the instance lives and when it fires → rated.
The rows kept (the last write of a point wins, as in storage: the flavor is a groupby label, so it
is in the point id) are the worked example's.  The resize arrives after the 11:00 period closed: that
period was first billed as one hour of m1.small, then rewritten when the instance fired — a late
event that changes a closed period must rewrite it (see the contract's note for the stream).  A
straggler after the fire is late, not lost.
"""

from __future__ import annotations

from decimal import Decimal

import polars as pl
from events_support import EVENTS_DATA, at, default_definitions_data, default_triggers_data, nova, rated

from ratebeam.pipelines.events.config import read_pipelines
from ratebeam.transforms.events.definitions import EventDefinitions
from ratebeam.transforms.events.instance import Added, TriggerInstance
from ratebeam.transforms.events.lifecycle import lifecycle_usage, period_end
from ratebeam.transforms.events.triggers import TriggerSet
from ratebeam.transforms.frames import Frame, to_batch, to_frame

HOUR = 3600


def test_notifications_to_rated_rows_with_the_default_files():
    definitions = EventDefinitions.from_yaml_data(default_definitions_data(), "event_definitions.yaml")
    pipelines = {name: p.settings("project_id") for name, p in read_pipelines(
        EVENTS_DATA / "lifecycles.yaml", "lifecycles.yaml").items()}
    triggers = TriggerSet.from_yaml_data(default_triggers_data(), "triggers.yaml", set(pipelines))
    arrivals = [  # (arrival time, notification): the resize arrives after the 12:00 period end, twice
        ("10:20", nova("compute.instance.create.end", "10:20", flavor="m1.small")),
        ("10:21", nova("compute.instance.create.end", "10:20", flavor="m1.small")),
        ("12:41", nova("compute.instance.delete.end", "12:40", flavor="m1.large")),
        ("12:43", nova("compute.instance.finish_resize.end", "11:05", flavor="m1.large")),
        ("12:44", nova("compute.instance.finish_resize.end", "11:05", flavor="m1.large")),
        ("13:30", nova("compute.instance.exists", "13:30", flavor="m1.large",
                       audit_period_beginning="2026-03-02 12:00:00", audit_period_ending="2026-03-02 13:00:00")),
    ]
    instances: dict[tuple, TriggerInstance] = {}
    stored: dict[tuple, dict] = {}
    outcomes = []

    def bill(instance, closed_until):
        trigger = triggers.by_name(instance.trigger)
        batch, found = lifecycle_usage(instance.events, pipelines[trigger.fire_pipeline], HOUR, closed_until)
        assert found == []
        for row in ([] if batch is None else to_frame(batch).to_dicts()):
            stored[(row["begin"], row["groupby.flavor_name"])] = row

    clock = ["11:00", "12:00", "12:45", "13:00", "14:00"]  # period ends and the fire timer (12:40 + 5 min)
    for arrived, note in arrivals:
        while clock and at(clock[0]) <= at(arrived):
            now = at(clock.pop(0))
            for inst in instances.values():
                definition = triggers.by_name(inst.trigger)
                if inst.fire(definition, now) is not None:
                    bill(inst, period_end(inst.last, HOUR))
                elif not inst.closed:
                    bill(inst, now)
            if now == at("12:00"):
                assert stored[(at("11:00"), "m1.small")]["qty"] == Decimal(3600)  # the resize not heard yet
        event = definitions.convert(note)
        for trigger, key in triggers.matches(event):
            inst = instances.setdefault((trigger.name, key), TriggerInstance(trigger.name, key))
            outcomes.append(inst.add(event, trigger))
    assert outcomes == [Added.ADDED, Added.DUPLICATE, Added.ADDED, Added.ADDED, Added.DUPLICATE, Added.LATE]
    assert list(instances) == [("instance_lifecycle", ("i-1",))]
    rows = rated(to_batch(pl.DataFrame(list(stored.values())), {Frame(r["scope_id"], r["begin"]) for r in stored.values()}))
    per = {(r["begin"].strftime("%H:%M"), r["groupby.flavor_name"]): (r["qty"], r["price"]) for r in rows.to_dicts()}
    assert per == {("10:00", "m1.small"): (Decimal(2400), Decimal("0.24")),
                   ("11:00", "m1.small"): (Decimal(300), Decimal("0.03")),
                   ("11:00", "m1.large"): (Decimal(3300), Decimal("1.32")),
                   ("12:00", "m1.large"): (Decimal(2400), Decimal("0.96"))}

"""The trigger instance state machine (seed 002, *Trigger instance*): collect, fire once, expire once."""

from __future__ import annotations

import pickle

from events_support import at, event

from ratebeam.transforms.events.instance import Added, TriggerInstance
from ratebeam.transforms.events.triggers import TriggerSet


def trigger(**over):
    base = {"name": "life", "distinguished_by": "instance_id",
            "match_criteria": [{"event_type": "compute.instance.*"}],
            "fire_criteria": [{"event_type": "compute.instance.delete.end"}],
            "fire_delay": 300, "fire_pipeline": "lifecycle"}
    return TriggerSet.from_yaml_data([base | over], "t.yaml").triggers[0]


def ev(event_type, when, instance_id="i-1", **traits):
    return event(f"compute.instance.{event_type}", when, instance_id=instance_id, **traits)


def test_collects_in_time_order_and_fires_once_after_the_delay():
    t = trigger()
    inst = TriggerInstance("life", ("i-1",))
    delete, create, resize = ev("delete.end", "12:40"), ev("create.end", "10:20"), ev("resize.confirm.end", "11:05")
    assert [inst.add(e, t) for e in (delete, create)] == [Added.ADDED, Added.ADDED]   # out of order
    assert inst.fire_at(t) == at("12:45")
    assert inst.next_timer(t) == at("12:45")
    assert not inst.fire_due(t, at("12:44:59")) and inst.fire(t, at("12:44:59")) is None
    assert inst.add(resize, t) is Added.ADDED                                   # a straggler within the delay
    assert inst.events == [create, resize, delete]
    assert inst.fire(t, at("12:45")) == [create, resize, delete]
    assert inst.fired and inst.closed and inst.next_timer(t) is None
    assert inst.fire(t, at("13:00")) is None and inst.expire(t, at("13:00")) is None   # never twice
    assert inst.add(ev("exists", "12:50"), t) is Added.LATE                   # after firing: late, not lost silently


def test_a_later_event_moves_the_fire_time():
    t = trigger()
    inst = TriggerInstance("life", ("i-1",))
    inst.add(ev("delete.end", "12:40"), t)
    assert inst.fire_at(t) == at("12:45")
    inst.add(ev("exists", "12:42"), t)                                           # later than the delete
    assert inst.fire_at(t) == at("12:47")


def test_duplicates_and_foreign_events_change_nothing():
    t = trigger()
    inst = TriggerInstance("life", ("i-1",))
    create = ev("create.end", "10:20")
    assert inst.add(create, t) is Added.ADDED
    assert inst.add(create, t) is Added.DUPLICATE and inst.events == [create]
    assert inst.add(ev("create.end", "10:21", instance_id="i-2"), t) is Added.NOT_MATCHED
    assert inst.add(event("volume.create.end", "10:22", instance_id="i-1"), t) is Added.NOT_MATCHED
    inst.fired = True
    assert inst.add(create, t) is Added.DUPLICATE                               # a redelivery stays a duplicate


def test_expiry_when_the_fire_criteria_are_not_met():
    t = trigger(expiration="last+2h", expire_pipeline="lifecycle")
    inst = TriggerInstance("life", ("i-1",))
    inst.add(ev("create.end", "10:20"), t)
    assert inst.expire_at(t) == at("12:20") and inst.next_timer(t) == at("12:20")
    inst.add(ev("exists", "11:00"), t)                                           # last+2h: the clock is reset
    assert inst.expire_at(t) == at("13:00")
    assert inst.expire(t, at("12:59")) is None
    events = inst.expire(t, at("13:00"))
    assert [e.event_type for e in events] == ["compute.instance.create.end", "compute.instance.exists"]
    assert inst.expired and inst.expire(t, at("14:00")) is None and inst.fire(t, at("14:00")) is None


def test_first_based_expiration_and_fire_beats_expiry():
    t = trigger(expiration="first@00:00+1d")
    inst = TriggerInstance("life", ("i-1",))
    inst.add(ev("create.end", "10:20"), t)
    assert inst.expire_at(t) == at("2026-03-03T00:00:00")
    inst.add(ev("delete.end", "23:58"), t)
    assert inst.expire_at(t) is None                                             # ready to fire: no expiry
    assert not inst.expire_due(t, at("2026-03-03T00:00:00"))
    assert inst.fire(t, at("2026-03-03T00:03:00")) is not None and not inst.expired


def test_time_criteria_are_checked_against_the_instance():
    t = trigger(match_criteria=[{"event_type": "compute.instance.*", "timestamp": "first@00:00 to last+2h"}])
    inst = TriggerInstance("life", ("i-1",))
    assert inst.add(ev("create.end", "10:20"), t) is Added.ADDED
    assert inst.add(ev("exists", "12:19"), t) is Added.ADDED                    # within 2h of the latest
    assert inst.add(ev("exists", "14:20"), t) is Added.NOT_MATCHED              # 2h01 after it
    assert inst.add(ev("exists", "2026-03-01T23:00:00"), t) is Added.NOT_MATCHED  # before the first's midnight


def test_no_events_nothing_pending_and_picklable():
    t = trigger(expiration="last+1h")
    inst = TriggerInstance("life", ("i-1",))
    assert inst.next_timer(t) is None and inst.first is None and not inst.fire_due(t, at("23:00"))
    inst.add(ev("create.end", "10:20"), t)
    copy = pickle.loads(pickle.dumps(inst))
    assert copy == inst and copy.next_timer(t) == at("11:20")

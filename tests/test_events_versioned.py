"""Nova's versioned notifications through the package's default files bill as the legacy ones do.

Payloads: ``tests/events_support.nova_versioned`` (Nova's ``doc/notification_samples``:
``instance-create-end.json``, ``instance-delete-end.json``, ``instance-resize_finish-end.json``,
``instance-resize_confirm-end.json``, ``instance-exists.json`` and their ``common_payloads``
``InstanceCreatePayload`` / ``InstanceActionPayload`` / ``InstancePayload`` / ``FlavorPayload`` /
``InstanceExistsPayload`` / ``AuditPeriodPayload``) beside the legacy ``events_support.nova`` with
the same values.  Each lifecycle goes definitions → triggers → one trigger instance → fired →
lifecycle rows → rated by the hashmap chain (``tests/data/lifecycle_rules.json``), and is checked
against the worked example's hand computation (docs/events.md).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from events_support import (
    EVENTS_DATA,
    FLAVORS,
    default_definitions_data,
    default_triggers_data,
    nova,
    nova_versioned,
    rated,
)

from ratebeam.pipelines.events.config import read_pipelines
from ratebeam.transforms.events.definitions import EventDefinitions
from ratebeam.transforms.events.instance import Added, TriggerInstance
from ratebeam.transforms.events.lifecycle import lifecycle_usage, period_end
from ratebeam.transforms.events.model import Notification
from ratebeam.transforms.events.triggers import TriggerSet

HOUR = 3600
DEFINITIONS = EventDefinitions.from_yaml_data(default_definitions_data(), "event_definitions.yaml")
PIPELINES = {name: p.settings("project_id")
             for name, p in read_pipelines(EVENTS_DATA / "lifecycles.yaml", "lifecycles.yaml").items()}
TRIGGERS = TriggerSet.from_yaml_data(default_triggers_data(), "triggers.yaml", set(PIPELINES))
LEGACY = {"create": "compute.instance.create.end", "resize": "compute.instance.finish_resize.end",
          "confirm": "compute.instance.resize.confirm.end", "delete": "compute.instance.delete.end"}
VERSIONED = {"create": "instance.create.end", "resize": "instance.resize_finish.end",
             "confirm": "instance.resize_confirm.end", "delete": "instance.delete.end"}
#: The worked example: created 10:20 m1.small, resized 11:05 (confirmed 11:07) to m1.large, deleted 12:40.
WORKED = [("create", "10:20", "m1.small"), ("resize", "11:05", "m1.large"), ("confirm", "11:07", "m1.large"),
          ("delete", "12:40", "m1.large")]
#: Its rows by hand: (period, flavor) → (seconds, price at 0.0001 / 0.0004 per second).
BY_HAND = {("10:00", "m1.small"): (Decimal(2400), Decimal("0.24")),
           ("11:00", "m1.small"): (Decimal(300), Decimal("0.03")),
           ("11:00", "m1.large"): (Decimal(3300), Decimal("1.32")),
           ("12:00", "m1.large"): (Decimal(2400), Decimal("0.96"))}
UBUNTU = {"image_meta": {"org.openstack__1__os_distro": "ubuntu"}}


def legacy(change: str, when: str, flavor: str, **extra: Any) -> Notification:
    """The legacy notification of a change (the flavor's values flattened, as Nova's legacy payload has them)."""
    f = FLAVORS[flavor]
    if change == "delete":
        extra |= {"state": "deleted", "deleted_at": "2026-03-02 12:40:00", "terminated_at": "2026-03-02 12:40:00"}
    return nova(LEGACY[change], when, flavor=flavor, memory_mb=f["memory_mb"], vcpus=f["vcpus"],
                root_gb=f["root_gb"], instance_flavor_id=f["flavorid"], **extra)


def versioned(change: str, when: str, flavor: str, **extra: Any) -> Notification:
    """The versioned notification of the same change."""
    if change == "delete":
        extra |= {"state": "deleted", "deleted_at": "2026-03-02T12:40:00Z", "terminated_at": "2026-03-02T12:40:00Z"}
    return nova_versioned(VERSIONED[change], when, flavor=flavor, **extra)


def bill(notes: list[Notification]):
    """The notes through the default definitions and triggers, fired, billed and rated: (rows, discrepancies)."""
    instances: dict[tuple, TriggerInstance] = {}
    for note in notes:
        event = DEFINITIONS.convert(note)
        for trigger, key in TRIGGERS.matches(event):
            inst = instances.setdefault((trigger.name, key), TriggerInstance(trigger.name, key))
            assert inst.add(event, trigger) is Added.ADDED
    (inst,) = instances.values()
    definition = TRIGGERS.by_name(inst.trigger)
    events = inst.fire(definition, inst.fire_at(definition))
    assert events is not None and inst.last is not None
    batch, found = lifecycle_usage(events, PIPELINES[definition.fire_pipeline], HOUR, period_end(inst.last, HOUR))
    return rated(batch).sort("begin", "groupby.flavor_name"), found


def per_period(frame) -> dict[tuple[str, str], tuple[Decimal, Decimal]]:
    return {(r["begin"].strftime("%H:%M"), r["groupby.flavor_name"]): (r["qty"], r["price"]) for r in frame.to_dicts()}


def test_a_versioned_notification_has_the_legacy_traits():
    for change, when, flavor in WORKED:
        old, new = DEFINITIONS.convert(legacy(change, when, flavor)), DEFINITIONS.convert(versioned(change, when, flavor))
        assert old.traits["service"] == "compute.compute-1-5-6-7" and new.traits["service"] == "nova-compute:compute-1-5-6-7"
        assert {k: v for k, v in new.traits.items() if k != "service"} == {
            k: v for k, v in old.traits.items() if k != "service"}
        assert new.traits["flavor_name"] == flavor and new.traits["memory_mb"] == FLAVORS[flavor]["memory_mb"]


def test_the_worked_example_as_versioned_notifications_gives_the_legacy_rows():
    rows, found = bill([versioned(*change) for change in WORKED])
    legacy_rows, legacy_found = bill([legacy(*change) for change in WORKED])
    assert found == legacy_found == []
    assert rows.to_dicts() == legacy_rows.to_dicts()
    assert per_period(rows) == BY_HAND and sum(rows["price"]) == Decimal("2.55")
    assert set(rows["metadata.flavor_id"]) == {"2", "4"} and set(rows["metadata.vcpus"]) == {"1", "4"}


def test_instance_exists_bills_an_instance_whose_create_was_not_seen():
    """Nova's hourly audit (``instance_usage_audit_period = hour``) at 11:00:30 names the 10:00 - 11:00 period."""
    audit = ("2026-03-02T10:00:00Z", "2026-03-02T11:00:00Z")
    rows, found = bill([versioned("delete", "12:40", "m1.small"),  # arrival order does not matter
                        nova_versioned("instance.exists", "11:00:30", flavor="m1.small", audit_period=audit)])
    assert [(d.kind, d.message_id) for d in found] == [("start_not_seen", "instance.exists-i-1-11:00:30")]
    assert per_period(rows) == {("10:00", "m1.small"): (Decimal(2400), Decimal("0.24")),  # from launched_at 10:20
                                ("11:00", "m1.small"): (Decimal(3600), Decimal("0.36")),
                                ("12:00", "m1.small"): (Decimal(2400), Decimal("0.24"))}


def test_both_formats_at_once_bill_each_change_once_at_its_earlier_copy():
    """``notification_format = both``: every change twice, a quarter second apart, in either order.

    The versioned copy comes first for the create and the resizes, the legacy one for the delete.
    Billing at the later copy would give 2399.75 s at 10:00, 300.25 s of m1.small at 11:00 and
    2400.25 s at 12:00; billing both would give every period twice.  Only the legacy copies carry
    the image's ``os_distro``: every row has it, the first segment too (opened by the versioned create).
    """
    notes = []
    for change, when, flavor in WORKED:
        later = f"{when}:00.250000"
        if change == "delete":
            notes += [legacy(change, when, flavor, **UBUNTU), versioned(change, later, flavor)]
        else:
            notes += [versioned(change, when, flavor), legacy(change, later, flavor, **UBUNTU)]
    rows, found = bill(notes)
    legacy_rows, _ = bill([legacy(*change, **UBUNTU) for change in WORKED])
    assert found == []
    assert rows.to_dicts() == legacy_rows.to_dicts()
    assert per_period(rows) == BY_HAND and set(rows["metadata.os_distro"]) == {"ubuntu"}

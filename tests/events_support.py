"""Notifications shaped as OpenStack sends them, for the event tests.

Payload shapes: Nova's from seed 002 (*Notification Examples*: ``compute.instance.create.end``,
``compute.instance.exists``) and Nova's legacy notification docs; Nova's versioned ones from Nova's
``doc/notification_samples`` (``instance-create-end.json``, ``instance-delete-end.json``,
``instance-resize_finish-end.json``, ``instance-exists.json`` and the ``common_payloads`` they
reference: ``InstancePayload``, ``FlavorPayload``, ``AuditPeriodPayload``); Cinder's ``volume.*`` and
Neutron's ``floatingip.*`` from those projects' documented samples (payload keys only: the values
are made up).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from ratebeam.pipelines.interchange import read_rules
from ratebeam.transforms.chain_rater import ChainRaterFactory
from ratebeam.transforms.events.definitions import EventDefinitions
from ratebeam.transforms.events.lifecycle import LifecycleSettings
from ratebeam.transforms.events.model import Event, Notification
from ratebeam.transforms.frames import to_frame
from ratebeam.transforms.metric_defs import MetricsConfig

EVENTS_DATA = Path(__file__).resolve().parents[1] / "pipelines" / "events" / "data"
DATA = Path(__file__).parent / "data"


def at(text: str) -> datetime:
    """``'10:20'`` on 2026-03-02, or a full ISO text, as aware UTC."""
    if "T" not in text:
        text = f"2026-03-02T{text}"
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def nova(event_type: str, when: str, instance_id: str = "i-1", flavor: str = "m1.small",
         message_id: str | None = None, tenant: str = "t-1", **extra: Any) -> Notification:
    """A Nova legacy notification of ``instance_id`` (seed 002's create.end payload keys)."""
    payload = {
        "state_description": "", "display_name": "testserver", "memory_mb": 512, "disk_gb": 20,
        "tenant_id": tenant, "created_at": "2026-03-02 10:19:00", "instance_type_id": 2,
        "instance_id": instance_id, "instance_type": flavor, "state": "active", "user_id": "u-1",
        "launched_at": "2026-03-02 10:20:00", "deleted_at": "",
        "image_ref_url": "http://127.0.0.1:9292/images/a1b2c3b4", **extra,
    }
    return Notification(message_id or f"{event_type}-{instance_id}-{when}", event_type,
                        "compute.compute-1-5-6-7", at(when), "INFO", payload, {"request_id": "req-1"})


#: Nova's flavors as its versioned FlavorPayload has them (the legacy payload flattens the same values).
FLAVORS: dict[str, dict[str, Any]] = {
    "m1.small": {"flavorid": "2", "memory_mb": 2048, "vcpus": 1, "root_gb": 20},
    "m1.large": {"flavorid": "4", "memory_mb": 8192, "vcpus": 4, "root_gb": 80},
}
#: The nova_object each versioned event type carries (the others: InstanceActionPayload 1.9).
_VERSIONED_PAYLOADS = {"instance.create.end": ("InstanceCreatePayload", "1.13"),
                       "instance.exists": ("InstanceExistsPayload", "2.1")}


def nova_object(name: str, version: str, data: dict[str, Any]) -> dict[str, Any]:
    """A serialized nova_object, as every versioned payload and its parts are."""
    return {"nova_object.name": name, "nova_object.namespace": "nova", "nova_object.version": version,
            "nova_object.data": data}


def nova_versioned_payload(event_type: str, instance_id: str = "i-1", flavor: str = "m1.small",
                           tenant: str = "t-1", audit_period: tuple[str, str] | None = None,
                           **data: Any) -> dict[str, Any]:
    """A versioned instance payload (InstancePayload's keys; ``audit_period``: InstanceExistsPayload's)."""
    fields: dict[str, Any] = {
        "uuid": instance_id, "tenant_id": tenant, "user_id": "u-1", "display_name": "testserver",
        "host": "compute-1-5-6-7", "node": "fake-mini", "availability_zone": "nova", "state": "active",
        "power_state": "running", "task_state": None, "created_at": "2026-03-02T10:19:00Z",
        "launched_at": "2026-03-02T10:20:00Z", "deleted_at": None, "terminated_at": None,
        "image_uuid": "155d900f-4e14-4e4c-a73d-069cbf4541e6", "metadata": {},
        "flavor": nova_object("FlavorPayload", "1.4", {"name": flavor, **FLAVORS[flavor], "ephemeral_gb": 0,
                                                       "swap": 0, "disabled": False, "is_public": True}),
    }
    if audit_period is not None:
        fields["audit_period"] = nova_object("AuditPeriodPayload", "1.0", {
            "audit_period_beginning": audit_period[0], "audit_period_ending": audit_period[1]})
    name, version = _VERSIONED_PAYLOADS.get(event_type, ("InstanceActionPayload", "1.9"))
    return nova_object(name, version, fields | data)


def nova_versioned(event_type: str, when: str, instance_id: str = "i-1", message_id: str | None = None,
                   **kwargs: Any) -> Notification:
    """A Nova versioned notification (``instance.*``, publisher ``nova-compute:<host>``)."""
    return Notification(message_id or f"{event_type}-{instance_id}-{when}", event_type, "nova-compute:compute-1-5-6-7",
                        at(when), "INFO", nova_versioned_payload(event_type, instance_id, **kwargs),
                        {"request_id": "req-1"})


def cinder(event_type: str, when: str, volume_id: str = "v-1", size: int = 10, **extra: Any) -> Notification:
    """A Cinder ``volume.*`` notification (Cinder's volume usage payload keys)."""
    payload = {"tenant_id": "t-1", "user_id": "u-1", "volume_id": volume_id, "size": size,
               "volume_type": "ssd", "status": "available", "display_name": "vol",
               "availability_zone": "nova", "created_at": "2026-03-02T10:00:00", **extra}
    return Notification(f"{event_type}-{volume_id}-{when}", event_type, "volume.host1@lvm", at(when), "INFO",
                        payload, {})


def neutron(event_type: str, when: str, fip_id: str = "f-1") -> Notification:
    """A Neutron ``floatingip.*`` notification (create/update: the resource; delete: its id)."""
    if event_type == "floatingip.delete.end":
        payload: dict[str, Any] = {"floatingip_id": fip_id}
    else:
        payload = {"floatingip": {"id": fip_id, "tenant_id": "t-1", "floating_ip_address": "172.24.4.3",
                                  "floating_network_id": "net-ext", "port_id": None, "status": "DOWN"}}
    return Notification(f"{event_type}-{fip_id}-{when}", event_type, "network.controller", at(when), "INFO",
                        payload, {"project_id": "t-1", "request_id": "req-9"})


def default_definitions_data() -> Any:
    """The shipped ``event_definitions.yaml``, loaded."""
    return yaml.safe_load((EVENTS_DATA / "event_definitions.yaml").read_text())


def event(event_type: str, when: str, message_id: str | None = None, **traits: Any) -> Event:
    """An event as the definitions would give it (for trigger and lifecycle tests)."""
    return Event(message_id or f"{event_type}@{when}:{sorted(traits.items())}", event_type, at(when), traits)


def default_triggers_data() -> Any:
    """The shipped ``triggers.yaml``, loaded."""
    return yaml.safe_load((EVENTS_DATA / "triggers.yaml").read_text())


# ---- the worked example of docs/events.md ----

INSTANCE = LifecycleSettings(
    type="instance", start_events=("compute.instance.create.end",),
    resize_events=("compute.instance.finish_resize.end", "compute.instance.resize.confirm.end"),
    end_events=("compute.instance.delete.end",), exists_events=("compute.instance.exists",),
    price_traits=("flavor_name",), groupby=("instance_id", "flavor_name"), metadata=("host",))


def worked_example_events() -> list[Event]:
    """Created 10:20 m1.small, resized 11:05 (confirmed 11:07) to m1.large, deleted 12:40: Nova's notifications, converted."""
    definitions = EventDefinitions.from_yaml_data(default_definitions_data(), "event_definitions.yaml")
    notes = [nova("compute.instance.create.end", "10:20", flavor="m1.small"),
             nova("compute.instance.finish_resize.end", "11:05", flavor="m1.large"),
             nova("compute.instance.resize.confirm.end", "11:07", flavor="m1.large"),   # no change: no cut
             nova("compute.instance.delete.end", "12:40", flavor="m1.large", deleted_at="2026-03-02 12:40:00")]
    return [definitions.convert(n) for n in notes]


def rows(batch):
    """(period begin HH:MM, flavor, qty) of a usage batch, sorted."""
    frame = to_frame(batch).sort("begin", "groupby.flavor_name")
    return [(b.strftime("%H:%M"), f, q) for b, f, q in frame.select("begin", "groupby.flavor_name", "qty").iter_rows()]


def rated(batch, rules_file="lifecycle_rules.json"):
    """The batch rated by the cycle's module chain (hashmap) with ``tests/data/<rules_file>``."""
    factory = ChainRaterFactory(read_rules(DATA / rules_file), (("hashmap", True, 1),), (), MetricsConfig(()))
    frame, failures = factory()(to_frame(batch))
    assert failures == []
    return frame

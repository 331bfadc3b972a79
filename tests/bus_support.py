"""Notifications published as OpenStack services publish them: a real oslo.messaging ``Notifier`` on the bus.

Payload shapes:

* Nova: seed 002's *Notification Examples* (``compute.instance.create.end``,
  ``compute.instance.resize.confirm.end`` and the periodic ``compute.instance.exists``: the
  legacy, unversioned payload with ``tenant_id``, ``instance_id``, ``instance_type``, ``memory_mb``,
  ``launched_at``...), ``compute.instance.delete.end`` as Nova's legacy notification adds
  ``deleted_at`` / ``terminated_at`` (nova/notifications/base.py ``info_from_instance``).
* Cinder: ``volume.create.end`` / ``volume.delete.end`` as cinder/volume/utils.py
  ``_usage_from_volume`` builds them (``volume_id``, ``tenant_id``, ``size``, ``volume_type``,
  ``status``, ``created_at``...).
* Neutron: ``floatingip.create.end`` / ``floatingip.delete.end`` as neutron's notifier sends the
  API resource (``{"floatingip": {"id", "tenant_id", "floating_ip_address", ...}}``;
  the delete carries ``{"floatingip_id": ...}``).

``publish`` hands the message to the Notifier's own drivers (``ext.obj.notify``, the call
``Notifier._notify`` makes) so the test chooses its ``message_id`` and ``timestamp`` — a duplicate
is the same message twice, as a redelivery is — and everything else (envelope v1 or v2, exchange,
routing key ``notifications.info``, the ``_context_*`` keys) is oslo.messaging's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import oslo_messaging
from oslo_config import cfg

NOTIFICATIONS = "notifications"


@contextmanager
def notifier(url: str, exchange: str, publisher_id: str, driver: str = "messagingv2",
             topic: str = NOTIFICATIONS) -> Iterator[oslo_messaging.Notifier]:
    """An oslo.messaging Notifier of a service whose control exchange is ``exchange``, on ``topic``."""
    conf = cfg.ConfigOpts()
    conf([], project="ratebeam-tests")
    oslo_messaging.get_notification_transport(conf, url=url).cleanup()  # registers the transport options
    conf.set_override("control_exchange", exchange)
    transport = oslo_messaging.get_notification_transport(conf, url=url)
    try:
        yield oslo_messaging.Notifier(transport, publisher_id=publisher_id, driver=driver, topics=[topic])
    finally:
        transport.cleanup()


def message(event_type: str, payload: dict[str, Any], at: datetime, message_id: str | None = None,
            publisher_id: str = "compute.host-1") -> dict[str, Any]:
    """The message ``Notifier._notify`` builds (oslo's ``str(timeutils.utcnow())`` time format)."""
    return {"message_id": message_id or str(uuid.uuid4()), "publisher_id": publisher_id, "event_type": event_type,
            "priority": "INFO", "payload": payload, "timestamp": str(at.replace(tzinfo=None))}


def publish(n: oslo_messaging.Notifier, msg: dict[str, Any], ctxt: dict[str, Any] | None = None) -> None:
    """Send ``msg`` through the Notifier's drivers, as ``Notifier._notify`` does."""
    for ext in n._driver_mgr:
        ext.obj.notify(ctxt or {"request_id": f"req-{msg['message_id'][:8]}"}, msg, "INFO", None)


def nova_instance(instance_id: str, tenant: str, flavor: str, at: datetime, **extra: Any) -> dict[str, Any]:
    """A legacy Nova instance payload (seed 002's example, with this instance's values)."""
    return {"state_description": "", "display_name": "testserver", "memory_mb": 512, "disk_gb": 20,
            "tenant_id": tenant, "user_id": "67890", "created_at": str(at.replace(tzinfo=None)),
            "instance_type_id": 2, "instance_id": instance_id, "instance_type": flavor, "state": "active",
            "launched_at": str(at.replace(tzinfo=None)),
            "image_ref_url": "http://127.0.0.1:9292/images/12345678-201f-4600-b5a1-0b97e2b1cb31", **extra}


def cinder_volume(volume_id: str, tenant: str, size: int, at: datetime) -> dict[str, Any]:
    """Cinder's volume usage payload (``_usage_from_volume``)."""
    return {"tenant_id": tenant, "user_id": "67890", "volume_id": volume_id, "size": size,
            "volume_type": "standard", "status": "available", "display_name": "data",
            "availability_zone": "nova", "created_at": str(at.replace(tzinfo=None)), "launched_at": ""}


def neutron_floatingip(ip_id: str, tenant: str) -> dict[str, Any]:
    """Neutron's ``floatingip.create.end`` payload (the API resource)."""
    return {"floatingip": {"id": ip_id, "tenant_id": tenant, "project_id": tenant,
                           "floating_ip_address": "172.24.4.10", "floating_network_id": "ext-net",
                           "router_id": None, "port_id": None, "fixed_ip_address": None, "status": "DOWN"}}


def publish_many(url: str, messages: list[tuple[str, dict[str, Any]]], ctxt: dict[str, Any] | None = None) -> None:
    """``(exchange, message)`` in order, each in oslo.messaging's v2 envelope, on one kombu connection.

    The envelope and routing key a ``messagingv2`` Notifier sends (``{"oslo.version": "2.0",
    "oslo.message": <JSON text>}``, ``notifications.info``, the context as ``_context_<key>``); a
    Notifier per message is too slow to queue hundreds of them for a test.
    """
    import json

    import kombu

    with kombu.Connection(url.replace("rabbit://", "amqp://")) as conn:
        producer = conn.Producer()
        for exchange, msg in messages:
            context = ctxt or {"request_id": f"req-{msg['message_id'][:8]}"}
            body = {**msg, **{f"_context_{k}": v for k, v in context.items()}}
            producer.publish(json.dumps({"oslo.version": "2.0", "oslo.message": json.dumps(body)}),
                             exchange=kombu.Exchange(exchange, type="topic", durable=False),
                             routing_key=f"{NOTIFICATIONS}.info", content_type="application/json")

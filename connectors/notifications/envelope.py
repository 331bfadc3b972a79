"""oslo.messaging's notification envelope → ``transforms.events.model.Notification``, or why not.

What a notifier puts on the bus (oslo.messaging ``_drivers/common.py``): with
``rabbit`` and message version 2 (the default) a JSON object ``{"oslo.version": "2.0",
"oslo.message": "<JSON text>"}``; version 1 (older services, ``messagingv1``) the message itself.
The message holds ``message_id``, ``event_type``, ``publisher_id``, ``priority``, ``timestamp``
(``"2012-03-12 17:01:29.899834"``: UTC without an offset, as ``oslo_utils.timeutils.utcnow``
prints it), ``payload``, and the request context flattened as ``_context_<key>`` keys.

Anything else is not a notification ratebeam can rate: :func:`parse` returns a :class:`Rejected`
with the reason, which the source records as a dead letter (and acknowledges: a message that
cannot be read will not become readable by being delivered again).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ratebeam.transforms.events.model import Notification, parse_instant

_CONTEXT = "_context_"
_REQUIRED = ("message_id", "event_type")


@dataclass(frozen=True)
class Rejected:
    """A message that is not a notification: the reason, and its ``message_id`` when it has one."""

    reason: str
    message_id: str | None = None


def parse(body: str | bytes | Mapping[str, Any]) -> Notification | Rejected:
    """The notification a message body carries (v2 or v1 envelope), or why it is not one."""
    try:
        message = _loads(body) if isinstance(body, str | bytes) else body
    except ValueError as exc:
        return Rejected(f"not JSON: {exc}")
    if not isinstance(message, Mapping):
        return Rejected(f"not a JSON object: {type(message).__name__}")
    if "oslo.message" in message:
        version = message.get("oslo.version")
        if version != "2.0":
            return Rejected(f"unknown envelope version oslo.version={version!r} (expected '2.0')")
        inner = message["oslo.message"]
        if not isinstance(inner, str):
            return Rejected("oslo.message is not JSON text")
        try:
            message = _loads(inner)
        except ValueError as exc:
            return Rejected(f"oslo.message is not JSON: {exc}")
        if not isinstance(message, Mapping):
            return Rejected("oslo.message is not a JSON object")
    return _notification(message)


def _loads(text: str | bytes) -> Any:
    return json.loads(text)


def _notification(message: Mapping[str, Any]) -> Notification | Rejected:
    raw_id = message.get("message_id")
    message_id = raw_id if isinstance(raw_id, str) and raw_id else None
    for key in _REQUIRED:
        value = message.get(key)
        if not isinstance(value, str) or not value:
            return Rejected(f"{key}: missing or not a non-empty string: {value!r}", message_id)
    assert message_id is not None
    payload = message.get("payload", {})
    if not isinstance(payload, Mapping):
        return Rejected(f"payload: not a JSON object: {type(payload).__name__}", message_id)
    try:
        timestamp = parse_instant(message.get("timestamp"))
    except ValueError as exc:
        return Rejected(f"timestamp: {exc}", message_id)
    return Notification(
        message_id=message_id,
        event_type=message["event_type"],
        publisher_id=str(message.get("publisher_id") or ""),
        timestamp=timestamp,
        priority=str(message.get("priority") or "INFO").upper(),
        payload=payload,
        ctxt={k[len(_CONTEXT):]: v for k, v in message.items() if k.startswith(_CONTEXT)},
    )

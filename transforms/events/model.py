"""The values that travel through the event path: a parsed notification, the event made of it.

Why frozen dataclasses: they cross Beam boundaries (pickled into state and timers) and must compare
by value, so a redelivered notification gives an equal event.  Every datetime is aware UTC.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: A trait's value: ``text`` → str, ``int`` → int, ``float`` → float, ``datetime`` → aware UTC.
TraitValue = str | int | float | datetime | None


@dataclass(frozen=True)
class Notification:
    """One oslo.messaging notification as the source parsed it (v1 or v2 envelope).

    ``ctxt`` is the request context with the ``_context_`` prefix of the v2 envelope removed
    (``request_id``, ``project_id``...); it may be empty.
    """

    message_id: str
    event_type: str
    publisher_id: str
    timestamp: datetime
    priority: str
    payload: Mapping[str, Any]
    ctxt: Mapping[str, Any]

    def __reduce__(self) -> tuple[type[Notification], tuple[Any, ...]]:
        """Pickled as its fields (the reprocessing job's reader hands batches of them to its match step)."""
        return Notification, (self.message_id, self.event_type, self.publisher_id, self.timestamp, self.priority,
                              self.payload, self.ctxt)

    def body(self) -> dict[str, Any]:
        """The document the definitions' JSONPath fields are read from (Ceilometer's notification body).

        Top-level keys: ``message_id``, ``event_type``, ``publisher_id``, ``timestamp`` (ISO text),
        ``priority``, ``payload`` and ``ctxt``; ``metadata.message_id`` / ``metadata.timestamp`` too,
        where Ceilometer's own definitions find them.
        """
        stamp = self.timestamp.isoformat()
        return {
            "message_id": self.message_id, "event_type": self.event_type, "publisher_id": self.publisher_id,
            "timestamp": stamp, "priority": self.priority, "payload": self.payload, "ctxt": self.ctxt,
            "metadata": {"message_id": self.message_id, "timestamp": stamp},
        }


@dataclass(frozen=True)
class Event:
    """A notification converted by the event definitions: its id, type, time and typed traits.

    ``traits`` holds the default traits (``service``, ``tenant_id``, ``request_id``) when the
    notification has them; an absent trait is absent, never ``None``.
    """

    message_id: str
    event_type: str
    generated: datetime
    traits: Mapping[str, TraitValue]

    def trait(self, name: str) -> TraitValue:
        """The value of trait ``name`` (``None`` when the event does not have it)."""
        return self.traits.get(name)

    def __reduce__(self) -> tuple[type[Event], tuple[str, str, datetime, Mapping[str, TraitValue]]]:
        """Pickled as its fields: half the time of a dataclass's default (events go into state and bills often)."""
        return Event, (self.message_id, self.event_type, self.generated, self.traits)


def parse_instant(value: object) -> datetime:
    """An ISO-8601 text (``2012-03-12 17:01:29.899834``, ``...Z``, ``...+02:00``) as aware UTC; naive is UTC.

    Raises ``ValueError`` for anything else: OpenStack's services write both spaced and ``T`` forms,
    with and without an offset, and a naive one means UTC there.
    """
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        parsed = datetime.fromisoformat(value.strip())
    else:
        raise ValueError(f"not an ISO-8601 datetime: {value!r}")
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def trait_text(value: TraitValue) -> str:
    """A trait value as a label or a key: ISO-8601 for a datetime, ``repr`` for a float (round-trips), else ``str``.

    One function, so that the scope the stream keys an event by is the scope its usage rows carry.
    """
    if isinstance(value, datetime):
        return value.isoformat()
    return repr(value) if isinstance(value, float) else str(value)

"""One trigger instance (seed 002, *Trigger instance*): its events and the one-way life it leads.

``ACTIVE`` → fired (the fire criteria met and ``fire_delay`` passed since the latest event) or
expired (the expiration passed while the fire criteria were not met): never both, never twice —
``fire``/``expire`` hand the events out once and every later call returns ``None``.  Time is the
caller's ``now`` (event time in the streaming job: its timers), so the same events give the same
outcome on every run.  Picklable and small: the streaming job keeps it in Beam state.

Why the fire time is ``latest event + fire_delay`` (not the wall clock at which the criteria were
met, as in seed 002): in event time a straggler arriving within the delay, out of order, is still
collected, and a replay fires at the same instant.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from ratebeam.transforms.events.model import Event, TraitValue
from ratebeam.transforms.events.triggers import TriggerDefinition


class Added(StrEnum):
    """What ``TriggerInstance.add`` did with an event."""

    ADDED = "added"
    #: the same message_id is already held: a redelivery, nothing changes
    DUPLICATE = "duplicate"
    #: the instance already fired or expired: the event is late (the caller routes it to its late output)
    LATE = "late"
    #: not collected by this instance (its time criteria, relative to the instance, are not met)
    NOT_MATCHED = "not_matched"


def _order(event: Event) -> tuple[datetime, str]:
    return event.generated, event.message_id


@dataclass
class TriggerInstance:
    """The events of one (trigger, distinguishing key), sorted by time, and whether it fired or expired."""

    trigger: str
    key: tuple[TraitValue, ...]
    events: list[Event] = field(default_factory=list)
    fired: bool = False
    expired: bool = False
    #: (trigger, events held, whether its fire criteria are met then): events are only ever added, so the
    #: count says whether it still holds.  Why: the streaming job asks for the instance's next timer at
    #: every change (fire time, then expiry: both check the criteria over every event).
    _criteria: tuple[str, int, bool] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def closed(self) -> bool:
        """Fired or expired: it takes no more events and does nothing more."""
        return self.fired or self.expired

    @property
    def first(self) -> datetime | None:
        """The earliest event's time."""
        return self.events[0].generated if self.events else None

    @property
    def last(self) -> datetime | None:
        """The latest event's time."""
        return self.events[-1].generated if self.events else None

    def add(self, event: Event, definition: TriggerDefinition) -> Added:
        """Collect ``event`` (kept in time order); see ``Added`` for what else can happen."""
        added = self.check(event, definition)
        if added is Added.ADDED:
            self.insert(event)
        return added

    def check(self, event: Event, definition: TriggerDefinition) -> Added:
        """What :meth:`add` would do with ``event``, changing nothing.

        The match criteria are checked against the instance as it was before the event (an empty
        instance: the event's own time), so ``last+2h`` means "within two hours of the latest event".
        """
        if any(e.message_id == event.message_id for e in self.events):
            return Added.DUPLICATE
        if self.closed:
            return Added.LATE
        first = self.first or event.generated
        last = self.last or event.generated
        if definition.key(event) != self.key or not definition.collects(event, first, last):
            return Added.NOT_MATCHED
        return Added.ADDED

    def insert(self, event: Event) -> None:
        """Keep ``event``, in time order (one :meth:`check` said ``ADDED``: the streaming job replays its log with it)."""
        bisect.insort(self.events, event, key=_order)

    def criteria_met(self, definition: TriggerDefinition) -> bool:
        """Whether its events meet ``definition``'s fire criteria (remembered until an event is added)."""
        cached = self._criteria
        if cached is not None and cached[0] == definition.name and cached[1] == len(self.events):
            return cached[2]
        met = definition.fire_criteria_met(self.events)
        self._criteria = (definition.name, len(self.events), met)
        return met

    def fire_at(self, definition: TriggerDefinition) -> datetime | None:
        """When it fires: its latest event + ``fire_delay`` once the fire criteria are met (else ``None``)."""
        if self.closed or not self.criteria_met(definition):
            return None
        assert self.last is not None
        return self.last + definition.fire_delay

    def expire_at(self, definition: TriggerDefinition) -> datetime | None:
        """When it expires: the expiration's instant, unless it has none or will fire."""
        if self.closed or definition.expiration is None or not self.events:
            return None
        if self.criteria_met(definition):
            return None
        assert self.first is not None and self.last is not None
        return definition.expiration.at(self.first, self.last)

    def fire_due(self, definition: TriggerDefinition, now: datetime) -> bool:
        """The fire criteria are met and ``now`` is at or past the latest event + ``fire_delay``."""
        when = self.fire_at(definition)
        return when is not None and now >= when

    def expire_due(self, definition: TriggerDefinition, now: datetime) -> bool:
        """The expiration passed (``now`` at or after it) and the fire criteria are not met."""
        when = self.expire_at(definition)
        return when is not None and now >= when

    def next_timer(self, definition: TriggerDefinition) -> datetime | None:
        """When the caller must look again (fire or expiry), ``None`` when nothing is pending."""
        return self.fire_at(definition) or self.expire_at(definition)

    def fire(self, definition: TriggerDefinition, now: datetime) -> list[Event] | None:
        """The events to send to the fire pipeline if it is due now — once: it is fired afterwards."""
        if not self.fire_due(definition, now):
            return None
        self.fired = True
        return list(self.events)

    def expire(self, definition: TriggerDefinition, now: datetime) -> list[Event] | None:
        """The events for the expire pipeline if expiry is due now — once: it is expired afterwards."""
        if not self.expire_due(definition, now):
            return None
        self.expired = True
        return list(self.events)

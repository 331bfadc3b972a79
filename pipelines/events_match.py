"""Notification → event (the definitions) → the trigger instances it joins, keyed by their scope.

Keyed by scope, not by instance: the stateful step after this one holds every instance of a scope
*and* the frames their rows go into, so a frame is complete when it is sent (``events_scope``).
The scope is the event's own value of its trigger's ``scope_trait`` (``tenant_id`` by default,
which falls back on the request context's project): an event a pipeline would bill that has none
cannot be put in any scope's frame, so it is a dead letter naming the trait — never billed to a
guessed scope, never dropped unseen.  What no trigger wants is finished in the inbox at once; what
the definitions cannot convert is a dead letter with the reason (and finished): the stream goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from apache_beam.metrics import Metrics

from ratebeam.pipelines.events_job import NAMESPACE, InboxStep
from ratebeam.transforms.events.definitions import EventConversionError
from ratebeam.transforms.events.model import Event, Notification, TraitValue, trait_text

LOG = logging.getLogger(__name__)

#: What the step emits: scope → (trigger name, instance key text, event, stream time in µs or None).
Matched = tuple[str, tuple[str, str, Event, int | None]]


class MatchFn(InboxStep):
    """The matches of each notification (module docstring)."""

    def setup(self) -> None:
        """Open the inbox; the counters."""
        super().setup()
        self._unmatched = Metrics.counter(NAMESPACE, "events_unmatched")
        self._failed = Metrics.counter(NAMESPACE, "events_conversion_failed")

    def start_bundle(self) -> None:
        """The notifications no trigger wants are finished in one transaction per bundle."""
        self._finished: list[str] = []

    def process(self, element: tuple[Notification, int | None]) -> Iterator[Matched]:
        """The (scope, instance) pairs of one notification."""
        notification, stream_time = element
        try:
            event = self._job.definitions.convert(notification)
        except EventConversionError as exc:
            self._reject(notification, f"event conversion: {exc}")
            return
        matches = [] if event is None else self._job.triggers.matches(event)
        if not matches:
            self._unmatched.inc()
            self._finished.append(notification.message_id)
            return
        assert event is not None
        keyed = []
        for trigger, key in matches:
            trait = self._job.scope_trait(trigger)
            scope = None if trait is None else event.trait(trait)
            if trait is not None and scope is None:
                self._reject(notification, f"trigger {trigger.name}: no {trait} trait (the scope its usage is "
                                           "billed to): check the event definitions' fields for it")
                return
            keyed.append(("" if scope is None else trait_text(scope), (trigger.name, key_text(key), event, stream_time)))
        yield from keyed

    def _reject(self, notification: Notification, reason: str) -> None:
        self._failed.inc()
        LOG.warning("notification %s (%s): %s", notification.message_id, notification.event_type, reason)
        self._inbox.reject(notification.message_id, reason)

    def finish_bundle(self) -> None:
        """Finish what no trigger wanted."""
        self._inbox.finish(self._finished)


def key_text(key: tuple[TraitValue, ...]) -> str:
    """A distinguishing key as a deterministic string (it names the instance in state, logs and the store)."""
    return "\x1f".join(trait_text(v) for v in key)  # a key has no None (``TriggerDefinition.key``)

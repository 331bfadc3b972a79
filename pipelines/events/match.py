"""Notification → event (the definitions) → the trigger instances it joins, keyed by their scope.

Keyed by scope, not by instance: the stateful step after this one holds every instance of a scope
*and* the frames their rows go into, so a frame is complete when it is sent (``events.scope``).
The scope is the event's own value of its trigger's ``scope_trait`` (``tenant_id`` by default,
which falls back on the request context's project): an event a pipeline would bill that has none
cannot be put in any scope's frame, so it is a dead letter naming the trait — never billed to a
guessed scope, never dropped unseen.  What no trigger wants is finished in the inbox at once; what
the definitions cannot convert is a dead letter with the reason (and finished): the stream goes on.

Batches in, batches out: a batch of notifications (one poll of the source) makes one element per
scope of that batch, holding the scope's matches in the batch's order — on a portable runner every
element crossing a step and every state access is a round trip, so the stateful step gets one
element, one state read and one write per scope and poll.  The stream's source matches each poll
itself (:class:`BatchMatcher`): a batch of notifications handed to a step of their own was pickled
and unpickled on the way, about a tenth of the source's worker.  The reprocessing job runs
:class:`MatchFn` after its own reader.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

from apache_beam.metrics import Metrics

from ratebeam.connectors.notifications.inbox import Inbox
from ratebeam.pipelines.events.job import NAMESPACE, EventJob, InboxStep
from ratebeam.transforms.events.definitions import EventConversionError
from ratebeam.transforms.events.model import Event, Notification, TraitValue, trait_text

LOG = logging.getLogger(__name__)

#: One match: (trigger name, instance key text, event).
Match = tuple[str, str, Event]
#: What the step emits for each scope of a batch: (stream time in µs when read or None, the scope's matches in order).
ScopeBatch = tuple[int | None, list[Match]]


class BatchMatcher:
    """The matches of a batch of notifications, one ``(scope, ScopeBatch)`` per scope (module docstring).

    Unmatched notifications are finished and unconvertible ones made dead letters in ``inbox``.
    """

    def __init__(self, job: EventJob, inbox: Inbox) -> None:
        self._job, self._inbox = job, inbox
        self._unmatched = Metrics.counter(NAMESPACE, "events_unmatched")
        self._failed = Metrics.counter(NAMESPACE, "events_conversion_failed")

    def __call__(self, notifications: Sequence[Notification], stream_time: int | None) -> Iterator[tuple[str, ScopeBatch]]:
        """The matches of one batch, grouped by scope (each scope's in the batch's order).

        One element per scope and batch, not per notification: the stateful step then reads and
        writes its scope's state once per batch.  What no trigger wants is finished in one transaction.
        """
        scopes: dict[str, list[Match]] = {}
        unmatched: list[str] = []
        for notification in notifications:
            self._match(notification, scopes, unmatched)
        self._unmatched.inc(len(unmatched))
        self._inbox.finish(unmatched)
        for scope, matches in scopes.items():
            yield scope, (stream_time, matches)

    def _match(self, notification: Notification, scopes: dict[str, list[Match]], unmatched: list[str]) -> None:
        """The (scope, instance) pairs of one notification, added to ``scopes``."""
        try:
            event = self._job.definitions.convert(notification)
        except EventConversionError as exc:
            self._reject(notification, f"event conversion: {exc}")
            return
        matches = [] if event is None else self._job.triggers.matches(event)
        if not matches:
            unmatched.append(notification.message_id)
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
            keyed.append(("" if scope is None else trait_text(scope), (trigger.name, key_text(key), event)))
        for scope, match in keyed:
            scopes.setdefault(scope, []).append(match)

    def _reject(self, notification: Notification, reason: str) -> None:
        self._failed.inc()
        LOG.warning("notification %s (%s): %s", notification.message_id, notification.event_type, reason)
        self._inbox.reject(notification.message_id, reason)


class MatchFn(InboxStep):
    """:class:`BatchMatcher` as a step: ``(notifications, stream time)`` in, one element per scope out."""

    def setup(self) -> None:
        """Open the inbox; the matcher."""
        super().setup()
        self._matcher = BatchMatcher(self._job, self._inbox)

    def process(self, element: tuple[Sequence[Notification], int | None]) -> Iterator[tuple[str, ScopeBatch]]:
        """The matches of one batch, one element per scope."""
        return self._matcher(*element)


def key_text(key: tuple[TraitValue, ...]) -> str:
    """A distinguishing key as a deterministic string (it names the instance in state, logs and the store)."""
    return "\x1f".join(trait_text(v) for v in key)  # a key has no None (``TriggerDefinition.key``)

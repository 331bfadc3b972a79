"""What every step of the event stream shares: the job's settings and the inbox each worker opens.

One module so that the steps (``events.source``, ``events.match``, ``events.scope``) and the graph
(``events``) import their settings from one place and none of them from another step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import apache_beam as beam

from ratebeam.connectors.notifications.config import NotificationSourceConfig
from ratebeam.connectors.notifications.inbox import Inbox
from ratebeam.transforms.events.definitions import EventConversionError, EventDefinitions
from ratebeam.transforms.events.lifecycle import LifecycleSettings
from ratebeam.transforms.events.model import Notification, trait_text
from ratebeam.transforms.events.triggers import TriggerDefinition, TriggerSet

#: The Beam counters' namespace (serve's ``/metrics`` and the launcher's log read it).
NAMESPACE = "ratebeam"
#: The tag of the late events' output.
LATE = "late"


@dataclass(frozen=True)
class EventJob:
    """Everything the workers need, loaded and validated at the edge (picklable)."""

    database_url: str
    source: NotificationSourceConfig
    definitions: EventDefinitions
    triggers: TriggerSet
    pipelines: Mapping[str, LifecycleSettings]
    period: int
    run_id: str = ""
    rebatch_rows: int = 250_000
    storage: tuple[Any, ...] = field(default=())
    scope_key: str = "project_id"
    #: (K, N): this job rates the scopes whose hash is K modulo N (``events serve --shard``); (0, 1): all.
    shard: tuple[int, int] = (0, 1)
    #: Seconds: an instance's timer is set at its due time rounded up to a multiple of this (0: at its due
    #: time).  ``events.scope`` says why the stream rounds and why that changes no result.
    timer_step: int = 0

    def lifecycle(self, pipeline: str | None) -> LifecycleSettings | None:
        """The lifecycle settings a trigger's fire or expire ``pipeline`` runs (None: no pipeline, no usage)."""
        if pipeline is None:
            return None
        return self.pipelines[pipeline]

    def scope_trait(self, trigger: TriggerDefinition) -> str | None:
        """The trait naming the scope of ``trigger``'s usage (``None``: its pipelines bill nothing)."""
        settings = self.lifecycle(trigger.fire_pipeline) or self.lifecycle(trigger.expire_pipeline)
        return None if settings is None else settings.scope_trait

    def scope_of(self, notification: Notification) -> str:
        """The scope ``notification`` is billed to: its first trigger's ``scope_trait`` it has (``''``: none).

        What the matching keys it by (``events.match``), known when it is recorded so that the
        inbox gives it to its scope's shard; one that does not convert, or that no trigger bills,
        has none (the shard of hash 0 finishes it or makes it a dead letter).
        """
        try:
            event = self.definitions.convert(notification)
        except EventConversionError:
            return ""
        for trigger, _ in [] if event is None else self.triggers.matches(event):
            trait = self.scope_trait(trigger)
            value = None if trait is None else event.trait(trait)
            if value is not None:
                return trait_text(value)
        return ""

    @property
    def frame_delay(self) -> timedelta:
        """How long after its period a frame waits for the instances' rows: the largest ``fire_delay``."""
        return max((t.fire_delay for t in self.triggers.triggers), default=timedelta(0))


class InboxStep(beam.DoFn):
    """A step of the job that reads or writes the inbox: it opens it in ``setup`` and closes it in ``teardown``."""

    def __init__(self, job: EventJob) -> None:
        self._job = job

    def setup(self) -> None:
        """Open the inbox (one engine per worker)."""
        self._inbox = self.open_inbox()

    def open_inbox(self) -> Inbox:
        """The inbox this step reads and writes (the reprocessing's steps only read theirs).

        A sharded job stores each notification's scope as it records it (its shard's job must find
        it); an unsharded one does not convert each notification a second time for that: a sharded
        job that reads such a row later gives it its scope first (``Inbox.take``).
        """
        sharded = self._job.shard[1] > 1
        return Inbox(self._job.database_url, self._job.scope_of if sharded else None, self._job.shard)

    def teardown(self) -> None:
        """Close the inbox's connections."""
        inbox = getattr(self, "_inbox", None)
        if inbox is not None:
            inbox.engine.dispose()

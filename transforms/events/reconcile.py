"""Nova's audit against the stream: what a lifecycle's events and ``compute.instance.exists`` disagree on.

``transforms.events.lifecycle`` bills a resource from its events; this module is the part that
compares them with the audit (``exists_events``: ``audit_period_beginning``/``_ending``) — where a
resource whose start the stream never saw is billed from, and each :class:`Discrepancy` between the
audit and the stream's segments (docs/events.md, *Reconciliation*).  Reported, never silently fixed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from ratebeam.transforms.events.model import Event

if TYPE_CHECKING:
    from ratebeam.transforms.events.lifecycle import LifecycleSettings, Segment

#: Every ``Discrepancy.kind`` (``ratebeam events discrepancies --kind`` accepts these).
DISCREPANCY_KINDS = ("start_not_seen", "end_without_start", "exists_outside_activity", "price_traits_differ",
                     "bad_audit_period", "no_scope", "no_quantity")


@dataclass(frozen=True)
class Discrepancy:
    """A disagreement between the stream and the audit (or a gap in the stream), reported, not hidden.

    ``kind``: one of ``DISCREPANCY_KINDS`` — ``no_quantity`` is a segment without a numeric
    ``qty_trait``; the others are described in docs/events.md (*Reconciliation*).
    """

    resource_id: str
    scope_id: str | None
    kind: str
    message_id: str
    detail: str

    def __post_init__(self) -> None:
        if self.kind not in DISCREPANCY_KINDS:  # a new kind must be listed, or it cannot be selected
            raise ValueError(f"unknown discrepancy kind {self.kind!r}")


def audit_start(events: list[Event], settings: LifecycleSettings, first: Event) -> tuple[datetime, Event] | None:
    """Where a resource whose start was not seen is billed from, and the audit saying it.

    The earliest beginning of the audit periods that begin before ``first`` (whenever their exists
    event arrived); its ``launched_at``, when that falls inside the audit period, is the better start.
    """
    audits = [e for e in events if settings.kind(e) == "exists"]
    begins = [(b, e) for e in audits
              if isinstance(b := e.trait(settings.audit_begin_trait), datetime) and b <= first.generated]
    if not begins:
        return None
    begin, event = min(begins, key=lambda item: item[0])
    launched = None if settings.launched_trait is None else event.trait(settings.launched_trait)
    end = event.trait(settings.audit_end_trait)
    if isinstance(launched, datetime) and isinstance(end, datetime) and begin <= launched < end:
        return launched, event
    return begin, event


def reconcile(events: list[Event], segments: list[Segment], settings: LifecycleSettings, resource_id: str,
               scope_id: str | None) -> list[Discrepancy]:
    """Each audit (exists event) compared with the stream's segments."""
    audits = [e for e in events if settings.kind(e) == "exists"]
    if not audits:
        return []
    found = []
    saw_start = any(settings.kind(e) == "start" for e in events)
    for event in audits:
        begin, end = event.trait(settings.audit_begin_trait), event.trait(settings.audit_end_trait)
        if not isinstance(begin, datetime) or not isinstance(end, datetime) or end <= begin:
            found.append(Discrepancy(resource_id, scope_id, "bad_audit_period", event.message_id,
                                     f"audit period {begin!r} .. {end!r} is not a period"))
            continue
        overlapping = [s for s in segments if s.begin < end and (s.end is None or s.end > begin)]
        if not overlapping:
            found.append(Discrepancy(resource_id, scope_id, "exists_outside_activity", event.message_id,
                                     f"audited active in {begin.isoformat()} .. {end.isoformat()}, "
                                     f"inactive there in the stream"))
            continue
        if not saw_start and segments and segments[0].begin >= begin and segments[0] in overlapping:
            found.append(Discrepancy(resource_id, scope_id, "start_not_seen", event.message_id,
                                     f"billed from {segments[0].begin.isoformat()} (audit period "
                                     f"{begin.isoformat()} .. {end.isoformat()})"))
            saw_start = True  # reported once
        audited = tuple(event.trait(k) for k in settings.price_traits)
        latest = overlapping[-1].traits
        streamed = tuple(latest.get(k) for k in settings.price_traits)
        if any(a is not None for a in audited) and audited != streamed:
            found.append(Discrepancy(resource_id, scope_id, "price_traits_differ", event.message_id,
                                     f"audit {dict(zip(settings.price_traits, audited, strict=True))} vs stream "
                                     f"{dict(zip(settings.price_traits, streamed, strict=True))}"))
    return found

"""The lifecycle pipeline: a resource's active time between its start and end events, as usage rows.

From one resource's events (a fired or still open trigger instance), in time order:

* a **start** event opens a segment with the traits it carries; a **resize** event whose price
  traits (``price_traits``: the flavor, a volume's size) or ``qty_trait`` differ cuts the segment
  there and opens the next with the new values (a resize that changes nothing cuts nothing, and
  only adds the labels the segment lacked); an **end** event closes it.  A start after an end
  (unshelve after shelve, if so configured) opens a new segment;
* so a change announced twice (Nova's ``notification_format = both``: a legacy and a versioned
  notification, two message ids) counts once, at its earlier copy: the second start or resize
  changes no price, the second end finds the segment closed.  The copies may carry different labels
  (only the legacy one has ``os_distro``): the segment keeps what either has;
* segments are cut at the rating periods — ``[k·period, (k+1)·period)`` since the epoch, which is
  CloudKitty's alignment (the month start) for every period that divides a day — and one usage row
  is made per period and distinct labels, its ``qty`` the active **seconds** there (times the
  ``qty_trait`` value, e.g. GB for GB-seconds), divided by ``seconds_per_unit`` (1: exact);
* only periods that end at or before ``closed_until`` are emitted, and the same events give the
  same rows (same point ids): an instance still running is billed up to ``closed_until`` (an event
  heard later that changes a billed period changes its rows); for an ended one pass the end
  of its end event's period (``period_end``).

Why seconds by default: a quantity in seconds is an exact integer (no rounding, and per-period
rows add up exactly to the lifetime), and hashmap prices ``flat × qty``, so a flat mapping of
``hourly price / 3600`` per flavor prices it — the cost is where the one rounding happens (costs
carry 28 decimals: 0.10/3600 is off by 2e-29 per second), not the quantity.  Hours
(``seconds_per_unit: 3600``) make 40 minutes 0.666666666666666667 (rounded at qty's 18 decimals),
and per-period rows then no longer add up exactly.

``compute.instance.exists`` (``exists_events``, with ``audit_period_beginning``/``_ending``)
reconciles: a resource whose start the stream never saw is billed from the earliest audit period
beginning (or its ``launched_at``, when that is inside the period), and every disagreement between
the audit and the stream — no start seen, an audit period in which the stream has the resource
inactive, other price traits — is returned as a ``Discrepancy``, never silently fixed
(``transforms.events.reconcile``).

Rows are what ``ConvertUsage`` makes of a collector's samples (the usage schema with price 0, the
scope key and ``groupby`` labels, ``metadata`` labels, the time keys, a manifest of the frames), so
the rating chain and the writers take them as they are; a label the events lack is ``''``, as the
collectors give it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import polars as pl
import pyarrow as pa

from ratebeam.transforms import schema
from ratebeam.transforms.events.event_types import EventTypes, remembered
from ratebeam.transforms.events.model import Event, TraitValue, trait_text
from ratebeam.transforms.events.reconcile import Discrepancy, audit_start, reconcile
from ratebeam.transforms.frames import Frame, to_batch
from ratebeam.transforms.periods import require_aware
from ratebeam.transforms.time_keys import add_time_keys

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: A usage row's key: (period begin, groupby labels, metadata labels).
_Key = tuple[datetime, tuple[str, ...], tuple[str, ...]]


@dataclass(frozen=True)
class LifecycleSettings:
    """What a lifecycle bills and which events say so (globs); see the module docstring."""

    type: str
    start_events: tuple[str, ...]
    end_events: tuple[str, ...]
    resize_events: tuple[str, ...] = ()
    exists_events: tuple[str, ...] = ()
    price_traits: tuple[str, ...] = ()
    groupby: tuple[str, ...] = ()
    metadata: tuple[str, ...] = ()
    scope_trait: str = "tenant_id"
    #: the groupby key holding the scope (CloudKitty's ``scope_key``, appended to every groupby)
    scope_key: str = "project_id"
    resource_trait: str = "instance_id"
    unit: str = "second"
    seconds_per_unit: int = 1
    #: a numeric trait multiplying the seconds (a volume's ``size``: GB-seconds); ``None``: 1
    qty_trait: str | None = None
    audit_begin_trait: str = "audit_period_beginning"
    audit_end_trait: str = "audit_period_ending"
    launched_trait: str | None = "launched_at"
    _types: dict[str, EventTypes] = field(default_factory=dict, init=False, repr=False, compare=False)
    #: event type → its kind, found once per type
    _kinds: dict[str, str | None] = field(default_factory=dict, init=False, repr=False, compare=False)
    #: the price traits and the qty trait; the labels (both are read for every event of every bill)
    _price_keys: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)
    _label_keys: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.type or not self.start_events or not self.end_events:
            raise ValueError("a lifecycle needs a type, start_events and end_events")
        if self.seconds_per_unit < 1:
            raise ValueError(f"seconds_per_unit must be >= 1, got {self.seconds_per_unit}")
        for kind in ("start", "resize", "end", "exists"):
            self._types[kind] = EventTypes.parse(getattr(self, f"{kind}_events"))
        extra = () if self.qty_trait is None else (self.qty_trait,)
        object.__setattr__(self, "_price_keys", (*self.price_traits, *extra))
        object.__setattr__(self, "_label_keys", tuple(dict.fromkeys((*self._price_keys, *self.groupby, *self.metadata))))

    def kind(self, event: Event) -> str | None:
        """``start``, ``resize``, ``end`` or ``exists`` (the first whose globs take it), else ``None``."""
        if event.event_type in self._kinds:
            return self._kinds[event.event_type]
        found = next((kind for kind in ("start", "resize", "end", "exists")
                      if getattr(self, f"{kind}_events") and self._types[kind](event.event_type)), None)
        if len(self._kinds) < remembered:
            self._kinds[event.event_type] = found
        return found

    @property
    def labels(self) -> tuple[str, ...]:
        """The traits a segment keeps: price traits, qty trait, groupby and metadata."""
        return self._label_keys

    @property
    def trait_names(self) -> frozenset[str]:
        """Every trait a lifecycle reads from its events."""
        names = {*self.labels, self.scope_trait, self.resource_trait, self.audit_begin_trait, self.audit_end_trait}
        return frozenset(names if self.launched_trait is None else names | {self.launched_trait})

    def prices(self, traits: dict[str, TraitValue]) -> tuple[TraitValue, ...]:
        """The values whose change cuts a segment: the price traits and the qty trait."""
        return tuple(map(traits.get, self._price_keys))


@dataclass
class Segment:
    """A span in which the resource was active (``end`` None: still is), with the labels it had then."""

    begin: datetime
    end: datetime | None
    traits: dict[str, TraitValue]


def period_begin(when: datetime, period: int) -> datetime:
    """The begin of the rating period holding ``when`` (periods aligned on the epoch)."""
    since = when - _EPOCH  # normalized: seconds and microseconds >= 0, so this is the floor
    seconds = since.days * 86400 + since.seconds
    return _EPOCH + timedelta(seconds=seconds - seconds % period)


def period_end(when: datetime, period: int) -> datetime:
    """The end of the rating period holding ``when``: the timer at which that period closes."""
    return period_begin(when, period) + timedelta(seconds=period)


def lifecycle_usage(events: Sequence[Event], settings: LifecycleSettings, period: int,
                    closed_until: datetime) -> tuple[pa.RecordBatch | None, list[Discrepancy]]:
    """The usage rows of one resource's ``events`` for the periods ending at or before ``closed_until``.

    Returns the usage batch (``None`` when there is no row) and every discrepancy found.
    """
    batch, [usage] = lifecycle_usages([UsageRequest(events, closed_until)], settings, period)
    return batch, usage.found


@dataclass(frozen=True)
class UsageRequest:
    """One resource's events, billed for the periods ending at or before ``closed_until``.

    ``billed_from``: the periods that begin before it were billed already (their rows are left out).
    """

    events: Sequence[Event]
    closed_until: datetime
    billed_from: datetime | None = None


@dataclass(frozen=True)
class Usage:
    """What one request gave: its discrepancies and the period begins it has rows in (sorted)."""

    found: list[Discrepancy]
    begins: tuple[datetime, ...]


def lifecycle_usages(requests: Sequence[UsageRequest], settings: LifecycleSettings,
                     period: int) -> tuple[pa.RecordBatch | None, list[Usage]]:
    """The usage rows of many resources in one batch (``None``: no row), and each request's :class:`Usage`.

    Each request's rows are :func:`lifecycle_usage`'s, in request order.  Why one call: building the
    usage frame (Polars, the time keys, Arrow) has a fixed cost of about a millisecond, paid once
    here for every resource of a scope that is due at one firing instead of once per resource.
    """
    if period < 1:
        raise ValueError(f"period must be >= 1 second, got {period}")
    rows: list[tuple[str, _Key, int | Decimal]] = []
    usages = []
    for request in requests:
        closed_until = require_aware(request.closed_until, "closed_until")
        scope_id, totals, found = _usage(request.events, settings, period, closed_until, request.billed_from)
        keys = sorted(totals)
        rows += [(scope_id, k, totals[k]) for k in keys]  # scope_id is set wherever totals are
        usages.append(Usage(found, tuple(sorted({k[0] for k in keys}))))
    return _batch(rows, settings, period), usages


def _usage(events: Sequence[Event], settings: LifecycleSettings, period: int, closed_until: datetime,
           billed_from: datetime | None,
           ) -> tuple[str, dict[_Key, int | Decimal], list[Discrepancy]]:
    """One resource's scope, its quantity per (period begin, groupby labels, metadata labels), its discrepancies.

    Only the periods from ``billed_from`` on (None: all) are walked and kept (``_totals``).
    """
    ordered = sorted({e.message_id: e for e in events}.values(), key=lambda e: (e.generated, e.message_id))
    resource = _first_trait(ordered, settings.resource_trait)
    scope = _first_trait(ordered, settings.scope_trait)
    resource_id = "" if resource is None else trait_text(resource)
    scope_id = None if scope is None else trait_text(scope)
    segments, found = _segments(ordered, settings, resource_id, scope_id)
    found += reconcile(ordered, segments, settings, resource_id, scope_id)
    if scope_id is None:
        if segments:
            found.append(Discrepancy(resource_id, None, "no_scope", ordered[0].message_id,
                                     f"no {settings.scope_trait} trait in any event: nothing billed"))
        return "", {}, found
    if settings.qty_trait is not None:
        found += [Discrepancy(resource_id, scope_id, "no_quantity", ordered[0].message_id,
                              f"no numeric {settings.qty_trait} from {s.begin.isoformat()}: that segment is not billed")
                  for s in segments if _factor(s.traits.get(settings.qty_trait)) is None]
    return scope_id, _totals(segments, settings, period, closed_until, billed_from, scope_id), found


def _first_trait(events: Sequence[Event], name: str) -> TraitValue:
    return next((v for e in events if (v := e.traits.get(name)) is not None), None)


def _segments(events: list[Event], settings: LifecycleSettings, resource_id: str, scope_id: str | None
              ) -> tuple[list[Segment], list[Discrepancy]]:
    """The active segments of the resource, and the gaps of the stream (an end without any start)."""
    segments: list[Segment] = []
    found: list[Discrepancy] = []
    known: dict[str, TraitValue] = {}
    running = False
    for event in events:
        kind = settings.kind(event)
        if kind in (None, "exists"):
            continue
        before = settings.prices(known)
        known.update(_labels(event, settings))
        if not segments and kind != "start":  # the stream missed the start: the audit says since when
            audit = audit_start(events, settings, event)
            if audit is None and kind == "end":
                found.append(Discrepancy(resource_id, scope_id, "end_without_start", event.message_id,
                                         f"{event.event_type} at {event.generated.isoformat()} without a start "
                                         "event or an audit period before it: nothing billed"))
                continue
            if audit is None:
                found.append(Discrepancy(resource_id, scope_id, "start_not_seen", event.message_id,
                                         f"first event {event.event_type} at {event.generated.isoformat()}: "
                                         "billed from it"))
                segments.append(Segment(event.generated, None, dict(known)))
            else:
                start, audited = audit
                segments.append(Segment(start, None, _labels(audited, settings) | {
                    k: v for k, v in known.items() if k not in settings.price_traits}))
                before = settings.prices(segments[-1].traits)
            running = True
        if kind == "end":
            if running:
                segments[-1].end = event.generated
            running = False
        elif not running:
            if kind == "start":
                segments.append(Segment(event.generated, None, dict(known)))
                running = True
        elif settings.prices(known) != before and segments[-1].begin < event.generated:
            segments[-1].end = event.generated
            segments.append(Segment(event.generated, None, dict(known)))
        elif settings.prices(known) != before:  # a change at the segment's very begin: it has the new values
            segments[-1].traits = dict(known)
        else:  # no price change (a confirm, a twin): it only adds the labels the segment lacked
            segments[-1].traits = known | segments[-1].traits
    if not segments:
        first_exists = next((e for e in events if settings.kind(e) == "exists"), None)
        audit = None if first_exists is None else audit_start(events, settings, first_exists)
        if audit is not None:
            segments.append(Segment(audit[0], None, _labels(audit[1], settings)))
    return segments, found


def _labels(event: Event, settings: LifecycleSettings) -> dict[str, TraitValue]:
    traits = event.traits
    return {k: v for k in settings.labels if (v := traits.get(k)) is not None}


def _micros(span: timedelta) -> int:
    """A span's microseconds (its seconds, exactly, are this scaled by 1e-6)."""
    return (span.days * 86400 + span.seconds) * 1_000_000 + span.microseconds


def _factor(value: TraitValue) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)


def _totals(segments: list[Segment], settings: LifecycleSettings, period: int, closed_until: datetime,
            billed_from: datetime | None, scope_id: str) -> dict[_Key, int | Decimal]:
    """The active microseconds (× the qty trait) of ``segments`` per row key (``_Key``), closed periods only.

    Only the periods that begin at or after ``billed_from`` (None: all): a resource billed at every
    period end costs its new periods, not every period since its start (a year-old instance billed
    hourly walked 8,760 periods per bill).
    """
    step = period * 1_000_000  # in microseconds since the epoch, exact integers
    limit = _since_epoch(closed_until)
    limit -= limit % step  # the end of the last closed period
    first = None if billed_from is None else -(-_since_epoch(billed_from) // step) * step  # its first period ≥ it
    groupby = _groupby(settings)
    #: exact integers without a qty trait (the usual case), made a quantity once per row (``schema.qty_from_micros``)
    totals: dict[_Key, int | Decimal] = {}
    for segment in segments:
        start = _since_epoch(segment.begin)
        end = limit if segment.end is None else min(_since_epoch(segment.end), limit)
        factor = 1 if settings.qty_trait is None else _factor(segment.traits.get(settings.qty_trait))
        if factor is None or start >= end:
            continue
        begin = start - start % step
        if first is not None and begin < first:  # the periods before were billed already
            begin = first
        traits = segment.traits
        labels = tuple([scope_id if k == settings.scope_key else _label(traits.get(k)) for k in groupby])
        meta = tuple([_label(traits.get(k)) for k in settings.metadata])
        while begin < end:
            overlap = min(end, begin + step) - max(start, begin)
            if overlap > 0:
                key = (_instant(begin), labels, meta)
                totals[key] = totals.get(key, 0) + overlap * factor
            begin += step
    return totals


def _since_epoch(when: datetime) -> int:
    """Microseconds since the epoch (exact: ``_micros`` of an aware datetime's distance to it)."""
    return _micros(when - _EPOCH)


@functools.lru_cache(maxsize=4096)
def _instant(micros: int) -> datetime:
    """The aware datetime ``micros`` after the epoch (a period begin: a handful per firing, made once)."""
    return _EPOCH + timedelta(microseconds=micros)


def _groupby(settings: LifecycleSettings) -> tuple[str, ...]:
    return tuple(dict.fromkeys((settings.scope_key, *settings.groupby)))


def _batch(rows: list[tuple[str, _Key, int | Decimal]], settings: LifecycleSettings, period: int) -> pa.RecordBatch | None:
    """One usage batch of ``rows`` (scope, (begin, labels, metadata), active microseconds), in their order."""
    if not rows:
        return None
    step = timedelta(seconds=period)
    groupby = _groupby(settings)
    columns: dict[str, list[object]] = {
        schema.SCOPE: [r[0] for r in rows],
        schema.TYPE: [settings.type] * len(rows),
        schema.BEGIN: [r[1][0] for r in rows],
        schema.END: [r[1][0] + step for r in rows],
        schema.UNIT: [settings.unit] * len(rows),
    }
    for n, label in enumerate(groupby):
        columns[schema.groupby_column(label)] = [r[1][1][n] for r in rows]
    for n, label in enumerate(settings.metadata):
        columns[schema.metadata_column(label)] = [r[1][2][n] for r in rows]
    core = schema.polars_core_schema()
    types = core | {c: pl.String() for c in columns if c.startswith(("groupby.", "metadata."))}
    frame = pl.DataFrame(columns, schema={c: types[c] for c in columns}).with_columns(
        pl.Series(schema.QTY, schema.qty_from_micros([r[2] for r in rows], settings.seconds_per_unit)),
        pl.lit(0).cast(core[schema.PRICE]).alias(schema.PRICE))
    frame = add_time_keys(frame.select(*core, *(c for c in columns if c not in core)))
    return to_batch(frame, [Frame(scope, begin) for scope, begin in {(r[0], r[1][0]) for r in rows}])


def _label(value: TraitValue) -> str:
    return value if type(value) is str else "" if value is None else trait_text(value)

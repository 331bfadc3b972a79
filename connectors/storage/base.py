"""The storage contract every backend implements (CloudKitty storage v2, `cloudkitty/storage/v2/__init__.py:43-199`).

A backend receives *rated* Arrow tables (columns of ``transforms.schema``) and must make writes
idempotent per (scope, period begin, type): writing the points of such a slice again replaces the
slice, so a crashed run followed by a rerun stores exactly what a clean run stores.  What a backend
can do beyond the contract is declared as data in ``StorageCapabilities`` (dlt-style), never
discovered by ``isinstance``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, ClassVar, Literal

import pyarrow as pa

from ratebeam.transforms.periods import month_start, require_aware
from ratebeam.transforms.schema import SCOPE, TYPE, usage_schema

#: A filter value: one value or a list of accepted values (CloudKitty's ``filters`` argument).
FilterValue = str | list[str]

#: ``total`` groupby shortcuts and the groupby label each one stands for (`cloudkitty/storage/v2/__init__.py:43-199`, `cloudkitty/collector/__init__.py:285-309`).
TIME_GROUPBYS: dict[str, str] = {
    "time-d": "day_of_the_year",
    "time-w": "week_of_the_year",
    "time-m": "month",
    "time-y": "year",
}
#: ``total`` groupby item grouping by period: results carry each period's begin/end.
TIME = "time"


#: The ways a backend can replace a slice (see ``StorageCapabilities.rewrite``).
Rewrite = Literal["atomic", "in_place", "delete_then_write", "append"]


@dataclass(frozen=True)
class StorageCapabilities:
    """What a backend supports, read by the pipeline, the CLI and the conformance suite."""

    name: str
    #: Totals and retrieved quantities/prices are exact decimals (False: float64, as CloudKitty stores).
    exact_decimals: bool
    #: ``delete`` is supported (needed by state reset and reprocessing).
    supports_delete: bool = True
    #: ``total`` accepts ``custom_fields`` (InfluxDB only in CloudKitty).
    supports_custom_fields: bool = False
    #: ``compact`` rewrites small files into large ones and vacuums superseded ones and what killed
    #: writers left (``storage compact``).
    supports_compact: bool = False
    #: How a rewrite of a (scope, period, type) slice replaces what was stored, as readers see it:
    #: ``atomic`` (old or new slice, never both or none), ``in_place`` (points overwrite themselves by
    #: id, stale ones are removed after: never none, briefly stale extras), ``delete_then_write``
    #: (the slice is briefly missing), ``append`` (only an identical rewrite is stored once: a
    #: changed slice must be deleted first).  ``ratebeam storage info`` prints it.
    rewrite: Rewrite = "atomic"
    #: How a rewrite of a slice is made idempotent, in words (``ratebeam storage info``, the README).
    idempotence: str = ""
    #: The backend keeps each point's lineage (the ``rating_rules`` column: ids of the rules that
    #: priced it) and ``retrieve`` returns it.  False: the column is never sent to it (documents stay
    #: exactly CloudKitty's) and ``report explain`` re-derives it from the rules (docs/lineage.md).
    stores_lineage: bool = False


@dataclass(frozen=True)
class TotalQuery:
    """Arguments of ``total`` (`cloudkitty/storage/v2/__init__.py:43-199`).

    ``groupby`` items: ``type``; ``time`` (one row per period, whose begin/end the row carries);
    ``time-d|w|m|y`` (the ``day_of_the_year|week_of_the_year|month|year`` groupby label); any
    other name is a groupby label (never metadata), a point without it grouping as ``''``.
    ``begin``/``end`` default to the current month (``default_bounds``); ``filters`` and
    ``metric_types`` select points as in ``retrieve``.  A backend whose capabilities say
    ``supports_custom_fields=False`` raises ``ValueError`` when ``custom_fields`` is set.
    """

    groupby: tuple[str, ...] = ()
    begin: datetime | None = None
    end: datetime | None = None
    metric_types: tuple[str, ...] = ()
    filters: dict[str, FilterValue] = field(default_factory=dict)
    custom_fields: str | None = None
    offset: int = 0
    limit: int = 1000


@dataclass(frozen=True)
class TotalResult:
    """``{"total": rows matched before pagination, "results": [{begin, end, qty, rate, <groupby>}]}``.

    One row per group of matched points (no matched point: no row), sorted by the groupby values in
    ``groupby`` order (``time`` sorts by period begin); ``begin``/``end`` are the query bounds unless
    grouping by ``time``; ``qty``/``rate`` are sums (``Decimal`` when ``exact_decimals``); groupby
    keys are named after the label (``time-d`` gives ``day_of_the_year``).
    """

    total: int
    results: list[dict[str, Any]]


@dataclass(frozen=True)
class RetrieveResult:
    """``total`` = number of points matched; ``points`` = the page, as a rated Arrow table."""

    total: int
    points: pa.Table


class StorageBackend(abc.ABC):
    """One storage backend.  Instances are made on workers (in ``DoFn.setup``), never pickled live.

    Filters (``retrieve``, ``total``, ``delete``) are ``{key: value or [values]}``, all keys ANDed,
    the values of one key ORed (an empty list matches nothing): ``type`` selects metric types (as
    ``metric_types``, both must hold); ``scope_id`` selects the point's scope; any other key matches
    when the point's groupby label *or* its metadata label of that name equals a value (CloudKitty).
    ``select`` normalises them.  A write is visible to reads once ``write`` has returned.
    """

    capabilities: ClassVar[StorageCapabilities]

    #: The label CloudKitty keys a scope's points by (``[collect]/scope_key``, e.g. ``project_id``),
    #: set by ``make_backend``.  Points CloudKitty wrote before the switch carry only that label, not
    #: ratebeam's own scope marker, so backends that share storage with CloudKitty select a scope
    #: by either: deletes and rewrites then replace pre-switch history instead of doubling it.
    scope_key: str | None = None

    def check(self) -> None:  # noqa: B027 - optional hook
        """Refuse what cannot work whatever a server says (a root that is a file); reaches no server.

        ``ratebeam run`` calls it before it takes any lease, so such a mistake stops the run at once
        (``FatalConnectorError``) instead of failing every frame of every run.
        """

    def init(self) -> None:  # noqa: B027 - optional hook
        """Create what the backend needs (index, bucket, directory); idempotent."""

    def check_readable(self) -> None:  # noqa: B027 - a backend with nothing that can be missing
        """Refuse, naming it, a store that does not exist (index, database, root); create nothing.

        Readers (``ratebeam report``) call this instead of ``init``: a mistyped index or database
        name must be an error (``FatalConnectorError``), not an empty store silently made and then
        reported as 0 rows.  Loki has no such container (streams are labels): nothing to check.
        """

    @abc.abstractmethod
    def write(self, rated: pa.Table) -> int:
        """Store every (scope, begin, type) slice present in ``rated``, replacing earlier writes.

        ``rated`` holds complete slices only.  Returns the number of points stored.  Raises a
        ``connectors.errors`` exception on failure; a write that returned has been acknowledged.
        """

    def retrieve(
        self,
        begin: datetime | None = None,
        end: datetime | None = None,
        filters: dict[str, FilterValue] | None = None,
        metric_types: tuple[str, ...] | list[str] = (),
        offset: int = 0,
        limit: int = 1000,
    ) -> RetrieveResult:
        """Points with ``begin <= point.begin`` and ``point.end <= end``, in a stable order.

        Bounds default to the current month (``default_bounds``).  The order is (begin, scope_id,
        type, then the labels); ``total`` counts the matched points before ``offset``/``limit``.
        The arguments are normalised here, once for every backend, which answers in ``_retrieve``.
        """
        begin, end = default_bounds(begin, end)
        selection = select(filters, metric_types)
        if selection.empty:
            return RetrieveResult(0, usage_schema((), ()).empty_table())
        return self._retrieve(begin, end, selection, offset, limit)

    @abc.abstractmethod
    def _retrieve(
        self, begin: datetime, end: datetime, selection: Selection, offset: int, limit: int
    ) -> RetrieveResult:
        """``retrieve`` with aware bounds and a selection that can match something."""

    def total(self, query: TotalQuery) -> TotalResult:
        """Sums of ``qty`` and ``price`` (as ``rate``) grouped as ``query.groupby`` says.

        The query is checked (``check_total``) even when its selection matches nothing, then the
        backend answers in ``_total`` with aware bounds.
        """
        self.check_total(query)
        begin, end = default_bounds(query.begin, query.end)
        selection = select(query.filters, query.metric_types)
        if selection.empty:
            return TotalResult(0, [])
        return self._total(query, begin, end, selection)

    def check_total(self, query: TotalQuery) -> None:
        """Refuse what this backend cannot answer; by default any ``custom_fields`` without support."""
        reject_custom_fields(self.capabilities, query)

    @abc.abstractmethod
    def _total(self, query: TotalQuery, begin: datetime, end: datetime, selection: Selection) -> TotalResult:
        """``total`` with aware bounds and a selection that can match something."""

    def delete(
        self,
        begin: datetime | None = None,
        end: datetime | None = None,
        filters: dict[str, FilterValue] | None = None,
    ) -> None:
        """Remove points with ``begin <= point.begin < end`` matching ``filters`` (scope included).

        Unlike ``retrieve``, a missing bound is open: ``delete(begin=t, filters=...)`` removes
        everything from ``t`` on, as a state reset needs (`cloudkitty/orchestrator.py:221-246`).  The backend deletes in
        ``_delete``, with aware bounds and a selection that can match something.
        """
        selection = select(filters)
        if selection.empty:
            return
        begin = None if begin is None else require_aware(begin, "begin")
        end = None if end is None else require_aware(end, "end")
        self._delete(begin, end, selection)

    @abc.abstractmethod
    def _delete(self, begin: datetime | None, end: datetime | None, selection: Selection) -> None:
        """``delete`` of ``[begin, end)``, a None bound being open."""

    def debris(self) -> list[str] | None:
        """Files a vacuum with no retention would remove: what killed writers left, superseded files.

        None: the backend keeps no such files (a server's, an object store's atomic puts).
        ``ratebeam storage info`` counts them; ``compact`` removes those older than its retention.
        """
        return None

    def compact(self, retention_hours: int | None = None) -> dict[str, int]:
        """Merge small files and vacuum superseded ones (``supports_compact``); returns counts.

        ``retention_hours``: keep unreferenced files younger than this (None: the configured value).
        """
        raise NotImplementedError(f"{self.capabilities.name} storage has nothing to compact")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients; called from ``DoFn.teardown``."""


def as_decimal(value: Any) -> Decimal:
    """A total's number as a Decimal, whatever the backend returned (float via ``str``)."""
    if isinstance(value, Decimal):
        return value
    return Decimal(str(value))


def default_bounds(
    begin: datetime | None, end: datetime | None, now: datetime | None = None
) -> tuple[datetime, datetime]:
    """``retrieve``/``total`` bounds, a missing one being CloudKitty's: this month's start / next month's."""
    if begin is None or end is None:
        start = month_start(now or datetime.now(UTC))
        begin = start if begin is None else begin
        end = (start + timedelta(days=32)).replace(day=1) if end is None else end
    return require_aware(begin, "begin"), require_aware(end, "end")


@dataclass(frozen=True)
class Selection:
    """A query's filters split by what they address; ``None`` = no constraint, empty = nothing."""

    types: frozenset[str] | None
    scopes: frozenset[str] | None
    #: label key -> accepted values, matched against the groupby or the metadata label.
    labels: dict[str, frozenset[str]]

    @property
    def empty(self) -> bool:
        """True when no point can match (an empty list of accepted values somewhere)."""
        return (
            self.types == frozenset()
            or self.scopes == frozenset()
            or any(not values for values in self.labels.values())
        )


def select(
    filters: Mapping[str, Any] | None, metric_types: Iterable[str] | str | None = ()
) -> Selection:
    """Normalise ``filters`` and ``metric_types`` (str or list, values compared as ``str``)."""

    def values(value: Any) -> frozenset[str]:
        if isinstance(value, str) or not isinstance(value, Iterable):
            value = [value]
        return frozenset(str(v) for v in value)

    filters = dict(filters or {})
    types = values(filters.pop(TYPE)) if TYPE in filters else None
    if isinstance(metric_types, str):
        metric_types = [metric_types]
    if metric_types:
        wanted = values(metric_types)
        types = wanted if types is None else types & wanted
    scopes = values(filters.pop(SCOPE)) if SCOPE in filters else None
    return Selection(types, scopes, {key: values(value) for key, value in filters.items()})


def total_keys(groupby: Iterable[str]) -> tuple[str, ...]:
    """``total``'s groupby in order without repeats, ``time-*`` replaced by the label they stand for.

    Each item is ``time``, ``type`` or a groupby label name, which is also its key in a result row.
    """
    return tuple(dict.fromkeys(TIME_GROUPBYS.get(item, item) for item in groupby))


def reject_custom_fields(capabilities: StorageCapabilities, query: TotalQuery) -> None:
    """The clear error a backend without ``custom_fields`` support gives when it is asked for them."""
    if query.custom_fields is not None and not capabilities.supports_custom_fields:
        raise ValueError(
            f"{capabilities.name} storage: total(custom_fields={query.custom_fields!r}) is not "
            "supported (InfluxDB only); totals are always SUM(qty) AS qty, SUM(price) AS rate"
        )

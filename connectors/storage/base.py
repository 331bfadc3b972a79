"""The storage contract every backend implements (CloudKitty storage v2, spec §7.1).

A backend receives *rated* Arrow tables (columns of ``transforms.schema``) and must make writes
idempotent per (scope, period begin, type): writing the points of such a slice again replaces the
slice, so a crashed run followed by a rerun stores exactly what a clean run stores.  What a backend
can do beyond the contract is declared as data in ``StorageCapabilities`` (dlt-style), never
discovered by ``isinstance``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, ClassVar

import pyarrow as pa

#: A filter value: one value or a list of accepted values (CloudKitty's ``filters`` argument).
FilterValue = str | list[str]


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
    #: How a rewrite of a (scope, period, type) slice is made idempotent, for the README.
    idempotence: str = ""


@dataclass(frozen=True)
class TotalQuery:
    """Arguments of ``total`` (spec §7.1); ``groupby`` may hold ``type``, ``time``, ``time-d|w|m|y``."""

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
    """``{"total": rows matched before pagination, "results": [{begin, end, qty, rate, <groupby>}]}``."""

    total: int
    results: list[dict[str, Any]]


@dataclass(frozen=True)
class RetrieveResult:
    """``total`` = number of points matched; ``points`` = the page, as a rated Arrow table."""

    total: int
    points: pa.Table


class StorageBackend(abc.ABC):
    """One storage backend.  Instances are made on workers (in ``DoFn.setup``), never pickled live."""

    capabilities: ClassVar[StorageCapabilities]

    def init(self) -> None:  # noqa: B027 - optional hook
        """Create what the backend needs (index, bucket, directory); idempotent."""

    @abc.abstractmethod
    def write(self, rated: pa.Table) -> int:
        """Store every (scope, begin, type) slice present in ``rated``, replacing earlier writes.

        ``rated`` holds complete slices only.  Returns the number of points stored.  Raises a
        ``connectors.errors`` exception on failure; a write that returned has been acknowledged.
        """

    @abc.abstractmethod
    def retrieve(
        self,
        begin: datetime | None = None,
        end: datetime | None = None,
        filters: dict[str, FilterValue] | None = None,
        metric_types: tuple[str, ...] | list[str] = (),
        offset: int = 0,
        limit: int = 1000,
    ) -> RetrieveResult:
        """Points with ``begin <= point.begin`` and ``point.end <= end``, in a stable order."""

    @abc.abstractmethod
    def total(self, query: TotalQuery) -> TotalResult:
        """Sums of ``qty`` and ``price`` (as ``rate``) grouped as ``query.groupby`` says."""

    @abc.abstractmethod
    def delete(
        self,
        begin: datetime | None = None,
        end: datetime | None = None,
        filters: dict[str, FilterValue] | None = None,
    ) -> None:
        """Remove points with ``begin <= point.begin < end`` matching ``filters`` (scope included)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients; called from ``DoFn.teardown``."""


def as_decimal(value: Any) -> Decimal:
    """A total's number as a Decimal, whatever the backend returned (float via ``str``)."""
    if isinstance(value, Decimal):
        return value
    return Decimal(str(value))

"""InfluxDB's v2 API for the ``influxdb`` storage: writes, Flux queries and ``/api/v2/delete``.

Only what differs from the v1 class (``backend.py``) lives here: the Flux read path, the v2
delete with its InfluxQL fallback, and CloudKitty's v2 ``custom_fields`` items.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from itertools import product
from typing import Any

import polars as pl

from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.storage.base import Selection
from ratebeam.connectors.storage.influxdb.backend import InfluxDBStorage
from ratebeam.connectors.storage.influxdb.config import InfluxConnection
from ratebeam.connectors.storage.influxdb.frames import flux_tables, pivot
from ratebeam.connectors.storage.influxdb.lineprotocol import SCOPE_TAG
from ratebeam.connectors.storage.influxdb.queries import (
    delete_predicate,
    flux_custom_fields,
    flux_select,
    rfc3339,
)
from ratebeam.transforms.schema import PRICE, QTY, TYPE


class InfluxDB2Storage(InfluxDBStorage):
    """The v2 API: ``/api/v2/write``, Flux ``/api/v2/query``, ``/api/v2/delete``.

    Against InfluxDB 1.8's v2 layer (bucket = ``database/retention_policy``, no delete route),
    deletes fall back to InfluxQL ``DELETE`` on ``/query`` with the same token.
    """

    capabilities = dataclasses.replace(InfluxDBStorage.capabilities, name="influxdb-v2")

    def __init__(self, connection: InfluxConnection) -> None:
        super().__init__(connection)
        self._delete_route: bool | None = None  # None: not known yet

    def init(self) -> None:
        """Check that the server answers ``/health`` (buckets are created by the operator)."""
        self.http.request("GET", "/health")

    def check_readable(self) -> None:
        """Refuse a bucket that does not exist; create nothing.

        InfluxDB 2.x is asked through ``/api/v2/buckets``; InfluxDB 1.8's v2 layer, which has no
        such route, through the bucket's database and retention policy (InfluxQL).
        """
        c = self.options
        response = self.http.request("GET", "/api/v2/buckets", allow=(404,), params={"name": c.bucket, "org": c.org})
        if response.status == 404 and not response.headers.get("Content-Type", "").startswith("application/json"):
            super().check_readable()
            return
        if response.status == 404 or not response.json().get("buckets"):
            raise FatalConnectorError(f"influxdb-v2 storage: bucket {c.bucket!r} does not exist (org {c.org!r})")

    def _custom_fields(self, custom_fields: str) -> Any:
        """The v2 items ``(function, field, alias)``, or ``ValueError``."""
        return flux_custom_fields(custom_fields)

    def _custom_rows(
        self, fields: Any, keys: tuple[str, ...], begin: datetime, end: datetime, selection: Selection
    ) -> list[dict[str, Any]]:
        """CloudKitty's v2 custom fields (``FUNC(qty|price) AS alias`` items), over the exact selection."""
        columns = {"qty": QTY, "price": PRICE}
        aggs = [getattr(pl.col(columns[field]), function)().alias(alias) for function, field, alias in fields]
        return [
            row
            for row in self._aggregated(begin, end, selection, keys, aggs)
            if any(row[alias] for _, _, alias in fields)  # CloudKitty drops all-falsy rows
        ]

    def _raw(
        self, low_ns: int, high_ns: int, selection: Selection, fields: tuple[str, ...] = ()
    ) -> pl.DataFrame:
        text = self.http.flux(flux_select(self.options.bucket, low_ns, high_ns, selection, fields, self.scope_key))
        raw = pivot(flux_tables(text))
        # InfluxDB 1.8's Flux range() includes its stop (seen on 1.8.10): keep the bound half-open.
        return raw.filter(pl.col("time") < high_ns) if raw.height else raw

    def _delete_v2(self, low: int, high: int, tags: dict[str, str]) -> bool:
        """One v2 delete; False when the server has no delete route (then InfluxQL is used)."""
        if self._delete_route is False:
            return False
        done = self.http.delete_v2(rfc3339(low), rfc3339(high), delete_predicate(tags))
        self._delete_route = done
        return done

    def _scope_tags(self) -> list[str]:
        """The tags a scope is deleted by: ratebeam's, and CloudKitty's ``scope_key`` (its points)."""
        key = self.scope_key
        return [SCOPE_TAG] if key is None or key == SCOPE_TAG else [SCOPE_TAG, key]

    def _delete_slices(self, runs: list[tuple[str, str, int, int]]) -> None:
        remaining = []
        for scope, type_, first, last in runs:
            # The predicate has no OR: one delete per scope tag (the first tells whether the route exists).
            if not all(self._delete_v2(first, last + 1, {tag: scope, TYPE: type_}) for tag in self._scope_tags()):
                remaining.append((scope, type_, first, last))
        super()._delete_slices(remaining)

    def _delete_range(self, low: int, high: int, selection: Selection) -> None:
        types = sorted(selection.types) if selection.types is not None else [None]
        scopes = sorted(selection.scopes) if selection.scopes is not None else [None]
        tags_of_scope = self._scope_tags() if selection.scopes is not None else [SCOPE_TAG]
        for type_, scope, scope_tag in product(types, scopes, tags_of_scope):
            tags = {k: v for k, v in ((scope_tag, scope), (TYPE, type_)) if v is not None}
            if not self._delete_v2(low, high, tags):
                super()._delete_range(low, high, selection)
                return

"""Loki storage: CloudKitty's log lines (`cloudkitty/storage/v2/loki/client.py:212-370`) over Loki's HTTP API, CloudKitty's faults fixed.

Write: one deterministic JSON line per point (``lines``), pushed in batches bounded by lines and
bytes, gzip-compressed.  Loki has no update: a rewrite of the same points sends the same stream,
timestamp and line, which Loki de-duplicates.  A rewrite with *other* content (a price changed) is
made in place: the slices' stored lines are read first, the new lines pushed, then every stored
line the new write does not repeat is deleted by its exact text (``rewrite="in_place"``: a reader
never sees the slice missing; until Loki applies the delete it may see the stale line beside the
new one — docs/loki.md says what Loki guarantees).

Reads never truncate (CloudKitty keeps at most ``limit`` entries per shard and sums those, so its
totals are wrong past the limit): ``query_range`` runs forward over shards of ``shard_days`` and
pages within each by timestamp until a page comes back short; the entries at a page's last
timestamp are asked again and de-duplicated.  The LogQL selects a superset (``logql``); the exact
selection, the contract's order and the totals are computed client-side over every matched point,
in exact decimals — LogQL's ``unwrap`` sums float64, so ``sum_over_time`` could not be exact.

Delete: Loki's delete API takes a stream selector and line filters only.  Without label filters
(the state reset and reprocessing case: a scope and a time range) one request is exact: the scope
is in the selector, types are an anchored line filter, the bounds are the timestamp range (whole
seconds, periods beginning on whole seconds, so an entry's sub-second offset never crosses a
bound).  With label filters, the points are found with a read, then deleted by point id (100 per
request); a line without an id (written by CloudKitty) is deleted by its exact text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import cast

import polars as pl
import pyarrow as pa

from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.storage.base import (
    RetrieveResult,
    Selection,
    StorageCapabilities,
    TotalQuery,
    TotalResult,
    total_keys,
)
from ratebeam.connectors.storage.frame_selection import (
    group_aliases,
    group_exprs,
    labels_match,
    predicate,
    retrieve_order,
    total_rows,
)
from ratebeam.connectors.storage.http_backend import HttpStorageBackend
from ratebeam.connectors.storage.loki import logql
from ratebeam.connectors.storage.loki.client import LokiHttp
from ratebeam.connectors.storage.loki.config import LokiStorageConfig
from ratebeam.connectors.storage.loki.lines import (
    ID_KEY,
    SCOPE_KEY,
    Entry,
    entries,
    points_frame,
    push_bodies,
)
from ratebeam.connectors.storage.parquet.tables import points_table
from ratebeam.connectors.storage.rated_frames import rated_frame
from ratebeam.transforms.point_identity import point_ids
from ratebeam.transforms.schema import BEGIN, END, PRICE, QTY, SCOPE, TYPE, groupby_column

_SECOND_NS = 1_000_000_000
_DAY_NS = 86_400 * _SECOND_NS
#: Point ids per delete request (a ~3.5 KB query).
IDS_PER_DELETE = 100
_HELPERS = (ID_KEY, "__line", "__ts")


def _ns(moment: datetime) -> int:
    delta = moment.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * _SECOND_NS + delta.microseconds * 1000


def _whole_second(moment: datetime | None) -> bool:
    return moment is None or moment.microsecond == 0


class LokiStorage(HttpStorageBackend[LokiStorageConfig, LokiHttp]):
    """Rated points as CloudKitty's Loki log lines, one stream per (labels, project, scope)."""

    capabilities = StorageCapabilities(
        name="loki",
        exact_decimals=True,
        rewrite="in_place",
        idempotence=(
            "deterministic line and nanosecond timestamp per point: an identical rewrite is "
            "de-duplicated by Loki; stored lines the rewrite does not repeat are deleted after it"
        ),
    )

    def _connect(self) -> LokiHttp:
        return LokiHttp(self.options)

    # -- write -------------------------------------------------------------------------------------

    def write(self, rated: pa.Table | pa.RecordBatch) -> int:
        """Push one line per point, in bodies of at most ``batch_lines`` lines / ``batch_bytes`` bytes."""
        frame = rated_frame(rated, "loki")
        if frame.height == 0:
            return 0
        rows = entries(frame, point_ids(frame), self.options.stream)
        stored = self._stored_lines(frame)
        for _, body in push_bodies(rows, self.options.batch_lines, self.options.batch_bytes):
            self.http.push(body)
        stale = stored.join(rows.select(pl.col("ts").alias("__ts"), pl.col("line").alias("__line")),
                            on=["__ts", "__line"], how="anti")
        for row in stale.iter_rows(named=True):
            scope = frozenset([row[SCOPE]])
            query = f"{logql.selector(self.options.stream, scope, row['__label'])} {logql.line_filter(row['__line'])}"
            self.http.delete(query, row["__ts"], row["__ts"])
        return frame.height

    @staticmethod
    def _empty_stored() -> pl.DataFrame:
        return pl.DataFrame(schema={SCOPE: pl.String, "__ts": pl.Int64, "__line": pl.String, "__label": pl.String})

    def _scope_labels(self) -> list[str]:
        """The stream labels a scope's lines are under: ratebeam's, and CloudKitty's (``scope_key`` set)."""
        return [SCOPE_KEY] if self.scope_key is None else [SCOPE_KEY, logql.CLOUDKITTY_SCOPE_LABEL]

    def _stored_lines(self, frame: pl.DataFrame) -> pl.DataFrame:
        """``__ts``/``__line``/``__label`` (and scope) of the lines stored in the slices ``frame`` rewrites.

        With ``scope_key`` set, the lines CloudKitty wrote (no ``scope_id``, under ``project_id``)
        are found too, their scope read from that label, so a rewrite replaces them.
        """
        slices = frame.select(SCOPE, TYPE, BEGIN).unique()
        selection = Selection(frozenset(slices[TYPE]), frozenset(slices[SCOPE]), {})
        begin, end = cast(datetime, frame[BEGIN].min()), cast(datetime, frame[END].max())
        found = []
        for label, points in self._scoped_points(selection, _ns(begin), _ns(end)):
            points = points.filter(predicate(points.columns, selection, begin, end))
            found.append(points.select(SCOPE, TYPE, BEGIN, "__ts", "__line").with_columns(pl.lit(label).alias("__label")))
        stored = pl.concat(found)
        if stored.height == 0:
            return self._empty_stored()
        return stored.join(slices, on=[SCOPE, TYPE, BEGIN], how="semi").select(SCOPE, "__ts", "__line", "__label")

    # -- reads -------------------------------------------------------------------------------------

    def _entries(self, query: str, start_ns: int, end_ns: int) -> list[Entry]:
        """Every entry ``query`` matches in ``[start_ns, end_ns)``: shard by shard, page by page."""
        found: dict[tuple[int, str], Entry] = {}
        page = self.options.page_size
        for low in range(start_ns, end_ns, self.options.shard_days * _DAY_NS):
            high = min(low + self.options.shard_days * _DAY_NS, end_ns)
            start = low
            while True:
                streams = self.http.query_range(query, start, high, page)
                got = [
                    Entry(tuple(sorted(s.get("stream", {}).items())), int(v[0]), v[1])
                    for s in streams
                    for v in s.get("values", [])
                ]
                for entry in got:
                    found.setdefault((entry.ts, entry.line), entry)
                if len(got) < page:
                    break
                last = max(entry.ts for entry in got)
                if last == start:
                    raise FatalConnectorError(
                        f"{self.http.where('/query_range')}: more than page_size={page} entries share "
                        f"the timestamp {last}: raise page_size (and Loki's max_entries_limit_per_query)"
                    )
                start = last
        return list(found.values())

    def _scoped_points(
        self, selection: Selection, start_ns: int, end_ns: int
    ) -> Iterator[tuple[str, pl.DataFrame]]:
        """(stream label, points) read under each label a selected scope's lines are under.

        CloudKitty's lines (no point id) get their scope from their scope-key groupby, so reports
        and rewrites find pre-switch history by scope; under CloudKitty's label only they are kept
        (ratebeam's lines carry that label too, and are read under their own).
        """
        for label in self._scope_labels() if selection.scopes is not None else [SCOPE_KEY]:
            points = points_frame(self._entries(logql.read_query(self.options.stream, selection, label),
                                                start_ns, end_ns))
            if label != SCOPE_KEY:
                points = points.filter(pl.col(ID_KEY).is_null())
            key = None if self.scope_key is None else groupby_column(self.scope_key)
            if key is not None and key in points.columns:
                cloudkittys = pl.col(ID_KEY).is_null() & pl.col(key).is_not_null()
                points = points.with_columns(pl.when(cloudkittys).then(pl.col(key)).otherwise(pl.col(SCOPE)).alias(SCOPE))
            yield label, points

    def _points(self, begin: datetime, end: datetime, selection: Selection) -> pl.DataFrame:
        """The exactly selected points of the window (``predicate``), helper columns included."""
        found = [points for _, points in self._scoped_points(selection, _ns(begin), _ns(end))]
        points = pl.concat(found, how="diagonal_relaxed") if len(found) > 1 else found[0]
        return points.filter(predicate(points.columns, selection, begin, end))

    def _retrieve(
        self, begin: datetime, end: datetime, selection: Selection, offset: int, limit: int
    ) -> RetrieveResult:
        """Points of ``[begin, end]`` ordered (begin, scope, type, labels, point id)."""
        matched = self._points(begin, end, selection)
        matched = matched.sort([*retrieve_order(matched.columns), ID_KEY, "__line"], nulls_last=False)
        page = matched.slice(offset, limit).drop(_HELPERS)
        return RetrieveResult(matched.height, points_table([page] if page.height else []))

    def _total(self, query: TotalQuery, begin: datetime, end: datetime, selection: Selection) -> TotalResult:
        """Exact sums of qty and price (``rate``) over every matched point, grouped, then paginated."""
        matched = self._points(begin, end, selection)
        if matched.height == 0:
            return TotalResult(0, [])
        keys = total_keys(query.groupby)
        aliases = group_aliases(keys)
        sums = [pl.col(QTY).sum().alias("qty"), pl.col(PRICE).sum().alias("rate")]
        groups = group_exprs(keys, aliases, matched.columns)
        rows = matched.group_by(groups).agg(sums).sort(list(aliases.values())) if groups else matched.select(sums)
        page = rows.slice(query.offset, query.limit).iter_rows(named=True)
        return TotalResult(rows.height, total_rows(page, keys, aliases, ["qty", "rate"], begin, end))

    # -- delete ------------------------------------------------------------------------------------

    def _delete(self, begin: datetime | None, end: datetime | None, selection: Selection) -> None:
        """Remove the points with ``begin <= point.begin < end`` matching ``selection``."""
        stream = self.options.stream
        last = None if end is None else _ns(end) - 1
        if not selection.labels and _whole_second(begin) and _whole_second(end):
            for label in self._scope_labels() if selection.scopes is not None else [SCOPE_KEY]:
                query = logql.selector(stream, selection.scopes, label)
                if selection.types is not None:
                    query += " " + logql.type_filter(selection.types)
                self.http.delete(query, None if begin is None else _ns(begin), last)
            return
        for query, start_ns, last_ns in self._exact_deletes(begin, end, selection):
            self.http.delete(query, start_ns, last_ns)

    def _exact_deletes(
        self, begin: datetime | None, end: datetime | None, selection: Selection
    ) -> list[tuple[str, int, int]]:
        """``(query, first ts, last ts)`` of delete requests removing exactly the selected points."""
        now = datetime.now(UTC)
        high = end if end is not None else now
        low = begin if begin is not None else high - timedelta(days=self.options.delete_lookback_days)
        # An entry's timestamp is within a second of its point's begin: look one second further.
        query = logql.read_query(self.options.stream, selection)
        points = points_frame(self._entries(query, _ns(low), _ns(high) + _SECOND_NS))
        keep = labels_match(points.columns, selection) & (pl.col(BEGIN) >= low)
        if end is not None:
            keep = keep & (pl.col(BEGIN) < end)
        if selection.types is not None:
            keep = keep & pl.col(TYPE).is_in(sorted(selection.types))
        if selection.scopes is not None:
            keep = keep & pl.col(SCOPE).is_in(sorted(selection.scopes))
        doomed = points.filter(keep).sort("__ts")
        requests: list[tuple[str, int, int]] = []
        with_ids = doomed.filter(pl.col(ID_KEY).is_not_null())
        for chunk in with_ids.iter_slices(IDS_PER_DELETE):
            scopes = frozenset(chunk[SCOPE].unique().to_list())
            query = f"{logql.selector(self.options.stream, scopes)} {logql.id_filter(chunk[ID_KEY].to_list())}"
            requests.append((query, cast(int, chunk["__ts"].min()), cast(int, chunk["__ts"].max())))
        for row in doomed.filter(pl.col(ID_KEY).is_null()).iter_rows(named=True):
            query = f"{logql.selector(self.options.stream, None)} {logql.line_filter(row['__line'])}"
            requests.append((query, row["__ts"], row["__ts"]))
        return requests


class PushOnlyLokiStorage(LokiStorage):
    """Loki storage on a server that implements only the push API (``push_only: true``, VictoriaLogs).

    Nothing is read before a write, so a rewrite with other content is added beside the stored line.
    """

    capabilities = dataclasses.replace(
        LokiStorage.capabilities,
        rewrite="append",
        idempotence="push only: an identical rewrite is de-duplicated; delete a slice before changing it",
    )

    def _stored_lines(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Nothing is read back from a push-only server."""
        return self._empty_stored()

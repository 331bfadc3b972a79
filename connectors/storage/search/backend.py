"""Elasticsearch and OpenSearch storage: one implementation, the engines' differences as data.

Documents are CloudKitty's (`cloudkitty/storage/v2/elasticsearch/client.py:232-316`, ``search_documents``) in one index (``cloudkitty`` by
default), so CloudKitty's API can read what ratebeam writes.  ``init()`` creates the index with
CloudKitty's mapping (or adds ratebeam's two extra fields to an existing one).

Idempotent writes: each point is indexed under a deterministic ``_id`` (``transforms.point_identity``),
so writing a slice again overwrites its documents.  Then the documents of the written
(scope, type, period begin) slices whose id is not among the new ids are deleted (found by a
search, removed by bulk ``delete`` actions).  Write-then-delete rather than delete-then-write: at no moment does a
reader miss a slice that was stored (no gap); between the two steps a reader may see a point the
rewrite removes, and once ``write`` returns the slice holds exactly the new points (no duplicate).
A crash between the steps leaves such points until the frame's rerun, which is certain because the
frame was not acknowledged.  Bulk answers are checked item by item: rejected items are retried when
the engine was overloaded (429) by the next run, else the frame fails naming them (CloudKitty loses
them silently).

Reads: ``retrieve`` sorts by (begin, scope, type, point id), a total order, and pages with
``from``/``size`` or, past the engine's 10,000-hit window, ``search_after``; ``total`` runs a
composite aggregation over every bucket (``time-*`` translated on both engines), merges the
absent-label and ``''`` buckets and paginates client-side; ``delete`` removes what the query
matches, scope filter applied (CloudKitty drops it, `cloudkitty/storage/v2/elasticsearch/client.py:369-383`), by ids found with a search and bulk
``delete`` actions rather than ``_delete_by_query`` (a ``reindex``-module endpoint that minimal
distributions lack); the index is refreshed before ``write`` and ``delete`` return, so what they
did is visible once they returned.  Quantities and prices are float64
(``capabilities.exact_decimals`` is False), sums are done by the engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar
from urllib.parse import quote

import polars as pl
import pyarrow as pa

from ratebeam.connectors.errors import FatalConnectorError, RetriableConnectorError, SkippableConnectorError
from ratebeam.connectors.http import is_retried_status
from ratebeam.connectors.storage.base import (
    TIME,
    RetrieveResult,
    Selection,
    StorageCapabilities,
    TotalQuery,
    TotalResult,
    total_keys,
)
from ratebeam.connectors.storage.http_backend import HttpStorageBackend
from ratebeam.connectors.storage.rated_frames import rated_frame
from ratebeam.connectors.storage.search.answers import (
    bulk_results,
    mapping_properties,
    reads_answers,
    search_problem,
)
from ratebeam.connectors.storage.search.client import SearchHttp
from ratebeam.connectors.storage.search.config import SearchStorageConfig
from ratebeam.connectors.storage.search.documents import bulk_requests, points_table
from ratebeam.connectors.storage.search.flavor import ELASTICSEARCH, OPENSEARCH, EngineFlavor
from ratebeam.connectors.storage.search.queries import (
    COMPOSITE_PAGE,
    SUMS,
    composite_sources,
    delete_query,
    mapping,
    retrieve_sort,
    stale_query,
    window_query,
)
from ratebeam.transforms.point_identity import point_ids
from ratebeam.transforms.schema import BEGIN, SCOPE, TYPE

#: ``index.max_result_window``'s default: ``from + size`` beyond it needs ``search_after``.
RESULT_WINDOW = 10_000
#: Slices whose stale documents one search looks for: 4 clauses each, well inside OpenSearch's
#: default limit of 1024 clauses per query.
SLICES_PER_DELETE = 100
#: Documents found and deleted per round of a delete.
DELETE_PAGE = 5000


class SearchStorage(HttpStorageBackend[SearchStorageConfig, SearchHttp]):
    """Rated points as CloudKitty documents in an Elasticsearch or OpenSearch index."""

    flavor: ClassVar[EngineFlavor]

    def __init_subclass__(cls, flavor: EngineFlavor, **kwargs: Any) -> None:
        """An engine's class: its dialect, and the capabilities every engine has, under its name."""
        super().__init_subclass__(**kwargs)
        cls.flavor = flavor
        cls.capabilities = StorageCapabilities(
            name=flavor.name,
            exact_decimals=False,
            rewrite="in_place",
            idempotence="deterministic document ids; a rewrite deletes the slice's documents it no longer holds",
            stores_lineage=True,  # an extra top-level field CloudKitty's drivers never read (documents.py)
        )

    def __init__(self, options: SearchStorageConfig) -> None:
        super().__init__(options)
        self._index = quote(options.index_name, safe="")

    def _connect(self) -> SearchHttp:
        options = self.options
        return SearchHttp(options.url, self.flavor.name, verify=options.verify, timeout=options.timeout)

    @classmethod
    def from_config(cls, config: SearchStorageConfig) -> SearchStorage:
        """The backend of a validated ``elasticsearch`` / ``opensearch`` section."""
        return cls(config)

    @property
    def _name(self) -> str:
        return self.flavor.name

    # -- setup -------------------------------------------------------------------------------------

    def init(self) -> None:
        """Create the index with the mapping, or add the fields an existing index lacks."""
        wanted = mapping(self.flavor)
        status, body = self.http.request("GET", f"/{self._index}/_mapping", allow=(404,))
        if status == 404:
            status, body = self.http.request("PUT", f"/{self._index}", {"mappings": wanted}, allow=(400,))
            if status == 200:
                return
            if "resource_already_exists" not in str(body):
                raise FatalConnectorError(f"{self.http.where()}: cannot create index {self._index}: {body}")
            _, body = self.http.request("GET", f"/{self._index}/_mapping")
        existing = mapping_properties(body, self.http.where(f"/{self._index}/_mapping"))
        missing = {k: v for k, v in wanted["properties"].items() if k not in existing}
        if missing:
            self.http.request("PUT", f"/{self._index}/_mapping", {"properties": missing})

    def check_readable(self) -> None:
        """Refuse an index that does not exist (``init`` would create it); create nothing."""
        status, _ = self.http.request("GET", f"/{self._index}/_mapping", allow=(404,))
        if status == 404:
            raise FatalConnectorError(
                f"{self.http.where()}: index {self.options.index_name!r} does not exist "
                "(no run ever wrote there: check index_name)"
            )

    # -- write -------------------------------------------------------------------------------------

    def write(self, rated: pa.Table | pa.RecordBatch) -> int:
        """Index every point under its id, then delete what the written slices no longer hold."""
        if isinstance(rated, pa.RecordBatch):
            rated = pa.Table.from_batches([rated])
        frame = rated_frame(rated, self._name)
        if frame.height == 0:
            return 0
        ids = point_ids(frame)
        for pending in bulk_requests(frame, ids, self.flavor):
            self._bulk(pending, refresh=False)
        self.http.request("POST", f"/{self._index}/_refresh")  # once: a refresh covers the whole index
        self._delete_stale(frame, ids)
        return frame.height

    def _bulk(self, pending: dict[str, str], absent_ok: bool = False, refresh: bool = True) -> None:
        """One bulk request (id -> its NDJSON action lines), checked item by item.

        Items refused as bad data fail the frame at once (``SkippableConnectorError``); items refused
        as overloaded (429, 5xx) fail it as ``RetriableConnectorError`` — the frame is written again
        by the next run, the HTTP layer being the only one that retries (``absent_ok``: a delete of
        a missing id is fine).
        """
        params = {"refresh": "true"} if refresh else None
        _, answer = self.http.request("POST", f"/{self._index}/_bulk", ndjson="".join(pending.values()), params=params)
        if not answer.get("errors"):
            return
        overloaded: list[dict[str, Any]] = []
        refused: list[dict[str, Any]] = []
        where = self.http.where(f"/{self._index}/_bulk")
        for result in bulk_results(answer, where):
            status = result["status"]
            if status < 300 or (absent_ok and status == 404):
                continue
            (overloaded if is_retried_status(status) else refused).append(result)
        if refused:
            reasons = "; ".join(
                f"{r.get('_id')}: {r.get('status')} {(r.get('error') or {}).get('type')}: "
                f"{(r.get('error') or {}).get('reason')}"
                for r in refused[:3]
            )
            raise SkippableConnectorError(f"{where}: bulk request rejected {len(refused)} document(s): {reasons}")
        if overloaded:
            raise RetriableConnectorError(f"{where}: {len(overloaded)} document(s) rejected as overloaded")

    def _delete_stale(self, frame: pl.DataFrame, ids: pl.Series) -> None:
        """Delete the written slices' documents that are not among ``ids``."""
        keyed = frame.select(SCOPE, TYPE, BEGIN).with_columns(ids.alias("id"))
        slices = keyed.group_by([SCOPE, TYPE, BEGIN], maintain_order=True).agg(pl.col("id"))
        rows = slices.rows()
        for start in range(0, len(rows), SLICES_PER_DELETE):
            part = rows[start : start + SLICES_PER_DELETE]
            keys = [(scope, type_, begin) for scope, type_, begin, _ in part]
            keep = [i for *_, slice_ids in part for i in slice_ids]
            self._delete_matching(stale_query(keys, keep, self.flavor, self.scope_key))

    @reads_answers
    def _delete_matching(self, query: dict[str, Any]) -> None:
        """Delete every document ``query`` matches: find ids, bulk-delete them, until none is left.

        Not ``_delete_by_query``: it lives in the ``reindex`` module, which minimal distributions
        (the integ-test-zips the tests run) lack; ids + bulk deletes work on every node and every
        item's result is checked.  Each bulk refreshes, so the next search sees what is left; a
        document found again once deleted means a server that does not delete (the loop would not end).
        """
        deleted: set[str] = set()
        while True:
            answer = self._search({"query": query, "size": DELETE_PAGE, "_source": False, "sort": ["_doc"]})
            ids = [hit["_id"] for hit in answer["hits"]["hits"]]
            if not ids:
                return
            again = deleted.intersection(ids)
            if again:
                raise RetriableConnectorError(f"{self.http.where()}: document {min(again)!r} is found again after "
                                              "its bulk delete succeeded: the server does not delete")
            self._bulk({i: _delete_action(i) for i in ids}, absent_ok=True)
            deleted.update(ids)

    # -- queries -----------------------------------------------------------------------------------

    def _search(self, body: dict[str, Any]) -> dict[str, Any]:
        _, answer = self.http.request("POST", f"/{self._index}/_search", body)
        problem = search_problem(answer, body)
        if problem:
            raise RetriableConnectorError(f"{self.http.where()}: malformed search answer ({problem})")
        if answer.get("_shards", {}).get("failed"):
            raise RetriableConnectorError(
                f"{self.http.where()}: search failed on some shards: {str(answer['_shards'])[:500]}"
            )
        return answer

    @reads_answers
    def _retrieve(
        self, begin: datetime, end: datetime, selection: Selection, offset: int, limit: int
    ) -> RetrieveResult:
        """Points of ``[begin, end]`` matching the filters, ordered (begin, scope, type, point id)."""
        query = window_query(selection, self.flavor, begin, end, self.scope_key)
        sort = retrieve_sort(self.flavor)
        base = {"query": query, "sort": sort, "track_total_hits": True}
        if offset + limit <= RESULT_WINDOW:
            answer = self._search({**base, "from": offset, "size": limit})
            total = answer["hits"]["total"]["value"]
            sources = [hit["_source"] for hit in answer["hits"]["hits"]]
            return RetrieveResult(total, points_table(sources, self.scope_key))
        # Past the window: walk with search_after, fetching only sort values while skipping.
        total, after, position, sources = 0, None, 0, []
        while position < offset + limit:
            size = min(RESULT_WINDOW, offset + limit - position)
            skipping = position + size <= offset
            body = {**base, "size": size, "_source": not skipping}
            if after is not None:
                body["search_after"] = after
            answer = self._search(body)
            total = answer["hits"]["total"]["value"]
            hits = answer["hits"]["hits"]
            if not hits:
                break
            first = max(offset - position, 0)
            if not skipping:
                sources += [hit["_source"] for hit in hits[first:]]
            position += len(hits)
            after = hits[-1]["sort"]
        return RetrieveResult(total, points_table(sources[:limit], self.scope_key))

    @reads_answers
    def _total(self, query: TotalQuery, begin: datetime, end: datetime, selection: Selection) -> TotalResult:
        """Sums of qty and price (``rate``) per group, over every composite bucket, then paginated."""
        search_query = window_query(selection, self.flavor, begin, end, self.scope_key)
        keys = total_keys(query.groupby)
        if not keys:
            answer = self._search({"query": search_query, "size": 0, "track_total_hits": True, "aggs": SUMS})
            if not answer["hits"]["total"]["value"]:
                return TotalResult(0, [])
            sums = answer["aggregations"]
            row: dict[str, Any] = {
                "begin": begin, "end": end, "qty": sums["sum_qty"]["value"], "rate": sums["sum_price"]["value"],
            }
            return TotalResult(1, [row][query.offset : query.offset + query.limit])
        groups: dict[tuple, list[float]] = {}
        for bucket in self._buckets(search_query, keys):
            values = tuple(_key_value(v) for v in bucket["key"].values())
            sums = groups.setdefault(values, [0.0, 0.0])
            sums[0] += bucket["sum_qty"]["value"]
            sums[1] += bucket["sum_price"]["value"]
        ordered = sorted(groups.items(), key=lambda item: item[0])
        results = []
        for values, (qty, rate) in ordered[query.offset : query.offset + query.limit]:
            row = {"begin": begin, "end": end, "qty": qty, "rate": rate}
            position = 0
            for key in keys:
                if key == TIME:
                    row["begin"], row["end"] = values[position], values[position + 1]
                    position += 2
                else:
                    row[key] = values[position]
                    position += 1
            results.append(row)
        return TotalResult(len(ordered), results)

    def _buckets(self, query: dict[str, Any], keys: tuple[str, ...]) -> Iterator[dict[str, Any]]:
        """Every composite bucket, page after page (``after_key``)."""
        composite: dict[str, Any] = {"sources": composite_sources(keys, self.flavor), "size": COMPOSITE_PAGE}
        while True:
            body = {
                "query": query,
                "size": 0,
                "aggs": {"groups": {"composite": composite, "aggregations": SUMS}},
            }
            groups = self._search(body)["aggregations"]["groups"]
            yield from groups["buckets"]
            after = groups.get("after_key")
            if not groups["buckets"] or after is None:
                return
            composite = {**composite, "after": after}

    def _delete(self, begin: datetime | None, end: datetime | None, selection: Selection) -> None:
        """Remove matching points of ``[begin, end)`` (open bounds when None), scope filter applied."""
        self._delete_matching(delete_query(selection, self.flavor, begin, end, self.scope_key))


class ElasticsearchStorage(SearchStorage, flavor=ELASTICSEARCH):
    """CloudKitty's Elasticsearch storage (`cloudkitty/storage/v2/elasticsearch/client.py:232-316`), faults fixed (see ``search.py``)."""


class OpenSearchStorage(SearchStorage, flavor=OPENSEARCH):
    """CloudKitty's OpenSearch storage (`cloudkitty/storage/v2/opensearch/client.py:100-116`), faults fixed (see ``search.py``)."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _key_value(value: Any) -> Any:
    """A composite key part: epoch milliseconds (``start``/``end``) as UTC datetimes, null as ''."""
    if value is None:
        return ""
    if isinstance(value, int):
        return _EPOCH + timedelta(milliseconds=value)
    return value


def _delete_action(point_id: str) -> str:
    return json.dumps({"delete": {"_id": point_id}}) + "\n"

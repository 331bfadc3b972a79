"""InfluxDB storage: CloudKitty's ``dataframes`` points through the v1 API (InfluxQL) or the v2 API (Flux).

Points are CloudKitty's (`cloudkitty/storage/v2/influx.py:107-356`; see ``influx_lineprotocol`` for the tags ratebeam adds:
``__rb_scope``, and ``__rb_dup`` which keeps two points of one slice with the same groupby apart
where CloudKitty lets the second overwrite the first, `cloudkitty/storage/v2/influx.py:172-193`).  Values are float64, so
``exact_decimals`` is False: totals and retrieved money are the nearest floats of the decimals.

Idempotence: InfluxDB identifies a point by measurement + tag set + time, so rewriting a point
overwrites it.  A rewrite of a (scope, period, type) slice must also drop the slice's points that
are no longer produced, so ``write`` first asks which of its slices are already stored (one query
on the batch's time window) and deletes those slices (``__rb_scope`` + ``type`` + time), then
writes the lines in batches.  A crash between the delete and the write leaves the slice absent,
never doubled; the frame is not acknowledged and the next run writes it again.

Reads push the time window, the types and the scopes down to the server (and, with InfluxQL, the
non-empty label values as ``"k"::tag = 'v' OR "k"::field = 'v'``), then apply the contract's exact
selection, order, pagination and sums to the returned points with Polars: the end bound
(``point.end <= end``), ``''`` versus absent labels and the retrieve order are not expressible in
InfluxQL or Flux.  ``total(custom_fields=...)`` runs server-side as InfluxQL on v1 (CloudKitty);
on v2 CloudKitty's ``FUNC(field) AS alias`` items are aggregated here over the exact selection.

A delete with label filters (which may match metadata *fields*, which InfluxDB cannot delete by)
deletes each affected slice and rewrites the slice's points that do not match.  This module is the
v1 class; ``v2.py`` holds what the v2 API does differently.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, cast

import polars as pl
import pyarrow as pa

from ratebeam.connectors.errors import FatalConnectorError, SkippableConnectorError
from ratebeam.connectors.storage.base import (
    TIME,
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
from ratebeam.connectors.storage.influxdb.client import InfluxHTTP
from ratebeam.connectors.storage.influxdb.config import InfluxConnection, InfluxDBStorageConfig
from ratebeam.connectors.storage.influxdb.frames import (
    FIELD,
    TAG,
    decode,
    scope_of,
    to_arrow,
    typed,
    whole_points,
)
from ratebeam.connectors.storage.influxdb.lineprotocol import (
    MEASUREMENT,
    lines,
    payloads,
    precision_of,
)
from ratebeam.connectors.storage.influxdb.queries import (
    check_custom_fields,
    ident,
    influxql_where,
    slice_delete,
)
from ratebeam.connectors.storage.rated_frames import rated_frame
from ratebeam.transforms.periods import require_aware
from ratebeam.transforms.schema import (
    BEGIN,
    PRICE,
    QTY,
    SCOPE,
    TYPE,
)

#: Time window of a delete with an open bound (InfluxDB's representable range).
_MIN_NS = -9_223_372_036_854_775_806
_MAX_NS = 9_223_372_036_854_775_806
#: Slice deletes sent in one InfluxQL request.
_STATEMENTS_PER_REQUEST = 200

LOG = logging.getLogger(__name__)


def _ns(moment: datetime, what: str) -> int:
    moment = require_aware(moment, what)
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


class InfluxDBStorage(HttpStorageBackend[InfluxConnection, InfluxHTTP]):
    """The v1 API (``/write``, InfluxQL ``/query``); ``from_config`` returns the v2 class for version 2."""

    capabilities = StorageCapabilities(
        name="influxdb",
        exact_decimals=False,
        supports_custom_fields=True,
        rewrite="delete_then_write",
        idempotence=(
            "a point is measurement + tag set + time: a rewrite overwrites it; write deletes the slices "
            "(__rb_scope, type, begin) already stored before writing them, so dropped points go too; "
            "a reader may find a rewritten slice empty or partly written until the write returns"
        ),
    )

    @classmethod
    def from_config(cls, config: Any) -> InfluxDBStorage:
        """From a validated ``InfluxDBStorageConfig`` (or an ``InfluxConnection`` itself)."""
        connection = config.connection if isinstance(config, InfluxDBStorageConfig) else config
        if not isinstance(connection, InfluxConnection):
            raise FatalConnectorError(f"influxdb storage: not an InfluxDB configuration: {config!r}")
        if connection.version == 2:
            from ratebeam.connectors.storage.influxdb.v2 import InfluxDB2Storage

            return InfluxDB2Storage(connection)
        return InfluxDBStorage(connection)

    def _connect(self) -> InfluxHTTP:
        return InfluxHTTP(self.options)

    def init(self) -> None:
        """Create the database if missing and check that the retention policy exists (CloudKitty)."""
        database, _ = self.http.database_and_rp()
        if database not in self._names("SHOW DATABASES"):  # CREATE needs admin rights: only when missing
            list(self.http.influxql(f"CREATE DATABASE {ident(database)}", database=False))
        self._check_policy()

    def check_readable(self) -> None:
        """Refuse a database (or retention policy) that does not exist; create nothing."""
        database, _ = self.http.database_and_rp()
        databases = self._names("SHOW DATABASES")
        if database not in databases:
            raise FatalConnectorError(
                f"influxdb storage: database {database!r} does not exist "
                f"(existing: {', '.join(sorted(databases)) or 'none'})"
            )
        self._check_policy()

    def _names(self, statement: str) -> set[str]:
        """The first column of every row an InfluxQL ``SHOW`` statement returns."""
        return {
            row[0]
            for result in self.http.influxql(statement, database=False)
            for series in result.get("series", [])
            for row in series.get("values", [])
        }

    def _check_policy(self) -> None:
        database, policy = self.http.database_and_rp()
        policies = self._names(f"SHOW RETENTION POLICIES ON {ident(database)}")
        if policy not in policies:
            raise FatalConnectorError(
                f"influxdb storage: retention policy {policy!r} does not exist on database {database!r} "
                f"(existing: {', '.join(sorted(policies)) or 'none'})"
            )

    # -- write -------------------------------------------------------------------------------------

    def write(self, rated: pa.Table | pa.RecordBatch) -> int:
        """Replace every (scope, begin, type) slice of ``rated``; return the points written."""
        frame = _canonical(rated)
        if frame.height == 0:
            return 0
        precision = precision_of(frame)
        line_series = lines(frame, precision)  # refuses unwritable labels before anything is deleted
        slices = frame.select(
            pl.col(SCOPE), pl.col(TYPE), pl.col(BEGIN).dt.epoch("ns").alias("time")
        ).unique()
        self._delete_slices(self._stored(slices))
        for body in payloads(line_series, self.options.batch_lines):
            self.http.write(body, precision)
        return frame.height

    def _stored(self, slices: pl.DataFrame) -> list[tuple[str, str, int, int]]:
        """Time runs (scope, type, first, last) covering the stored slices among ``slices``.

        One query over the batch's window lists the stored (scope, type, time); consecutive stored
        slices of the batch become one run (a DELETE costs about the same for one slice or many),
        broken wherever a stored slice is *not* in the batch.
        """
        # ``time`` is the Int64 column of a non-empty frame: its min and max are ints.
        low, high = cast(int, slices["time"].min()), cast(int, slices["time"].max()) + 1
        selection = Selection(frozenset(slices[TYPE]), frozenset(slices[SCOPE]), {})
        raw = self._raw(low, high, selection, fields=("qty",))
        if raw.height == 0:
            return []
        stored = raw.select(
            scope_of(raw.columns, self.scope_key).alias(SCOPE), pl.col(TAG + TYPE).alias(TYPE), pl.col("time")
        ).unique()
        return _runs(stored, slices)

    def _delete_slices(self, runs: list[tuple[str, str, int, int]]) -> None:
        """Remove every point of the slices of each (scope, type, first time, last time) run."""
        for start in range(0, len(runs), _STATEMENTS_PER_REQUEST):
            part = runs[start : start + _STATEMENTS_PER_REQUEST]
            list(self.http.influxql(";".join(slice_delete(*run, scope_key=self.scope_key) for run in part)))

    # -- reads -------------------------------------------------------------------------------------

    def _raw(
        self, low_ns: int, high_ns: int, selection: Selection, fields: tuple[str, ...] = ()
    ) -> pl.DataFrame:
        """Stored points with ``low <= time < high``: ``time`` (ns), ``t.<tag>`` and ``f.<field>`` columns.

        A superset of the selection (types, scopes and non-empty label values pushed down).
        """
        tag_keys: list[str] = []
        field_keys: list[str] = []
        for result in self.http.influxql(
            f"SHOW TAG KEYS FROM {ident(MEASUREMENT)}; SHOW FIELD KEYS FROM {ident(MEASUREMENT)}"
        ):
            for series in result.get("series", []):
                target = tag_keys if result["statement_id"] == 0 else field_keys
                target += [row[0] for row in series.get("values", [])]
        if fields:
            field_keys = [f for f in field_keys if f in fields]
        if not field_keys:
            return pl.DataFrame()
        columns = [f"{ident(k)}::tag AS {ident(TAG + k)}" for k in tag_keys]
        columns += [f"{ident(k)}::field AS {ident(FIELD + k)}" for k in field_keys]
        where = influxql_where(low_ns, high_ns, selection, labels=not fields, scope_key=self.scope_key)
        statement = f"SELECT {', '.join(columns)} FROM {ident(MEASUREMENT)}{where}"
        overrides: dict[str, pl.DataType] = {"time": pl.Int64(), **{TAG + k: pl.String() for k in tag_keys}}
        chunks = [
            pl.DataFrame(
                series.get("values", []),
                schema=series["columns"],
                orient="row",
                strict=False,
                infer_schema_length=None,
                schema_overrides={c: overrides[c] for c in series["columns"] if c in overrides},
            )
            for result in self.http.influxql(statement)
            for series in result.get("series", [])
        ]
        return typed(pl.concat(chunks, how="diagonal_relaxed")) if chunks else pl.DataFrame()

    def _points(self, begin: datetime, end: datetime, selection: Selection) -> pl.DataFrame:
        """Decoded points of ``[begin, end)`` (a superset of the selection), floats for the money.

        A point read with only some of its fields (``whole_points``: caught while its slice was
        deleted and written again) is not one yet, or no longer: left out and counted in the log,
        as the slice's points still to come or already gone are.
        """
        raw = self._raw(_ns(begin, "begin"), _ns(end, "end"), selection)
        whole = whole_points(raw, self.scope_key)
        if whole.height < raw.height:
            LOG.warning("influxdb: %d point(s) with a field missing left out (read while a slice was "
                        "rewritten)", raw.height - whole.height)
        return decode(whole, self.scope_key)

    def _retrieve(
        self, begin: datetime, end: datetime, selection: Selection, offset: int, limit: int
    ) -> RetrieveResult:
        """The points of ``[begin, end]`` matching the filters, ordered (begin, scope, type, labels)."""
        points = self._points(begin, end, selection)
        matched = points.filter(predicate(points.columns, selection, begin, end))
        matched = matched.sort(retrieve_order(matched.columns), nulls_last=False)
        return RetrieveResult(matched.height, to_arrow(matched.slice(offset, limit)))

    def _total(self, query: TotalQuery, begin: datetime, end: datetime, selection: Selection) -> TotalResult:
        """Sums of qty and price (``rate``) per group, or the ``custom_fields`` (CloudKitty's)."""
        if query.custom_fields is not None:
            return self._custom_total(query, begin, end, selection)
        keys = total_keys(query.groupby)
        sums = [pl.col(QTY).sum().alias("qty"), pl.col(PRICE).sum().alias("rate")]
        return _page(self._aggregated(begin, end, selection, keys, sums), query)

    def _aggregated(
        self, begin: datetime, end: datetime, selection: Selection, keys: tuple[str, ...], aggs: list[pl.Expr]
    ) -> list[dict[str, Any]]:
        """``aggs`` over the exactly selected points per group of ``keys``, sorted; no point: no row."""
        points = self._points(begin, end, selection)
        matched = points.filter(predicate(points.columns, selection, begin, end))
        if matched.height == 0:
            return []
        aliases = group_aliases(keys)
        groups = group_exprs(keys, aliases, matched.columns)
        if groups:
            rows = matched.group_by(groups).agg(aggs).sort(list(aliases.values()))
        else:
            rows = matched.select(aggs)
        names = [a.meta.output_name() for a in aggs]
        return total_rows(rows.iter_rows(named=True), keys, aliases, names, begin, end)

    def check_total(self, query: TotalQuery) -> None:
        """Valid ``custom_fields`` (``_custom_fields``) never grouped by time, matching points or not."""
        if query.custom_fields is None:
            return
        self._custom_fields(query.custom_fields)
        if TIME in total_keys(query.groupby):
            raise ValueError("influxdb storage: total(custom_fields=...) cannot group by 'time'")

    def _custom_fields(self, custom_fields: str) -> Any:
        """The InfluxQL field expressions, or ``ValueError``."""
        return check_custom_fields(custom_fields)

    def _custom_total(
        self, query: TotalQuery, begin: datetime, end: datetime, selection: Selection
    ) -> TotalResult:
        """CloudKitty's ``custom_fields`` total, paginated; the API version computes the rows."""
        fields = self._custom_fields(query.custom_fields or "")
        return _page(self._custom_rows(fields, total_keys(query.groupby), begin, end, selection), query)

    def _custom_rows(
        self, fields: Any, keys: tuple[str, ...], begin: datetime, end: datetime, selection: Selection
    ) -> list[dict[str, Any]]:
        """CloudKitty's InfluxQL total: ``SELECT <fields> ... GROUP BY <keys>``, server-side."""
        where = influxql_where(
            _ns(begin, "begin"), _ns(end, "end"), selection, labels=True, empty_values=True,
            scope_key=self.scope_key,
        )
        statement = f"SELECT {fields} FROM {ident(MEASUREMENT)}{where}"
        if keys:
            statement += " GROUP BY " + ", ".join(ident(k) for k in keys)
        rows = []
        for result in self.http.influxql(statement):
            for series in result.get("series", []):
                tags = series.get("tags") or {}
                for values in series["values"]:
                    named = dict(zip(series["columns"][1:], values[1:], strict=True))
                    if not any(named.values()):  # CloudKitty drops all-falsy points
                        continue
                    rows.append({"begin": begin, "end": end, **named, **{k: tags.get(k) or "" for k in keys}})
        rows.sort(key=lambda r: tuple(r[k] for k in keys))
        return rows

    # -- delete ------------------------------------------------------------------------------------

    def _delete(self, begin: datetime | None, end: datetime | None, selection: Selection) -> None:
        """Remove matching points of ``[begin, end)`` (open bounds when None)."""
        low = _MIN_NS if begin is None else _ns(begin, "begin")
        high = _MAX_NS if end is None else _ns(end, "end")
        if not selection.labels:
            self._delete_range(low, high, selection)
            return
        points = decode(self._raw(low, high, Selection(selection.types, selection.scopes, {})), self.scope_key)
        if points.height == 0:
            return
        points = points.with_columns(labels_match(points.columns, selection).alias("__doomed"))
        affected = points.filter(pl.col("__doomed")).select(SCOPE, TYPE, BEGIN).unique()
        if affected.height == 0:
            return
        slices = points.join(affected, on=[SCOPE, TYPE, BEGIN])
        survivors = slices.filter(~pl.col("__doomed")).drop("__doomed")
        as_slices = [pl.col(SCOPE), pl.col(TYPE), pl.col(BEGIN).dt.epoch("ns").alias("time")]
        self._delete_slices(_runs(points.select(as_slices).unique(), affected.select(as_slices)))
        if survivors.height:
            survivors = survivors.select(
                [c for c in survivors.columns if survivors[c].null_count() < survivors.height]
            )
            precision = precision_of(survivors)
            for body in payloads(lines(survivors, precision), self.options.batch_lines):
                self.http.write(body, precision)

    def _delete_range(self, low: int, high: int, selection: Selection) -> None:
        where = influxql_where(low, high, selection, labels=False, scope_key=self.scope_key)
        list(self.http.influxql(f"DELETE FROM {ident(MEASUREMENT)}{where}"))


def _runs(stored: pl.DataFrame, wanted: pl.DataFrame) -> list[tuple[str, str, int, int]]:
    """(scope, type, first, last) runs of ``wanted`` slices among the ``stored`` ones.

    Both frames hold (scope_id, type, time).  A run holds consecutive stored slices of one scope
    and type that are all wanted: deleting its time range removes nothing else.
    """
    marked = stored.join(
        wanted.with_columns(pl.lit(True).alias("__wanted")), on=[SCOPE, TYPE, "time"], how="left"
    )
    runs = (
        marked.sort(SCOPE, TYPE, "time")
        .with_columns(pl.col("__wanted").is_null().cum_sum().over(SCOPE, TYPE).alias("__run"))
        .filter(pl.col("__wanted").is_not_null())
        .group_by(SCOPE, TYPE, "__run")
        .agg(pl.col("time").min().alias("first"), pl.col("time").max().alias("last"))
        .sort(SCOPE, TYPE, "first")
    )
    return list(runs.select(SCOPE, TYPE, "first", "last").iter_rows())


def _page(rows: list[dict[str, Any]], query: TotalQuery) -> TotalResult:
    """``query``'s page of all the total's ``rows``."""
    return TotalResult(len(rows), rows[query.offset : query.offset + query.limit])


def _canonical(rated: pa.Table | pa.RecordBatch) -> pl.DataFrame:
    """The batch as Polars with string labels, or a clear error for what InfluxDB cannot store."""
    frame = rated_frame(rated, "influxdb")
    for name in (SCOPE, TYPE):
        if frame.height and (frame[name] == "").any():
            raise SkippableConnectorError(
                f"influxdb storage: column {name!r} has an empty value (InfluxDB drops empty tags)"
            )
    return frame



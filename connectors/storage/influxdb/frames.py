"""Stored InfluxDB points back to rated rows: Flux CSV parsing, pivoting, decoding, Arrow output.

Both APIs first produce a *raw* frame, one row per point: ``time`` (ns), ``t.<tag>`` and
``f.<field>`` columns (prefixed, because a groupby tag and a metadata field may share a name).
``decode`` turns it into rated rows using CloudKitty's ``groupby`` / ``metadata`` key lists, and
``to_arrow`` into the rated Arrow schema (float money back to the schema's decimals).
"""

from __future__ import annotations

import csv
import io

import polars as pl
import pyarrow as pa
from polars.datatypes import DataType, DataTypeClass

from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.storage.influxdb.lineprotocol import (
    GROUPBY_FIELD,
    METADATA_FIELD,
    PERIOD_FIELD,
    SCOPE_TAG,
)
from ratebeam.transforms.schema import (
    BEGIN,
    CORE_COLUMNS,
    END,
    GROUPBY_PREFIX,
    METADATA_PREFIX,
    PRICE,
    QTY,
    SCOPE,
    TYPE,
    UNIT,
    usage_schema,
)

#: A Polars dtype, as a class (``pl.String``) or an instance (``pl.Datetime("us")``).
PolarsDataType = DataType | DataTypeClass

#: Prefixes of tag and field columns in raw frames.
TAG = "t."
FIELD = "f."
_CORE_TYPES = {f.name: f.type for f in usage_schema((), ())}


def flux_tables(text: str) -> pl.DataFrame:
    """Flux's annotated CSV (one block per table) as one long frame of strings."""
    blocks: list[pl.DataFrame] = []
    header: list[str] | None = None
    rows: list[list[str]] = []

    def flush() -> None:
        if header is not None and rows:
            blocks.append(pl.DataFrame(rows, schema=header, orient="row"))

    for row in csv.reader(io.StringIO(text)):
        if not row or row == [""] or row[0] == "#datatype":
            flush()
            header, rows = None, []
        elif row[0].startswith("#"):
            continue
        elif header is None:
            if "error" in row and "_value" not in row:
                raise FatalConnectorError(f"influxdb storage: Flux query failed: {text[:500]}")
            header = [name or "__annotation" for name in row]
        else:
            rows.append(row)
    flush()
    if not blocks:
        return pl.DataFrame()
    return pl.concat(blocks, how="diagonal")


def pivot(long: pl.DataFrame) -> pl.DataFrame:
    """Field rows (``_time``, ``_field``, ``_value`` + tag columns) as one row per point."""
    if long.height == 0:
        return pl.DataFrame()
    tags = [
        c for c in long.columns if c not in ("__annotation", "result", "table", "_time", "_field", "_value")
    ]
    long = long.select(
        pl.col("_time").str.to_datetime(time_unit="ns", time_zone="UTC").dt.epoch("ns").alias("time"),
        *(pl.col(t).replace("", None).alias(TAG + t) for t in tags),
        (pl.lit(FIELD) + pl.col("_field")).alias("_field"),
        # Flux writes CSV with Go's encoding/csv in CRLF mode: a "\n" inside a value comes out as
        # "\r\n" (and a lone "\r" is dropped by the server, so it cannot be read back over v2).
        pl.col("_value").str.replace_all("\r\n", "\n", literal=True),
    )
    wide = long.pivot(
        on="_field", index=["time", *(TAG + t for t in tags)], values="_value", aggregate_function="first"
    )
    return typed(wide)


def typed(raw: pl.DataFrame) -> pl.DataFrame:
    """Money as float64 and the period as an integer, whatever the transport said."""
    casts = {FIELD + QTY: pl.Float64, FIELD + PRICE: pl.Float64, FIELD + PERIOD_FIELD: pl.Int64}
    return raw.with_columns(pl.col(c).cast(t) for c, t in casts.items() if c in raw.columns)


def scope_of(columns: list[str], scope_key: str | None) -> pl.Expr:
    """A raw point's scope: ratebeam's tag, else (a point CloudKitty wrote) its ``scope_key`` tag."""
    sources = [c for c in (TAG + SCOPE_TAG, None if scope_key is None else TAG + scope_key) if c in columns]
    return pl.coalesce([pl.col(c).cast(pl.String) for c in sources]) if sources else pl.lit(None, pl.String)


def whole_points(raw: pl.DataFrame, scope_key: str | None = None) -> pl.DataFrame:
    """The raw points all of whose fields are stored (a point caught mid-write is left out).

    InfluxDB stores each field of a point apart, so a read while a slice is deleted and written
    again (``delete_then_write``) can find a point with only some of its fields.  A point is whole
    when its core fields are there (type, scope, qty, price, unit, period) and, for a point ratebeam
    wrote (its scope tag), both key lists and every metadata field its ``metadata`` list names:
    ratebeam writes each of them, ``''`` kept.  A point CloudKitty wrote is not held to the lists:
    its client drops a ``None`` metadata value, so such a point may lack one field for good.
    """
    if raw.height == 0 or FIELD + QTY not in raw.columns:
        return raw

    def present(name: str) -> pl.Expr:
        return pl.col(name).is_not_null() if name in raw.columns else pl.lit(False)

    core = [present(FIELD + c) for c in (QTY, PRICE, UNIT, PERIOD_FIELD)] + [present(TAG + TYPE)]
    core.append(scope_of(raw.columns, scope_key).is_not_null())
    if TAG + SCOPE_TAG not in raw.columns:
        return raw.filter(pl.all_horizontal(core))
    listed = col_or_null(raw, FIELD + METADATA_FIELD).fill_null("").str.split("|")
    names = set(raw.select(listed.explode().unique().alias("k"))["k"].drop_nulls()) - {""}
    fields = [present(FIELD + GROUPBY_FIELD), present(FIELD + METADATA_FIELD)]
    fields += [~listed.list.contains(k) | present(FIELD + k) for k in sorted(names)]
    ours = pl.col(TAG + SCOPE_TAG).is_not_null()
    return raw.filter(pl.all_horizontal(core) & (~ours | pl.all_horizontal(fields)))


def col_or_null(raw: pl.DataFrame, name: str, dtype: PolarsDataType = pl.String) -> pl.Expr:
    """Column ``name`` of a raw frame as ``dtype``, or nulls when no point has it."""
    return pl.col(name).cast(dtype) if name in raw.columns else pl.lit(None, dtype)


def decode(raw: pl.DataFrame, scope_key: str | None = None) -> pl.DataFrame:
    """Raw points as rated rows: core columns (money float64) + ``groupby.*`` / ``metadata.*``.

    A groupby key is present when the point's ``groupby`` key list names it; its value is the tag,
    or ``''`` when the tag is absent (an empty tag is not stored).  Metadata likewise from the
    ``metadata`` key list and the fields.
    """
    if raw.height == 0 or FIELD + QTY not in raw.columns:
        return empty_points()

    def col(name: str, dtype: PolarsDataType = pl.String) -> pl.Expr:
        return col_or_null(raw, name, dtype)

    key_lists = {}
    for name in (GROUPBY_FIELD, METADATA_FIELD):
        key_lists[name] = col(FIELD + name).fill_null("").str.split("|")
    keys = {
        name: sorted(set(raw.select(expr.explode().unique().alias("k"))["k"].drop_nulls()) - {""})
        for name, expr in key_lists.items()
    }
    begin = pl.from_epoch(pl.col("time"), time_unit="ns").dt.cast_time_unit("us").dt.replace_time_zone("UTC")
    exprs = [
        scope_of(raw.columns, scope_key).alias(SCOPE),
        col(TAG + TYPE).alias(TYPE),
        begin.alias(BEGIN),
        (begin + pl.duration(seconds=col(FIELD + PERIOD_FIELD, pl.Int64))).alias(END),
        col(FIELD + QTY, pl.Float64).alias(QTY),
        col(FIELD + PRICE, pl.Float64).alias(PRICE),
        col(FIELD + UNIT).alias(UNIT),
    ]
    exprs += [
        pl.when(key_lists[GROUPBY_FIELD].list.contains(k))
        .then(col(TAG + k).fill_null(""))
        .alias(GROUPBY_PREFIX + k)
        for k in keys[GROUPBY_FIELD]
    ]
    exprs += [
        pl.when(key_lists[METADATA_FIELD].list.contains(k))
        .then(col(FIELD + k).fill_null(""))
        .alias(METADATA_PREFIX + k)
        for k in keys[METADATA_FIELD]
    ]
    return raw.select(exprs)


def empty_points() -> pl.DataFrame:
    """The decoded frame of a query that found no point: the core columns, no row."""
    return pl.DataFrame(
        schema={
            SCOPE: pl.String,
            TYPE: pl.String,
            BEGIN: pl.Datetime("us", "UTC"),
            END: pl.Datetime("us", "UTC"),
            QTY: pl.Float64,
            PRICE: pl.Float64,
            UNIT: pl.String,
        }
    )


def to_arrow(frame: pl.DataFrame) -> pa.Table:
    """A page of decoded points as a rated table (float money back to the schema's decimals)."""
    present = [c for c in frame.columns if c in CORE_COLUMNS or frame[c].null_count() < frame.height]
    labels = sorted(c for c in present if c.startswith(GROUPBY_PREFIX))
    labels += sorted(c for c in present if c.startswith(METADATA_PREFIX))
    money = {QTY: _CORE_TYPES[QTY], PRICE: _CORE_TYPES[PRICE]}
    frame = frame.with_columns(
        pl.col(name).cast(pl.String).cast(pl.Decimal(t.precision, t.scale)) for name, t in money.items()
    )
    table = frame.select([*CORE_COLUMNS, *labels]).to_arrow()
    schema = pa.schema(
        [
            pa.field(n, _CORE_TYPES.get(n, pa.string()), nullable=n not in CORE_COLUMNS)
            for n in table.column_names
        ]
    )
    return table.cast(schema)

r"""Rated Arrow batches as InfluxDB line protocol, built column-wise with Polars string expressions.

The point of a rated row is CloudKitty's (`cloudkitty/storage/v2/influx.py:107-356`): measurement ``dataframes``; tags = the
groupby labels (an empty value is dropped, as influxdb-python does) + ``type``; fields = the
metadata labels (strings, ``''`` kept) + ``qty`` and ``price`` (float64) + ``unit`` + the groupby
and metadata key lists joined by ``|`` + ``__ck_collect_period`` (integer seconds); time = period
begin.  ratebeam adds two tags CloudKitty readers ignore:

* ``__rb_scope`` = the point's scope, so that ``scope_id`` filters select the scope, not a label;
* ``__rb_dup`` = n on every point of a slice but the last (in batch order) whose tag set equals a
  later one's, counted back from it (n >= 1; the one just before the last has 1).  InfluxDB
  identifies a point by measurement + tag set + time, so CloudKitty's points of a resized server,
  written in one batch, collapse into the *last* one (measured with CloudKitty 25.0.0's own
  driver, ``tests/test_storage_influxdb.py``; `cloudkitty/storage/v2/influx.py:172-193`); the extra tag keeps them apart, and the
  untagged point of each tag set is exactly the point CloudKitty stores.

Line-protocol escaping (checked against influxd 1.6.7 and 1.8.10): in tag keys, tag values and
field keys ``,``, ``=`` and space are backslash-escaped and a backslash is literal; a newline cannot
be written there at all, nor can a trailing backslash (it would escape the separator), so such a
label is refused with a clear error.  String field values escape ``"`` and ``\``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import polars as pl

from ratebeam.connectors.errors import FatalConnectorError, SkippableConnectorError
from ratebeam.transforms.schema import (
    BEGIN,
    END,
    GROUPBY_PREFIX,
    METADATA_PREFIX,
    PRICE,
    QTY,
    SCOPE,
    TYPE,
    UNIT,
)

MEASUREMENT = "dataframes"
SCOPE_TAG = "__rb_scope"
DUP_TAG = "__rb_dup"
PERIOD_FIELD = "__ck_collect_period"
GROUPBY_FIELD = "groupby"
METADATA_FIELD = "metadata"
#: Field keys CloudKitty writes itself: a metadata label may not use them.
RESERVED_FIELDS = frozenset(
    {QTY, PRICE, UNIT, GROUPBY_FIELD, METADATA_FIELD, PERIOD_FIELD, "description", "time"}
)
#: Tag keys taken by the point itself or by Flux's result columns: a groupby label may not use them.
RESERVED_TAGS = frozenset(
    {TYPE, "time", "_measurement", "_field", "_value", "_time", "_start", "_stop", "result", "table"}
)
_INTERNAL_PREFIX = "__rb_"
#: Precisions ``write`` may use, as nanoseconds per unit.
PRECISIONS = {"s": 1_000_000_000, "ns": 1}


def _check_key(kind: str, key: str, reserved: frozenset[str]) -> None:
    if (
        not key
        or key in reserved
        or key.startswith(_INTERNAL_PREFIX)
        or "|" in key
        or "\n" in key
        or key.endswith("\\")
    ):
        raise FatalConnectorError(
            f"influxdb storage: {kind} label name {key!r} cannot be stored (empty, reserved "
            f"({', '.join(sorted(reserved))}, __rb_*), or containing '|', a newline or a trailing backslash)"
        )


def label_keys(columns: Iterable[str]) -> tuple[list[str], list[str]]:
    """The groupby and metadata label names of a rated table's columns, in column order, checked."""
    groupby, metadata = [], []
    for name in columns:
        if name.startswith(GROUPBY_PREFIX):
            groupby.append(name[len(GROUPBY_PREFIX) :])
            _check_key("groupby", groupby[-1], RESERVED_TAGS)
        elif name.startswith(METADATA_PREFIX):
            metadata.append(name[len(METADATA_PREFIX) :])
            _check_key("metadata", metadata[-1], RESERVED_FIELDS)
    return groupby, metadata


def _escape_key(key: str) -> str:
    return key.replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def _escape_tag(value: pl.Expr) -> pl.Expr:
    return value.str.replace_all(r"([,= ])", r"\$1")


def _quote_field(value: pl.Expr) -> pl.Expr:
    return pl.lit('"') + value.str.replace_all(r'(["\\])', r"\$1") + pl.lit('"')


def _refuse_bad_tag_values(frame: pl.DataFrame, columns: list[str]) -> None:
    """Tag values with a newline or a trailing backslash have no line-protocol spelling."""
    if not columns:
        return
    bad = frame.select(
        [
            (pl.col(c).str.contains("\n", literal=True) | pl.col(c).str.ends_with("\\")).any().alias(c)
            for c in columns
        ]
    ).row(0)
    for column, is_bad in zip(columns, bad, strict=True):
        if is_bad:
            value = frame.filter(
                pl.col(column).str.contains("\n", literal=True) | pl.col(column).str.ends_with("\\")
            )[column][0]
            raise SkippableConnectorError(
                f"influxdb storage: column {column!r}: value {value!r} cannot be an InfluxDB tag "
                "(a newline or a trailing backslash has no line-protocol spelling)"
            )


def _tag(key: str, value: pl.Expr) -> pl.Expr:
    """``,key=value``, or null when the value is null or ``''`` (dropped, as CloudKitty's client does)."""
    return pl.when(value.is_not_null() & (value != "")).then(
        pl.lit(f",{_escape_key(key)}=") + _escape_tag(value)
    )


def lines(frame: pl.DataFrame, precision: str) -> pl.Series:
    """One line per row of a rated frame (labels as strings, qty/price as numbers).

    ``precision`` is ``s`` (every begin on a whole second) or ``ns``.
    """
    groupby, metadata = label_keys(frame.columns)
    tag_columns = [SCOPE, TYPE, *(GROUPBY_PREFIX + k for k in groupby)]
    _refuse_bad_tag_values(frame, tag_columns)
    tags = [_tag(SCOPE_TAG, pl.col(SCOPE))]
    keyed = {TYPE: pl.col(TYPE), **{k: pl.col(GROUPBY_PREFIX + k) for k in groupby}}
    tags += [_tag(k, keyed[k]) for k in sorted(keyed)]
    series = pl.concat_str([pl.lit(MEASUREMENT), *tags], ignore_nulls=True)
    begin_ns = pl.col(BEGIN).dt.epoch("ns")
    same = [series, begin_ns]
    dup = pl.len().cast(pl.Int64).over(same) - 1 - pl.int_range(pl.len()).over(same)  # the last: 0, untagged
    dup_tag = pl.when(dup > 0).then(pl.lit(f",{DUP_TAG}=") + dup.cast(pl.String)).otherwise(pl.lit(""))

    def key_list(keys: list[str], prefix: str) -> pl.Expr:
        present = [pl.when(pl.col(prefix + k).is_not_null()).then(pl.lit(k)) for k in keys]
        joined = pl.concat_str(present, separator="|", ignore_nulls=True) if present else pl.lit("")
        return _quote_field(joined.fill_null(""))

    period = ((pl.col(END) - pl.col(BEGIN)).dt.total_seconds()).cast(pl.Int64)
    fields = {
        PERIOD_FIELD: pl.lit(f",{PERIOD_FIELD}=") + period.cast(pl.String) + pl.lit("i"),
        GROUPBY_FIELD: pl.lit(f",{GROUPBY_FIELD}=") + key_list(groupby, GROUPBY_PREFIX),
        METADATA_FIELD: pl.lit(f",{METADATA_FIELD}=") + key_list(metadata, METADATA_PREFIX),
        PRICE: pl.lit(f",{PRICE}=") + pl.col(PRICE).cast(pl.Float64).cast(pl.String),
        QTY: pl.lit(f",{QTY}=") + pl.col(QTY).cast(pl.Float64).cast(pl.String),
        UNIT: pl.lit(f",{UNIT}=") + _quote_field(pl.col(UNIT)),
    }
    for k in metadata:
        column = pl.col(METADATA_PREFIX + k)
        fields[k] = pl.when(column.is_not_null()).then(pl.lit(f",{_escape_key(k)}=") + _quote_field(column))
    field_set = pl.concat_str([fields[k] for k in sorted(fields)], ignore_nulls=True).str.slice(1)
    stamp = (begin_ns // PRECISIONS[precision]).cast(pl.String)
    line = pl.concat_str([series, dup_tag, pl.lit(" "), field_set, pl.lit(" "), stamp])
    return frame.select(line.alias("line"))["line"]


def precision_of(frame: pl.DataFrame) -> str:
    """``s`` when every begin is on a whole second (shorter lines), else ``ns``."""
    if frame.height and frame.select((pl.col(BEGIN).dt.epoch("us") % 1_000_000 != 0).any()).item():
        return "ns"
    return "s"


def payloads(line_series: pl.Series, batch_lines: int) -> Iterator[bytes]:
    """Request bodies of at most ``batch_lines`` lines."""
    for start in range(0, line_series.len(), batch_lines):
        yield line_series.slice(start, batch_lines).str.join("\n").item().encode()

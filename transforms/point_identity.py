"""Deterministic point ids: the same rated point gets the same id in every run, on every machine.

Stores keyed by document id (Elasticsearch, OpenSearch) make a rewrite idempotent by writing each
point under its id: writing the same scope × period twice overwrites instead of duplicating.  The id
is a BLAKE2b-128 hex digest (not Polars' ``hash``, whose values change between versions) of an
unambiguous netstring encoding (``<byte length>:<bytes>;`` per field) of

* scope, type, begin and end (ISO UTC, microseconds),
* the point's groupby items, sorted by key, null (absent) keys left out — so the id does not depend
  on which other label columns a batch happens to carry,
* a duplicate ordinal: points of one slice with an identical groupby (a resized server: same
  groupby, other metadata) are numbered 0, 1, ... in a deterministic order (metadata items, then
  qty, price and unit), so they stay two documents and a rerun numbers them the same way.
"""

from __future__ import annotations

import hashlib

import polars as pl

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

_DIGEST_BYTES = 16


def _netstring(value: pl.Expr) -> pl.Expr:
    """``<utf-8 byte length>:<value>;`` (null stays null): concatenations of these are unambiguous."""
    return pl.format("{}:{};", value.str.len_bytes(), value)


def _items(frame_columns: list[str], prefix: str) -> pl.Expr:
    """The non-null labels under ``prefix`` as sorted ``key value`` netstrings, '' when none."""
    keys = sorted(c for c in frame_columns if c.startswith(prefix))
    parts = [
        pl.when(pl.col(c).is_not_null()).then(
            pl.lit(f"{len(c[len(prefix):].encode())}:{c[len(prefix):]};") + _netstring(pl.col(c).cast(pl.String))
        )
        for c in keys
    ]
    return pl.concat_str(parts, ignore_nulls=True) if parts else pl.lit("")


def _instant(column: str) -> pl.Expr:
    return pl.col(column).dt.convert_time_zone("UTC").dt.strftime("%Y-%m-%dT%H:%M:%S%.6fZ")


def point_ids(points: pl.DataFrame) -> pl.Series:
    """One 32-hex-digit id per row of a rated frame (``transforms.schema`` columns), in row order."""
    columns = points.columns
    key = pl.concat_str(
        [
            _netstring(pl.col(SCOPE)),
            _netstring(pl.col(TYPE)),
            _netstring(_instant(BEGIN)),
            _netstring(_instant(END)),
            _items(columns, GROUPBY_PREFIX),
        ]
    )
    keyed = points.lazy().select(
        pl.int_range(pl.len()).alias("__row"),
        key.alias("__key"),
        _items(columns, METADATA_PREFIX).alias("__meta"),
        pl.col(QTY),
        pl.col(PRICE),
        pl.col(UNIT),
    )
    ordered = keyed.sort(["__key", "__meta", QTY, PRICE, UNIT, "__row"])
    numbered = ordered.with_columns(pl.int_range(pl.len()).over("__key").alias("__ordinal"))
    canonical = (
        numbered.sort("__row")
        .select(pl.concat_str([pl.col("__key"), _netstring(pl.col("__ordinal").cast(pl.String))]))
        .collect()
        .to_series()
    )
    digests = [hashlib.blake2b(text.encode(), digest_size=_DIGEST_BYTES).hexdigest() for text in canonical]
    return pl.Series("point_id", digests, dtype=pl.String)

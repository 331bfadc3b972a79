"""CloudKitty's JSON point object built column-wise in Polars: search documents and Loki lines.

CloudKitty's Elasticsearch/OpenSearch documents (`cloudkitty/storage/v2/elasticsearch/client.py:232-316`) and its Loki lines (`cloudkitty/storage/v2/loki/client.py:212-370`) are the
same object: ``start``, ``end``, ``type``, ``unit``, the backend's own fields (``description``,
``qty``, ``price``), ``groupby`` and ``metadata`` holding only the labels a point has, then the two
keys ratebeam adds.  Building it per column (``struct.json_encode`` for scalars, one ``"key":value``
fragment per present label) avoids a ``json.dumps`` per row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import polars as pl

from ratebeam.transforms.schema import BEGIN, END, GROUPBY_PREFIX, METADATA_PREFIX, SCOPE, TYPE, UNIT

#: Keys ratebeam adds to CloudKitty's object: the scope (CloudKitty keeps it only as a groupby label
#: whose name depends on the configuration) and the point id (``transforms.point_identity``).
SCOPE_KEY = "scope_id"
ID_KEY = "point_id"


def iso_instant(column: str) -> pl.Expr:
    """``datetime.isoformat()`` of a UTC instant: ``+00:00``, microseconds only when not zero."""
    moment = pl.col(column)
    return (
        pl.when(moment.dt.microsecond() == 0)
        .then(moment.dt.strftime("%Y-%m-%dT%H:%M:%S+00:00"))
        .otherwise(moment.dt.strftime("%Y-%m-%dT%H:%M:%S%.6f+00:00"))
    )


def json_string(expr: pl.Expr) -> pl.Expr:
    """The JSON literal of each string (quoted, escaped), via a one-field struct: ``{"v":...}``."""
    encoded = pl.struct(expr.alias("v")).struct.json_encode()
    return encoded.str.slice(5, encoded.str.len_chars() - 6)


def labels_object(columns: list[str], prefix: str) -> pl.Expr:
    """``{"key":"value",...}`` of the non-null labels under ``prefix`` (``{}`` when none)."""
    fragments = [
        pl.when(pl.col(c).is_not_null()).then(pl.lit(json.dumps(c[len(prefix) :]) + ":") + json_string(pl.col(c)))
        for c in columns
        if c.startswith(prefix)
    ]
    if not fragments:
        return pl.lit("{}")
    return pl.lit("{") + pl.concat_str(fragments, separator=",", ignore_nulls=True) + pl.lit("}")


def point_object(
    columns: list[str], ids: pl.Series, fields: Sequence[pl.Expr], fragments: Sequence[pl.Expr] = ()
) -> pl.Expr:
    """One JSON object per point of a rated frame with ``columns``, in CloudKitty's key order.

    ``fields`` (named expressions, JSON-encoded by Polars) follow ``start``/``end``/``type``/``unit``,
    then come ``fragments`` (ready ``,"key":value`` text, e.g. exact numbers), the labels, the scope
    and the point id of ``ids``.
    """
    head = pl.struct(
        iso_instant(BEGIN).alias("start"),
        iso_instant(END).alias("end"),
        pl.col(TYPE).alias("type"),
        pl.col(UNIT).alias("unit"),
        *fields,
    ).struct.json_encode()
    tail = pl.struct(pl.col(SCOPE).alias(SCOPE_KEY), pl.lit(ids).alias(ID_KEY)).struct.json_encode()
    return pl.concat_str(
        [
            head.str.strip_suffix("}"),
            *fragments,
            pl.lit(',"groupby":'),
            labels_object(columns, GROUPBY_PREFIX),
            pl.lit(',"metadata":'),
            labels_object(columns, METADATA_PREFIX),
            pl.lit(","),
            tail.str.strip_prefix("{"),
        ]
    )

"""Rated points ⇄ CloudKitty's search documents (`cloudkitty/storage/v2/elasticsearch/client.py:232-316`), the write side vectorized in Polars.

A document is what CloudKitty's Elasticsearch/OpenSearch drivers index::

    {"start": "2024-01-01T00:00:00+00:00", "end": "2024-01-01T01:00:00+00:00", "type": "instance",
     "unit": "instance", "description": null, "qty": 1.0, "price": 4.8,
     "groupby": {"project_id": "p1", ...}, "metadata": {"os_distro": "windows", ...}}

(``description`` omitted on OpenSearch) plus ``scope_id`` and ``point_id`` (see
``search_queries``) and, when the batch has lineage, ``rating_rules`` (the ids of the rules that
priced the point, comma-separated): CloudKitty's drivers read ``_source`` by key (``unit``, ``qty``,
``price``, ``groupby``, ``metadata``, ``start``, ``end``, ``type``) and aggregate only ``qty``,
``price``, ``type`` and ``groupby.*``, so an extra top-level field is invisible to them; ratebeam's
index maps it not at all (``dynamic: false``: kept in ``_source``, not indexed).  Times are UTC ISO 8601, quantities and prices the nearest float64 of the exact
decimal (as CloudKitty's ``float(Decimal)``), labels only those the point has.  The NDJSON bulk body
is built column-wise: scalar fields with ``struct.json_encode``, each label as a ``"key":value``
fragment present only when not null, concatenated; no per-row ``json.dumps``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import polars as pl
import pyarrow as pa

from ratebeam.connectors.storage.json_lines import point_object
from ratebeam.connectors.storage.search.flavor import EngineFlavor
from ratebeam.connectors.storage.search.queries import SCOPE_FIELD
from ratebeam.transforms.schema import (
    BEGIN,
    END,
    PRICE,
    PRICE_POLARS,
    QTY,
    QTY_POLARS,
    RULES,
    SCOPE,
    TIME_POLARS,
    TYPE,
    UNIT,
    groupby_column,
    metadata_column,
    usage_schema,
)

#: Bulk requests stay below both bounds (CloudKitty sends 5000 documents per request).
BULK_DOCS = 5000
BULK_BYTES = 8 * 1024 * 1024


def documents(frame: pl.DataFrame, ids: pl.Series, flavor: EngineFlavor) -> pl.Series:
    """One JSON document per row of ``rated_frame`` output, in row order."""
    fields = [pl.lit(None, dtype=pl.String).alias("description")] if flavor.description_field else []
    fields += [pl.col(QTY).cast(pl.Float64).alias("qty"), pl.col(PRICE).cast(pl.Float64).alias("price")]
    if RULES in frame.columns:
        fields.append(pl.col(RULES).cast(pl.String))
    document = point_object(frame.columns, ids, fields)
    return frame.select(document.alias("document")).to_series()


def bulk_requests(frame: pl.DataFrame, ids: pl.Series, flavor: EngineFlavor) -> Iterator[dict[str, str]]:
    r"""Per bulk request, ``{id: '{"index":{"_id":...}}\n<document>\n'}`` in row order."""
    docs = documents(frame, ids, flavor)
    lines = (
        pl.DataFrame({"id": ids, "doc": docs})
        .select(pl.concat_str([pl.lit('{"index":{"_id":"'), "id", pl.lit('"}}\n'), "doc", pl.lit("\n")]).alias("pair"))
        .to_series()
    )
    sizes = lines.str.len_bytes().to_list()
    pairs = lines.to_list()
    id_list = ids.to_list()
    start, size = 0, 0
    for i, length in enumerate(sizes):
        if i > start and (i - start >= BULK_DOCS or size + length > BULK_BYTES):
            yield dict(zip(id_list[start:i], pairs[start:i], strict=True))
            start, size = i, 0
        size += length
    if start < len(pairs):
        yield dict(zip(id_list[start:], pairs[start:], strict=True))


# -- reading --------------------------------------------------------------------------------------


def _instant(text: Any) -> datetime:
    return datetime.fromisoformat(str(text).replace("Z", "+00:00"))


def _cloudkitty_scope(source: dict[str, Any], scope_key: str | None) -> str:
    """The scope of a document CloudKitty wrote: its scope-key groupby label (``''`` if unknown)."""
    value = None if scope_key is None else (source.get("groupby") or {}).get(scope_key)
    return "" if value is None else str(value)


def points_table(sources: list[dict[str, Any]], scope_key: str | None = None) -> pa.Table:
    """The rated Arrow table of retrieved ``_source`` documents, in their order.

    Labels are read back as strings (CloudKitty may have stored numbers); a document without
    ``scope_id`` (written by CloudKitty) gets its ``groupby.<scope_key>``, else ``''``.  Floats
    become decimals of the batch scales.  The lineage (``RULES``) is a last column when any
    document has it.
    """
    groupby_keys = sorted({k for s in sources for k in (s.get("groupby") or {})})
    metadata_keys = sorted({k for s in sources for k in (s.get("metadata") or {})})

    def label(value: Any) -> str | None:
        return None if value is None else str(value)

    columns: dict[str, list[Any]] = {
        SCOPE: [s.get(SCOPE_FIELD) or _cloudkitty_scope(s, scope_key) for s in sources],
        TYPE: [s["type"] for s in sources],
        BEGIN: [_instant(s["start"]) for s in sources],
        END: [_instant(s["end"]) for s in sources],
        QTY: [s["qty"] for s in sources],
        PRICE: [s["price"] for s in sources],
        UNIT: [s.get("unit") or "" for s in sources],
    }
    for key in groupby_keys:
        columns[groupby_column(key)] = [label((s.get("groupby") or {}).get(key)) for s in sources]
    for key in metadata_keys:
        columns[metadata_column(key)] = [label((s.get("metadata") or {}).get(key)) for s in sources]
    frame = pl.DataFrame(columns, schema_overrides={QTY: pl.Float64, PRICE: pl.Float64})
    frame = frame.with_columns(
        pl.col(QTY).cast(QTY_POLARS),
        pl.col(PRICE).cast(PRICE_POLARS),
        pl.col(BEGIN, END).cast(TIME_POLARS),
        pl.col(SCOPE, TYPE, UNIT).cast(pl.String),
    )
    table = frame.to_arrow().cast(usage_schema(groupby_keys, metadata_keys))
    if any(RULES in s for s in sources):
        table = table.append_column(pa.field(RULES, pa.string()), pa.array([s.get(RULES) for s in sources],
                                                                            pa.string()))
    return table

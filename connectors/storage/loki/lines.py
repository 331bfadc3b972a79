"""Rated points ⇄ CloudKitty's Loki log lines (`cloudkitty/storage/v2/loki/client.py:212-370`), the write side vectorized in Polars.

One JSON line per point, CloudKitty 25's keys in its order (``cloudkitty/storage/v2/loki/client.py``
``add_point``) plus the point's scope and id::

    {"start":"2024-01-01T00:00:00+00:00","end":"2024-01-01T01:00:00+00:00","type":"instance",
     "unit":"instance","description":null,"qty":1,"price":0.5,"groupby":{"project_id":"p1",...},
     "metadata":{"flavor_id":"42",...},"scope_id":"p1","point_id":"<32 hex>"}

``qty``/``price`` are the exact decimals as JSON numbers (no exponent, trailing zeros dropped:
CloudKitty reads them as floats, ratebeam as ``Decimal``).  The stream is CloudKitty's — the
configured labels plus ``project_id`` (the groupby label, absent when the point has none) — plus
``scope_id``, so a scope filter or delete selects a stream.  Each value also carries the structured
metadata CloudKitty 25 indexes (``type``, ``unit``, ``flavor_name``, ``user`` when not empty).

The timestamp is deterministic: period begin + (the point id's first 60 bits modulo
min(period, 1 s)) nanoseconds.  A rewrite of the same point sends the same stream, timestamp and
line, which Loki de-duplicates; distinct points of one period get distinct timestamps (almost
always), so a ``query_range`` page boundary never falls inside a run of more than ``limit`` entries
sharing one timestamp, and every timestamp stays inside the point's period.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import polars as pl

from ratebeam.connectors.storage.json_lines import ID_KEY, SCOPE_KEY, json_string, point_object
from ratebeam.transforms.schema import (
    BEGIN,
    END,
    PRICE,
    PRICE_POLARS,
    QTY,
    QTY_POLARS,
    SCOPE,
    TIME_POLARS,
    TYPE,
    UNIT,
    groupby_column,
    metadata_column,
)

#: CloudKitty 25's ``LokiClient.INDEXED_FIELDS``: structured metadata of every value.
STRUCTURED = ("type", "unit", "flavor_name", "user")
_SECOND_NS = 1_000_000_000


def _number(column: str) -> pl.Expr:
    """The exact decimal as JSON number text: plain notation, no trailing fractional zeros."""
    text = pl.col(column).cast(pl.String)
    return text.str.replace(r"(\.\d*?)0+$", "${1}").str.strip_suffix(".")


def timestamps(frame: pl.DataFrame, ids: pl.Series) -> pl.Series:
    """Each point's entry timestamp in nanoseconds (see the module docstring)."""
    span = (pl.col(END) - pl.col(BEGIN)).dt.total_nanoseconds()
    bound = pl.min_horizontal(span, pl.lit(_SECOND_NS, pl.Int64))
    offset = pl.lit(ids).str.slice(0, 15).str.to_integer(base=16) % bound
    return frame.select((pl.col(BEGIN).dt.epoch("ns") + offset).alias("ts")).to_series()


def _structured(frame: pl.DataFrame) -> pl.Expr:
    """``{"type":...,"unit":...}``: CloudKitty's structured metadata, empty values left out."""
    sources = {"type": pl.col(TYPE), "unit": pl.col(UNIT)}
    fragments = []
    for key in STRUCTURED:
        value = sources.get(key)
        if value is None:
            if groupby_column(key) not in frame.columns:
                continue
            value = pl.col(groupby_column(key))
        fragments.append(
            pl.when(value.is_not_null() & (value != "")).then(pl.lit(f'"{key}":') + json_string(value))
        )
    return pl.lit("{") + pl.concat_str(fragments, separator=",", ignore_nulls=True) + pl.lit("}")


def _stream(frame: pl.DataFrame, stream: dict[str, str]) -> pl.Expr:
    """The stream's labels as a JSON object: configured labels, ``project_id``, ``scope_id``."""
    fixed = json.dumps(stream, ensure_ascii=False, separators=(",", ":"))[:-1]
    parts = [pl.lit(fixed)]
    project = groupby_column("project_id")
    if project in frame.columns:
        parts.append(pl.when(pl.col(project).is_not_null()).then(pl.lit(',"project_id":') + json_string(pl.col(project))))
    parts.append(pl.lit(f',"{SCOPE_KEY}":') + json_string(pl.col(SCOPE)) + pl.lit("}"))
    return pl.concat_str(parts, ignore_nulls=True)


def entries(frame: pl.DataFrame, ids: pl.Series, stream: dict[str, str]) -> pl.DataFrame:
    """``stream`` (labels JSON), ``ts``, ``line`` and ``value`` (the push API's ``[ts, line, metadata]``)."""
    numbers = [pl.lit(',"qty":'), _number(QTY), pl.lit(',"price":'), _number(PRICE)]
    line = point_object(frame.columns, ids, [pl.lit(None, dtype=pl.String).alias("description")], numbers)
    ts = timestamps(frame, ids)
    value = pl.concat_str(
        [pl.lit('["'), pl.lit(ts).cast(pl.String), pl.lit('",'), json_string(line), pl.lit(","), _structured(frame), pl.lit("]")]
    )
    return frame.select(
        _stream(frame, stream).alias("stream"), pl.lit(ts).alias("ts"), line.alias("line"), value.alias("value")
    )


def push_bodies(rows: pl.DataFrame, max_lines: int, max_bytes: int) -> Iterator[tuple[int, bytes]]:
    """``(entries, JSON body)`` of each push: ``{"streams":[{"stream":..,"values":[..]},..]}``.

    Entries are sorted by stream then timestamp; a body holds at most ``max_lines`` entries and,
    unless one entry alone is larger, at most ``max_bytes`` bytes.
    """
    ordered = rows.sort("stream", "ts")
    streams = ordered["stream"].to_list()
    values = ordered["value"].to_list()
    sizes = ordered.select(pl.col("value").str.len_bytes() + 1).to_series().to_list()
    start, size = 0, 0
    for i, length in enumerate(sizes + [0]):
        last = i == len(values)
        if i > start and (last or i - start >= max_lines or size + length > max_bytes):
            yield i - start, _body(streams[start:i], values[start:i])
            start, size = i, 0
        size += length


def _body(streams: list[str], values: list[str]) -> bytes:
    parts, first = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or streams[i] != streams[first]:
            parts.append(f'{{"stream":{streams[first]},"values":[{",".join(values[first:i])}]}}')
            first = i
    return ('{"streams":[' + ",".join(parts) + "]}").encode()


# -- reading --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One log entry read back: its stream's labels, timestamp (ns) and line."""

    stream: tuple[tuple[str, str], ...]
    ts: int
    line: str


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def _label(value: Any) -> str | None:
    return None if value is None else str(value)


def points_frame(entries: list[Entry]) -> pl.DataFrame:
    """The points of ``entries`` as a rated frame (exact decimals), plus ``point_id``/``line``/``ts``.

    A line written by CloudKitty has no ``scope_id`` (``''``) nor ``point_id`` (null).
    """
    docs = [json.loads(e.line, parse_float=Decimal, parse_int=Decimal) for e in entries]
    groupby_keys = sorted({k for d in docs for k in (d.get("groupby") or {})})
    metadata_keys = sorted({k for d in docs for k in (d.get("metadata") or {})})
    columns: dict[str, Any] = {
        SCOPE: pl.Series([d.get(SCOPE_KEY) or "" for d in docs], dtype=pl.String),
        TYPE: pl.Series([d["type"] for d in docs], dtype=pl.String),
        BEGIN: pl.Series([_instant(d["start"]) for d in docs], dtype=TIME_POLARS),
        END: pl.Series([_instant(d["end"]) for d in docs], dtype=TIME_POLARS),
        QTY: pl.Series([Decimal(d["qty"]) for d in docs], dtype=QTY_POLARS),
        PRICE: pl.Series([Decimal(d["price"]) for d in docs], dtype=PRICE_POLARS),
        UNIT: pl.Series([d.get("unit") or "" for d in docs], dtype=pl.String),
    }
    for key in groupby_keys:
        columns[groupby_column(key)] = pl.Series([_label((d.get("groupby") or {}).get(key)) for d in docs], dtype=pl.String)
    for key in metadata_keys:
        columns[metadata_column(key)] = pl.Series([_label((d.get("metadata") or {}).get(key)) for d in docs], dtype=pl.String)
    columns[ID_KEY] = pl.Series([d.get(ID_KEY) for d in docs], dtype=pl.String)
    columns["__line"] = pl.Series([e.line for e in entries], dtype=pl.String)
    columns["__ts"] = pl.Series([e.ts for e in entries], dtype=pl.Int64)
    return pl.DataFrame(columns)

"""The Parquet storage's Arrow and Polars work: canonical batch types, slices, encoding, chunks.

Split from ``backend.py`` (which keeps the file system and query logic) so each module has one job:
here nothing touches a file system, everything is a pure function of tables.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.storage.parquet.layout import StoredFile
from ratebeam.connectors.storage.rated_frames import require_periods
from ratebeam.transforms.frames import concat_tables, to_frame
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
    usage_schema,
)

#: Slices at least this long are dictionary-encoded and compressed (repeated scope, type and labels
#: shrink a lot); below it the per-file cost of dictionary pages and codecs outweighs the saving.
_LARGE_SLICE_ROWS = 1024
SLICE_KEYS = (TYPE, SCOPE, BEGIN)
_CORE_TYPES = {f.name: f.type for f in usage_schema((), ())}


class Chunk:
    """Files read together: their tables, and all their rows as one Polars frame.

    Files with the same columns are concatenated first (unifying a schema per file is slow), so in
    ``frame`` the rows of file ``i`` are ``starts[i]`` to ``starts[i] + sizes[i]``, not in file order.
    """

    def __init__(self, files: list[StoredFile], tables: list[pa.Table]) -> None:
        self.files = files
        self.tables = tables
        same: dict[tuple[str, ...], list[int]] = {}
        for i, table in enumerate(tables):
            same.setdefault(tuple(table.column_names), []).append(i)
        layout = np.array([i for group in same.values() for i in group])
        self.sizes = np.array([t.num_rows for t in tables])
        self.starts = np.empty(len(tables), dtype=np.int64)
        self.starts[layout] = np.cumsum(self.sizes[layout]) - self.sizes[layout]
        self._owner = np.repeat(layout, self.sizes[layout])  # file of each frame row
        parts = [concat_tables([tables[i] for i in group]) for group in same.values()]
        union = parts[0] if len(parts) == 1 else concat_tables(parts)
        self.frame = to_frame(union.combine_chunks())

    def rows(self, first: int, last: int) -> np.ndarray:
        """Frame row numbers of files ``first`` to ``last`` (included), in file order."""
        return np.concatenate(
            [np.arange(self.starts[i], self.starts[i] + self.sizes[i]) for i in range(first, last + 1)]
        )

    def mask(self, predicate: pl.Expr) -> np.ndarray:
        """``predicate`` on every frame row, as booleans (a literal is broadcast)."""
        return self.frame.with_columns(predicate.alias("__mask"))["__mask"].to_numpy()

    def hits(self, mask: np.ndarray) -> np.ndarray:
        """How many rows of each file ``mask`` selects."""
        return np.bincount(self._owner, weights=mask, minlength=len(self.files)).astype(np.int64)


def is_label(name: str) -> bool:
    """Whether column ``name`` is a ``groupby`` or ``metadata`` label."""
    return name.startswith((GROUPBY_PREFIX, METADATA_PREFIX))


def canonical(table: pa.Table, backend: str = "parquet") -> pa.Table:
    """``table`` with the batch types (core columns, string labels), or a clear error.

    Other columns (e.g. ``point_id``) are kept as they are; ``backend`` names the backend in errors.
    """
    missing = [c for c in CORE_COLUMNS if c not in table.column_names]
    if missing:
        raise FatalConnectorError(f"{backend} storage: rated batch lacks column(s) {', '.join(missing)}")
    columns = []
    for name, column in zip(table.column_names, table.columns, strict=True):
        target = _CORE_TYPES.get(name) or (pa.string() if is_label(name) else column.type)
        kind = column.type
        if name in (QTY, PRICE) and not (pa.types.is_decimal(kind) or pa.types.is_integer(kind)):
            raise FatalConnectorError(f"{backend} storage: column {name!r} is {kind}, not an exact decimal")
        if name in (BEGIN, END) and not (pa.types.is_timestamp(kind) and kind.tz):
            raise FatalConnectorError(f"{backend} storage: column {name!r} is {kind}, not an aware timestamp")
        if kind != target:
            try:
                column = column.cast(target)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
                raise FatalConnectorError(
                    f"{backend} storage: column {name!r} ({kind}) -> {target}: {exc}"
                ) from exc
        if name in _CORE_TYPES and column.null_count:
            raise FatalConnectorError(
                f"{backend} storage: column {name!r} has {column.null_count} null value(s)"
            )
        columns.append(column)
    out = pa.table(columns, names=table.column_names)
    require_periods(out, backend)
    return out


def split_slices(table: pa.Table) -> Iterator[tuple[tuple[str, str, datetime], pa.Table]]:
    """The (type, scope, begin) slices of ``table``: zero-copy when each slice is contiguous."""
    keys = table.select(SLICE_KEYS)
    starts = run_starts(keys)
    firsts = keys.take(starts)
    if firsts.group_by(list(SLICE_KEYS)).aggregate([]).num_rows != len(starts):  # interleaved slices
        table = table.take(pc.sort_indices(keys, sort_keys=[(k, "ascending") for k in SLICE_KEYS]))
        keys = table.select(SLICE_KEYS)
        starts = run_starts(keys)
        firsts = keys.take(starts)
    ends = [*starts[1:].tolist(), table.num_rows]
    with_nulls = [
        n for n, c in zip(table.column_names, table.columns, strict=True) if is_label(n) and c.null_count
    ]
    for row, start, stop in zip(firsts.to_pylist(), starts.tolist(), ends, strict=True):
        part = table.slice(start, stop - start)
        yield (row[TYPE], row[SCOPE], row[BEGIN]), without_absent_labels(part, with_nulls)


def without_absent_labels(table: pa.Table, candidates: list[str] | None = None) -> pa.Table:
    """``table`` without the label columns (among ``candidates``) that are null on every row.

    Such a column says no point has the key; leaving it out of the file means the same and keeps
    files of a type to the keys they use.
    """
    if candidates is None:
        candidates = [name for name in table.column_names if is_label(name)]
    absent = [name for name in candidates if table[name].null_count == table.num_rows]
    return table.drop_columns(absent) if absent else table


def run_starts(keys: pa.Table) -> np.ndarray:
    """Row numbers where any key differs from the previous row (row 0 included)."""
    n = keys.num_rows
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for column in keys.columns:
        differs = pc.not_equal(column.slice(1), column.slice(0, n - 1))
        change[1:] |= differs.to_numpy()
    return np.flatnonzero(change)


def encode(table: pa.Table) -> bytes:
    """One Parquet file (no statistics: files are always read whole)."""
    large = table.num_rows >= _LARGE_SLICE_ROWS
    sink = pa.BufferOutputStream()
    pq.write_table(
        table,
        sink,
        compression="snappy" if large else "none",
        use_dictionary=large,
        write_statistics=False,
        store_schema=False,
    )
    return sink.getvalue().to_pybytes()


def aggregate(frame: pl.LazyFrame, groups: list[pl.Expr], sums: list[pl.Expr]) -> pl.LazyFrame:
    """``sums`` per group, or over the whole frame without groups (one row, ``n`` may be 0)."""
    return frame.group_by(groups).agg(sums) if groups else frame.select(sums)


def points_table(pages: list[pl.DataFrame]) -> pa.Table:
    """The retrieved page as a rated table: core columns, then the labels present, sorted."""
    if not pages:
        return usage_schema((), ()).empty_table()
    frame = pl.concat(pages, how="diagonal_relaxed")
    present = [c for c in frame.columns if not is_label(c) or frame[c].null_count() < frame.height]
    labels = sorted(c for c in present if c.startswith(GROUPBY_PREFIX))
    labels += sorted(c for c in present if c.startswith(METADATA_PREFIX))
    others = [c for c in present if c not in CORE_COLUMNS and not is_label(c)]
    return canonical(frame.select([*CORE_COLUMNS, *labels, *others]).to_arrow())

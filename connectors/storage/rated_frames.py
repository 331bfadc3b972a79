"""What every storage backend checks of a rated batch before storing it, in one place.

A batch that reaches a backend without its core columns, with naive timestamps or null core values
is a programming error upstream; refusing it loudly (a fatal error naming the column) beats storing
points that cannot be read back.  Periods are built by ratebeam, so a point whose period ends
before it begins is such an error too.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.transforms.frames import to_frame
from ratebeam.transforms.schema import (
    BEGIN,
    CORE_COLUMNS,
    END,
    GROUPBY_PREFIX,
    METADATA_PREFIX,
)


def rated_frame(rated: pa.Table | pa.RecordBatch, name: str) -> pl.DataFrame:
    """The rated batch as Polars with string labels, or a clear error naming what is wrong."""
    if isinstance(rated, pa.RecordBatch):
        rated = pa.Table.from_batches([rated])
    missing = [c for c in CORE_COLUMNS if c not in rated.column_names]
    if missing:
        raise FatalConnectorError(f"{name} storage: rated batch lacks column(s) {', '.join(missing)}")
    frame = to_frame(rated)
    for column in (BEGIN, END):
        dtype = frame.schema[column]
        if not isinstance(dtype, pl.Datetime) or dtype.time_zone is None:
            raise FatalConnectorError(f"{name} storage: column {column!r} is {dtype}, not an aware timestamp")
    for column in CORE_COLUMNS:
        if frame[column].null_count():
            raise FatalConnectorError(f"{name} storage: column {column!r} has null value(s)")
    require_periods(rated, name)
    labels = [c for c in frame.columns if c.startswith((GROUPBY_PREFIX, METADATA_PREFIX))]
    return frame.with_columns(pl.col(labels).cast(pl.String), pl.col(BEGIN, END).dt.convert_time_zone("UTC"))


def require_periods(table: pa.Table, name: str) -> None:
    """Refuse a batch holding a point whose period ``end`` is not after its ``begin``.

    Such a point would be invisible to ``retrieve`` and break the one-slice-per-period rewrite.
    ``table``'s ``begin``/``end`` are aware timestamps without nulls (any units).
    """
    if table.num_rows and pc.any(pc.less_equal(table[END], table[BEGIN])).as_py():
        raise FatalConnectorError(f"{name} storage: a point's period end is not after its begin")

"""Rated points in CloudKitty's dataframe shape (``/v2/dataframes``, `cloudkitty/api/v2/dataframes/dataframes.py:51-113`).

Points are regrouped per period; each keeps its groupby and metadata dicts, with absent labels
left out and quantities and prices as exact decimals (JSON writers render them as strings).
"""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa

from ratebeam.transforms.schema import BEGIN, END, GROUPBY_PREFIX, METADATA_PREFIX, PRICE, QTY, TYPE, UNIT


def to_cloudkitty_dataframes(points: pa.Table) -> list[dict[str, Any]]:
    """``[{"period": {"begin", "end"}, "usage": {type: [point dicts]}}]`` ordered by period."""
    frame = pl.from_arrow(points)
    if not isinstance(frame, pl.DataFrame) or frame.is_empty():
        return []
    groupby = [c for c in frame.columns if c.startswith(GROUPBY_PREFIX)]
    metadata = [c for c in frame.columns if c.startswith(METADATA_PREFIX)]
    frames: dict[tuple, dict[str, Any]] = {}
    for row in frame.iter_rows(named=True):
        key = (row[BEGIN], row[END])
        entry = frames.setdefault(key, {"period": {"begin": row[BEGIN], "end": row[END]}, "usage": {}})
        entry["usage"].setdefault(row[TYPE], []).append({
            "vol": {"unit": row[UNIT], "qty": row[QTY]},
            "rating": {"price": row[PRICE]},
            "groupby": {c[len(GROUPBY_PREFIX):]: row[c] for c in groupby if row[c] is not None},
            "metadata": {c[len(METADATA_PREFIX):]: row[c] for c in metadata if row[c] is not None},
        })
    return [frames[k] for k in sorted(frames)]

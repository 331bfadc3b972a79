"""Frames (scope × period) travelling inside Arrow batches, and their re-batching for rating.

A *frame* is CloudKitty's unit of work and of failure: all metrics of one scope for one period.
Every batch carries the list of frames it covers in its schema metadata (the *manifest*), so a
frame with no points still travels (as a 0-row batch) and the writer can acknowledge exactly the
frames it stored.  Frames are never split across batches: the state commit relies on it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

import polars as pl
import pyarrow as pa

from ratebeam.transforms import schema

MANIFEST_KEY = b"ratebeam.frames"
#: The stages a frame can fail at (``FrameOutcome.stage``).
COLLECT_STAGE, CONVERT_STAGE, RATE_STAGE, WRITE_STAGE = "collect", "convert", "rate", "write"


@dataclass(frozen=True, order=True, slots=True)
class Frame:
    """One scope and one period begin: the unit CloudKitty rates, fails and commits."""

    scope_id: str
    begin: datetime

    def to_json(self) -> list[str]:
        """``[scope_id, begin in ISO 8601]``, as the batch manifest stores it."""
        return [self.scope_id, self.begin.isoformat()]

    @staticmethod
    def from_json(item: list[str]) -> Frame:
        """The frame of a ``to_json`` value."""
        return Frame(item[0], datetime.fromisoformat(item[1]))


def with_manifest(batch: pa.RecordBatch, frames: Iterable[Frame]) -> pa.RecordBatch:
    """Attach the frames a batch covers (including frames that contributed no rows)."""
    meta = dict(batch.schema.metadata or {})
    meta[MANIFEST_KEY] = json.dumps([f.to_json() for f in sorted(set(frames))]).encode()
    return batch.replace_schema_metadata(meta)


def manifest(batch: pa.RecordBatch) -> list[Frame]:
    """The frames a batch covers, as attached by ``with_manifest``."""
    raw = (batch.schema.metadata or {}).get(MANIFEST_KEY)
    return [] if raw is None else [Frame.from_json(x) for x in json.loads(raw)]


def empty_usage_batch() -> pa.RecordBatch:
    """A 0-row batch with the core usage columns: a frame with no data still needs a carrier."""
    return pa.RecordBatch.from_pylist([], schema=schema.usage_schema((), ()))


def to_frame(data: pa.RecordBatch | pa.Table) -> pl.DataFrame:
    """``pl.from_arrow`` typed for what it returns for a batch or a table (a Series is for arrays)."""
    frame = pl.from_arrow(data)
    assert isinstance(frame, pl.DataFrame)
    return frame


def concat_batches(batches: list[pa.RecordBatch]) -> pa.Table | None:
    """The rows of ``batches`` as one table (None when they have none), in order.

    Columns are unified by name (a label absent from a batch is null there) and the batches'
    manifests dropped.  Concatenated in Arrow, then converted once: per-batch conversions to Polars
    cost ~0.5 ms each, which for frames of a few hundred points was more than rating them.
    """
    tables = [pa.Table.from_batches([b]).replace_schema_metadata(None) for b in batches if b.num_rows]
    if not tables:
        return None
    return tables[0] if len(tables) == 1 else concat_tables(tables).combine_chunks()


def concat_tables(tables: list[pa.Table]) -> pa.Table:
    """Concatenate, unifying columns (by name) and types only when the fast path refuses."""
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid:
        return pa.concat_tables(tables, promote_options="permissive")


def concat_frames(batches: list[pa.RecordBatch]) -> pl.DataFrame:
    """Concatenate batches whose label columns differ (absent labels become null)."""
    table = concat_batches(batches)
    return pl.DataFrame(schema=schema.polars_core_schema()) if table is None else to_frame(table)


def split_frames(batch: pa.RecordBatch, rows: int) -> list[pa.RecordBatch]:
    """``batch`` (whole frames, with its manifest) cut into batches of whole frames of about ``rows`` rows.

    A batch up to ``rows`` rows, or of one frame, is returned as it is.  Otherwise its rows are put
    in frame order (by begin, then scope; stable, so a frame keeps its rows' order) and cut between
    frames once a part holds ``rows`` rows; each part's manifest lists its frames, frames without
    rows included.  Why: a collector answering many periods at once must not make the batches
    after it larger than ``rebatch_rows`` says.
    """
    frames = sorted(manifest(batch), key=lambda f: (f.begin, f.scope_id))
    if batch.num_rows <= rows or len(frames) < 2:
        return [batch]
    # In Polars, which sorts and slices string views (Arrow's sort and take do not); the parts keep
    # the batch's metadata (its numeric context) and Polars' string views.
    rows_in_order = to_frame(batch).sort(schema.BEGIN, schema.SCOPE, maintain_order=True)
    counts = {Frame(scope, begin): count
              for scope, begin, count in rows_in_order.group_by(schema.SCOPE, schema.BEGIN).len().iter_rows()}
    parts: list[pa.RecordBatch] = []
    ours: list[Frame] = []
    first, held = 0, 0

    def cut() -> None:
        part = to_batch(rows_in_order.slice(first, held), ours, views=True)
        metadata = dict(batch.schema.metadata or {}) | dict(part.schema.metadata or {})
        parts.append(part.replace_schema_metadata(metadata))

    for frame in frames:
        count = counts.get(frame, 0)
        if held >= rows and count:  # full: this frame starts the next part (frames without rows stay)
            cut()
            first, held, ours = first + held, 0, []
        ours.append(frame)
        held += count
    cut()
    return parts


def to_batch(frame: pl.DataFrame, frames: Iterable[Frame], *, views: bool = False) -> pa.RecordBatch:
    """A Polars frame back to one Arrow batch with its manifest.

    ``views``: keep Polars' own string layout (Arrow string views: zero-copy both ways), for a batch
    that the next transform reads back into Polars; a batch for the writers has plain strings
    (copied, ~10 ms per 250k points), which every client library reads.
    """
    table = frame.to_arrow(compat_level=pl.CompatLevel.newest() if views else pl.CompatLevel.oldest())
    batch = table.combine_chunks().to_batches()
    out = batch[0] if batch else pa.RecordBatch.from_pylist([], schema=table.schema)
    return with_manifest(out, frames)


@dataclass(frozen=True, slots=True)
class FrameOutcome:
    """What happened to one frame at one stage: the one outcome type every stage emits.

    ``ok`` outcomes come only from the writer, after every backend acknowledged the frame, with the
    number of ``points`` it wrote (0 for a frame without data); a failure can come from any stage
    (``collect``, ``convert``, ``rate``, ``write``) and is the pipeline's dead letter.  ``end`` is set by the
    rating kernel, whose frames are CloudKitty's (scope, begin, end); within a run every period of a
    begin has the same end, so the pipeline keys frames by (scope, begin) alone.
    """

    scope_id: str
    begin: datetime
    ok: bool
    stage: str = ""
    reason: str = ""
    points: int = 0
    end: datetime | None = None
    #: ``(metric type, points written)`` of an ok outcome, types without points absent (a detail of
    #: ``points``: not compared, so an outcome equals the outcome of the same frame and count).
    types: tuple[tuple[str, int], ...] = field(default=(), compare=False)

    @property
    def frame(self) -> Frame:
        """The frame this outcome is about."""
        return Frame(self.scope_id, self.begin)


def points_per_frame(rows: pa.Table | pa.RecordBatch) -> dict[Frame, dict[str, int]]:
    """How many of ``rows`` each frame has per metric type (frames and types without rows are absent)."""
    if not rows.num_rows:
        return {}
    keys = (schema.SCOPE, schema.BEGIN, schema.TYPE)
    counts = to_frame(rows.select(list(keys))).group_by(keys).len()  # Polars: a third faster than Arrow's
    out: dict[Frame, dict[str, int]] = {}
    for scope, begin, type_, count in counts.iter_rows():
        out.setdefault(Frame(scope, begin), {})[type_] = count
    return out

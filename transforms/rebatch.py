"""Re-batching inside a fused stage: a bundle's small frame batches handed on together.

Why: a frame is often 10–1,000 points and Polars has a fixed cost per call (a few ms for a
conversion or a rating pass), so working frame by frame wastes it; concatenating the batches of a
bundle (inside the fused stage, never through a shuffle) into ``rebatch_rows`` rows makes the work
vectorized.  Frames are never split: each buffered batch is whole frames, so the output's manifest
lists whole frames.
"""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
import pyarrow as pa
from apache_beam.transforms.window import BoundedWindow
from apache_beam.utils.windowed_value import WindowedValue


class RebatchingFn(beam.DoFn):
    """Buffers frame batches up to ``rebatch_rows`` rows, then ``flush``es them (and at bundle end).

    Buffers are kept per window, so batches of two ticks of a streaming job (one window each) are
    never mixed, and what is flushed at bundle end goes back to its own window.  ``flush`` is told
    the window (the tick) its batches belong to.
    """

    def __init__(self, rebatch_rows: int) -> None:
        self._rebatch_rows = rebatch_rows

    def flush(self, batches: list[pa.RecordBatch], window: BoundedWindow) -> Iterator:
        """The outputs (main or ``TaggedOutput``) of one group of buffered batches of ``window``."""
        raise NotImplementedError

    def start_bundle(self) -> None:
        """Start with empty buffers, one per window (a streaming tick is a window)."""
        self._buffers: dict[BoundedWindow, list[pa.RecordBatch]] = {}
        self._rows: dict[BoundedWindow, int] = {}

    def process(self, batch: pa.RecordBatch, window: BoundedWindow = beam.DoFn.WindowParam) -> Iterator:  # type: ignore[assignment]  # Beam's parameter marker
        """Buffer ``batch`` in its window's buffer; flush that buffer once it holds ``rebatch_rows`` rows."""
        self._buffers.setdefault(window, []).append(batch)
        self._rows[window] = self._rows.get(window, 0) + batch.num_rows
        if self._rows[window] >= self._rebatch_rows:
            yield from self._take(window)

    def finish_bundle(self) -> Iterator[WindowedValue | beam.pvalue.TaggedOutput]:
        """Flush what is left of each window, in that window (``finish_bundle`` outputs need one)."""
        for window in list(self._buffers):
            for out in self._take(window):
                if isinstance(out, beam.pvalue.TaggedOutput):
                    yield beam.pvalue.TaggedOutput(
                        out.tag, WindowedValue(out.value, window.max_timestamp(), (window,)))
                else:
                    yield WindowedValue(out, window.max_timestamp(), (window,))

    def _take(self, window: BoundedWindow) -> Iterator:
        """Flush ``window``'s buffer (nothing when it is empty)."""
        batches = self._buffers.pop(window, [])
        self._rows.pop(window, None)
        if batches:
            yield from self.flush(batches, window)

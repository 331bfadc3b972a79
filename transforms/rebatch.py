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
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue


class RebatchingFn(beam.DoFn):
    """Buffers frame batches up to ``rebatch_rows`` rows, then ``flush``es them (and at bundle end)."""

    def __init__(self, rebatch_rows: int) -> None:
        self._rebatch_rows = rebatch_rows

    def flush(self, batches: list[pa.RecordBatch]) -> Iterator:
        """The outputs (main or ``TaggedOutput``) of one group of buffered batches."""
        raise NotImplementedError

    def start_bundle(self) -> None:
        """Start with an empty buffer."""
        self._buffer: list[pa.RecordBatch] = []
        self._rows = 0

    def process(self, batch: pa.RecordBatch) -> Iterator:
        """Buffer ``batch``; flush the buffer once it holds ``rebatch_rows`` rows."""
        self._buffer.append(batch)
        self._rows += batch.num_rows
        if self._rows >= self._rebatch_rows:
            yield from self._take()

    def finish_bundle(self) -> Iterator[WindowedValue | beam.pvalue.TaggedOutput]:
        """Flush what is left, in the global window (``finish_bundle`` outputs need a window)."""
        for out in self._take():
            if isinstance(out, beam.pvalue.TaggedOutput):
                yield beam.pvalue.TaggedOutput(out.tag, WindowedValue(out.value, MIN_TIMESTAMP, (GlobalWindow(),)))
            else:
                yield WindowedValue(out, MIN_TIMESTAMP, (GlobalWindow(),))

    def _take(self) -> Iterator:
        if not self._buffer:
            return
        batches, self._buffer, self._rows = self._buffer, [], 0
        yield from self.flush(batches)

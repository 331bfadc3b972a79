"""Re-batching inside a fused stage: a bundle's small frame batches handed on together.

Why: a frame is often 10–1,000 points and Polars has a fixed cost per call (a few ms for a
conversion or a rating pass), so working frame by frame wastes it; concatenating the batches of a
bundle (inside the fused stage, never through a shuffle) into ``rebatch_rows`` rows makes the work
vectorized.  Frames are never split: each buffered batch is whole frames, so the output's manifest
lists whole frames.  The collect stage buffers its work items the same way (``weight`` 1 per
frame), to collect many periods of a scope in one call.  What a ``flush`` counted (``tallies``)
is emitted after its outputs, in its window.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

import apache_beam as beam
import pyarrow as pa
from apache_beam.transforms.window import BoundedWindow
from apache_beam.utils.windowed_value import WindowedValue

from ratebeam.transforms.tallies import Tallies

E = TypeVar("E")


class BufferingFn(beam.DoFn, Generic[E]):
    """Buffers elements until they weigh ``limit`` (``weight``), then ``flush``es them (and at bundle end).

    Buffers are kept per window, so elements of two ticks of a streaming job (one window each) are
    never mixed, and what is flushed at bundle end goes back to its own window.  ``flush`` is told
    the window (the tick) its elements belong to.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._tallies = Tallies()

    def weight(self, element: E) -> int:
        """How much ``element`` fills a buffer."""
        raise NotImplementedError

    def flush(self, elements: list[E], window: BoundedWindow) -> Iterator:
        """The outputs (main or ``TaggedOutput``) of one group of buffered elements of ``window``."""
        raise NotImplementedError

    def start_bundle(self) -> None:
        """Start with empty buffers, one per window (a streaming tick is a window)."""
        self._buffers: dict[BoundedWindow, list[E]] = {}
        self._weights: dict[BoundedWindow, int] = {}

    def process(self, element: E, window: BoundedWindow = beam.DoFn.WindowParam) -> Iterator:  # type: ignore[assignment]  # Beam's parameter marker
        """Buffer ``element`` in its window's buffer; flush that buffer once it weighs ``limit``."""
        self._buffers.setdefault(window, []).append(element)
        self._weights[window] = self._weights.get(window, 0) + self.weight(element)
        if self._weights[window] >= self._limit:
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
        """Flush ``window``'s buffer (nothing when it is empty), then what the flush counted."""
        elements = self._buffers.pop(window, [])
        self._weights.pop(window, None)
        if elements:
            yield from self.flush(elements, window)
            yield from self._tallies.drain()


class RebatchingFn(BufferingFn[pa.RecordBatch]):
    """Buffers frame batches up to ``rebatch_rows`` rows, then ``flush``es them together."""

    def weight(self, element: pa.RecordBatch) -> int:
        """A batch weighs its rows."""
        return element.num_rows

"""``WriteToStorage``: rated batches into every configured backend, acknowledged per frame.

Delivery guarantee: effectively-once per (scope, period, type).  Each backend write replaces the
slices it receives (see ``StorageBackend.write``), so a retried or re-run write stores the same
rows once.  A frame is acknowledged (``FrameOutcome(ok=True)``) only after every backend returned
from ``write``; the state commit downstream advances only over acknowledged frames.  Retriable
errors are retried with exponential backoff a bounded number of times, then the batch's frames
fail (and are retried by the next run).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics

from ratebeam.connectors.errors import RetriableConnectorError
from ratebeam.connectors.registry import make_backend
from ratebeam.connectors.storage.base import StorageBackend
from ratebeam.failpoints import failpoint
from ratebeam.transforms.frames import WRITE_STAGE, FrameOutcome, manifest, points_per_frame

LOG = logging.getLogger(__name__)


def write_with_retries(backend: StorageBackend, table: pa.Table, attempts: int = 4, base_delay: float = 0.5) -> int:
    """One backend write, retried with exponential backoff on ``RetriableConnectorError`` only."""
    for attempt in range(1, attempts + 1):
        try:
            return backend.write(table)
        except RetriableConnectorError as exc:
            if attempt == attempts:
                raise
            delay = base_delay * 2 ** (attempt - 1)
            LOG.warning("%s write failed (%s); retry %d/%d in %.1fs", backend.capabilities.name, exc,
                        attempt, attempts - 1, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


class _WriteFn(beam.DoFn):
    def __init__(self, storage_configs: tuple[Any, ...]) -> None:
        self._configs = storage_configs
        self._written = Metrics.counter("ratebeam", "points_written")
        self._failed = Metrics.counter("ratebeam", "frames_failed_write")

    def setup(self) -> None:
        self._backends = [make_backend(c) for c in self._configs]
        for backend in self._backends:
            backend.init()

    def process(self, batch: pa.RecordBatch):
        frames = manifest(batch)
        table = pa.Table.from_batches([batch])
        try:
            if batch.num_rows:
                for backend in self._backends:
                    failpoint("write")
                    write_with_retries(backend, table)
        except Exception as exc:  # the frames fail, the run goes on
            reason = f"write: {type(exc).__name__}: {exc}"
            LOG.warning("%d frame(s) not written: %s", len(frames), reason)
            self._failed.inc(len(frames))
            for f in frames:
                yield FrameOutcome(f.scope_id, f.begin, False, WRITE_STAGE, reason)
            return
        self._written.inc(batch.num_rows)
        points = points_per_frame(batch)
        for f in frames:
            yield FrameOutcome(f.scope_id, f.begin, True, points=points.get(f, 0))

    def teardown(self) -> None:
        for backend in getattr(self, "_backends", []):
            backend.close()


class WriteToStorage(beam.PTransform):
    """Rated batches → ``FrameOutcome`` acknowledgements (with the points written), one per frame."""

    def __init__(self, storage_configs: tuple[Any, ...]) -> None:
        super().__init__()
        self._configs = tuple(storage_configs)

    def expand(self, rated):
        return rated | beam.ParDo(_WriteFn(self._configs))

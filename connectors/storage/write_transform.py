"""``WriteToStorage``: rated batches into every configured backend, acknowledged per frame.

Delivery guarantee: effectively-once per (scope, period, type).  Each backend write replaces the
slices it receives (see ``StorageBackend.write``), so a retried or re-run write stores the same
rows once.  A frame is acknowledged (``FrameOutcome(ok=True)``) only after every backend returned
from ``write``; the state commit downstream advances only over acknowledged frames.

Failures (``connectors.errors`` decides): nothing is retried here — the HTTP layer already did.  A
batch refused for its data (``SkippableConnectorError``) is written again frame by frame, so only
the frames a backend refuses fail and the other scopes re-batched with them are stored; a
``RetriableConnectorError`` fails the batch's frames (the next run writes them); a
``FatalConnectorError`` stops the run.  Backends are built in ``setup`` but reach their servers
(``init``) on the first write, so a server that is down fails frames instead of the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics

from ratebeam.connectors.errors import ConnectorError, SkippableConnectorError, is_frame_failure
from ratebeam.connectors.registry import make_backend
from ratebeam.connectors.storage.base import StorageBackend
from ratebeam.failpoints import failpoint
from ratebeam.transforms.frames import WRITE_STAGE, Frame, FrameOutcome, manifest, points_per_frame
from ratebeam.transforms.schema import BEGIN, SCOPE

LOG = logging.getLogger(__name__)


def frame_rows(table: pa.Table, frame: Frame) -> pa.Table:
    """The rows of ``table`` that belong to ``frame`` (its scope and period begin)."""
    mask = pc.and_(pc.equal(table[SCOPE], frame.scope_id), pc.equal(table[BEGIN], pa.scalar(frame.begin, table[BEGIN].type)))
    return table.filter(mask)


class _WriteFn(beam.DoFn):
    def __init__(self, storage_configs: tuple[Any, ...]) -> None:
        self._configs = storage_configs
        self._written = Metrics.counter("ratebeam", "points_written")
        self._failed = Metrics.counter("ratebeam", "frames_failed_write")

    def setup(self) -> None:
        self._backends: list[StorageBackend] = [make_backend(c) for c in self._configs]
        self._ready: set[int] = set()

    def _write(self, table: pa.Table) -> None:
        for index, backend in enumerate(self._backends):
            if index not in self._ready:
                backend.init()
                self._ready.add(index)
            failpoint("write")
            backend.write(table)

    def process(self, batch: pa.RecordBatch) -> Iterator[FrameOutcome]:
        frames = manifest(batch)
        table = pa.Table.from_batches([batch])
        error = self._try_write(table)
        if isinstance(error, SkippableConnectorError) and len(frames) > 1:
            LOG.info("batch of %d frames refused (%s); writing frame by frame", len(frames), error)
            for frame in frames:
                rows = frame_rows(table, frame)
                yield from self._outcomes(rows, [frame], self._try_write(rows))
            return
        yield from self._outcomes(table, frames, error)

    def _try_write(self, table: pa.Table) -> ConnectorError | None:
        """Write ``table`` to every backend; the error that fails its frames, or None.

        A fatal error (and any error that is not a connector's) propagates: it stops the run.
        """
        try:
            if table.num_rows:
                self._write(table)
        except ConnectorError as exc:
            if not is_frame_failure(exc):
                raise
            return exc
        return None

    def _outcomes(
        self, table: pa.Table, frames: list[Frame], error: ConnectorError | None
    ) -> Iterator[FrameOutcome]:
        if error is None:
            self._written.inc(table.num_rows)
            points = points_per_frame(table)
            for frame in frames:
                types = points.get(frame, {})
                yield FrameOutcome(frame.scope_id, frame.begin, True, points=sum(types.values()),
                                   types=tuple(sorted(types.items())))
            return
        reason = f"write: {type(error).__name__}: {error}"
        self._failed.inc(len(frames))
        for frame in frames:
            LOG.warning("scope %s period %s not written: %s", frame.scope_id, frame.begin.isoformat(), reason)
            yield FrameOutcome(frame.scope_id, frame.begin, False, WRITE_STAGE, reason)

    def teardown(self) -> None:
        for backend in getattr(self, "_backends", []):
            backend.close()


class WriteToStorage(beam.PTransform):
    """Rated batches → ``FrameOutcome`` acknowledgements (with the points written), one per frame."""

    def __init__(self, storage_configs: tuple[Any, ...]) -> None:
        super().__init__()
        self._configs = tuple(storage_configs)

    def expand(self, rated: beam.PCollection) -> beam.PCollection:
        """Write every rated batch to each configured storage backend."""
        return rated | beam.ParDo(_WriteFn(self._configs))

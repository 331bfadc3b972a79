"""``WriteToStorage``: rated batches into every configured backend, acknowledged per frame.

Delivery guarantee: effectively-once per (scope, period, type).  Each backend write replaces the
slices it receives (see ``StorageBackend.write``), so a retried or re-run write stores the same
rows once.  A frame is acknowledged (``FrameOutcome(ok=True)``) only after every backend returned
from ``write``; the state commit downstream advances only over acknowledged frames.

Writes run on one writer thread per worker, in order, while the fused stage collects, converts and
rates the next batch (the storage clients release the GIL: a Delta write overlaps the rating it
used to wait for).  At most ``_WRITES_AHEAD`` batches are written or waiting at once, so memory
stays bounded; outcomes are handed on only once their write returned, and an error raised by a
write is raised on the bundle's thread (a fatal one still stops the run).

Failures (``connectors.errors`` decides): nothing is retried here — the HTTP layer already did.  A
batch refused for its data (``SkippableConnectorError``) is written again frame by frame, so only
the frames a backend refuses fail and the other scopes re-batched with them are stored; a
``RetriableConnectorError`` fails the batch's frames (the next run writes them); a
``FatalConnectorError`` stops the run.  Backends are built in ``setup`` but reach their servers
(``init``) on the first write, so a server that is down fails frames instead of the worker.

Re-rating (``replace_period`` set, reprocessing jobs): a slice write already replaces the old
points of each (scope, period, type) it holds, as the backend's ``rewrite`` capability says; but a
type the period no longer has (every resource of it gone) is not in the write at all.  So after
the new points are written, the writer deletes the types each backend stored for the frame's
(scope, period) that the write did not have (scope + period + type; listed before the write, so the
delete follows it at once): new points first, stale ones after, so a reader never finds the period
empty because of the re-rating.  A reader may, for the time of that one delete, see a stale type
beside the new ones (and, on a backend writing types one by one, some types new and others still
old): each (scope, period, type) slice is old or new as the backend's ``rewrite`` says, a period's
types are not replaced together (``tests/test_reprocessing_window.py`` samples it).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.window import BoundedWindow
from apache_beam.utils.windowed_value import WindowedValue

from ratebeam.connectors.errors import ConnectorError, SkippableConnectorError, is_frame_failure
from ratebeam.connectors.registry import make_backend
from ratebeam.connectors.storage.base import StorageBackend, TotalQuery
from ratebeam.failpoints import failpoint
from ratebeam.transforms.frames import WRITE_STAGE, Frame, FrameOutcome, manifest, points_per_frame
from ratebeam.transforms.schema import BEGIN, RULES, SCOPE, TYPE
from ratebeam.transforms.tallies import TALLIES, Tallies

LOG = logging.getLogger(__name__)


def frame_rows(table: pa.Table, frame: Frame) -> pa.Table:
    """The rows of ``table`` that belong to ``frame`` (its scope and period begin)."""
    mask = pc.and_(pc.equal(table[SCOPE], frame.scope_id), pc.equal(table[BEGIN], pa.scalar(frame.begin, table[BEGIN].type)))
    return table.filter(mask)


#: Rated batches written or waiting to be at once (the next one waits in ``process``).
_WRITES_AHEAD = 2
#: Most types a (scope, period) can hold that one stale-type query lists.
_MAX_TYPES = 10_000


class _WriteFn(beam.DoFn):
    def __init__(self, storage_configs: tuple[Any, ...], replace_period: int | None, scope_key: str | None) -> None:
        self._configs = storage_configs
        self._replace_period = replace_period
        self._scope_key = scope_key
        self._tallies = Tallies()

    def setup(self) -> None:
        self._backends: list[StorageBackend] = [make_backend(c, self._scope_key) for c in self._configs]
        self._ready: set[int] = set()
        #: One thread writes, in order, while the stage rates the next batch (the clients release the GIL).
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ratebeam-write")
        #: Stale types deleted by each delete of the writer thread, counted on the bundle's thread.
        self._deleted: deque[int] = deque()

    def _backend(self, index: int) -> StorageBackend:
        """Backend ``index``, initialised on first use."""
        backend = self._backends[index]
        if index not in self._ready:
            backend.init()
            self._ready.add(index)
        return backend

    def _write(self, table: pa.Table, frames: list[Frame]) -> None:
        period = self._replace_period
        for index in range(len(self._backends)):
            backend = self._backend(index)
            stale = [] if period is None else self._stale_types(backend, table, frames, period)
            failpoint("write")
            if table.num_rows:
                backend.write(table if backend.capabilities.stores_lineage or RULES not in table.column_names
                              else table.drop_columns([RULES]))
            for frame, end, types in stale:
                failpoint("stale")
                backend.delete(begin=frame.begin, end=end, filters={SCOPE: frame.scope_id, TYPE: types})
                self._deleted.append(len(types))

    def _stale_types(
        self, backend: StorageBackend, table: pa.Table, frames: list[Frame], period: int
    ) -> list[tuple[Frame, datetime, list[str]]]:
        """Each frame's stored types that ``table`` (its new points) no longer has, with the period's end.

        Looked up *before* the write (the write only replaces types ``table`` has, so the answer is
        the same after it): the stale types are then deleted right after the write returns, and a
        reader's moment of "new types beside a stale one" lasts the deletes alone, not a query per frame.
        """
        written: dict[Frame, set[str]] = {}
        for scope, begin, type_ in zip(*(table[c].to_pylist() for c in (SCOPE, BEGIN, TYPE)), strict=True):
            written.setdefault(Frame(scope, begin), set()).add(type_)
        stale: list[tuple[Frame, datetime, list[str]]] = []
        for frame in frames:
            end = frame.begin + timedelta(seconds=period)
            query = TotalQuery(groupby=(TYPE,), begin=frame.begin, end=end, filters={SCOPE: frame.scope_id},
                               limit=_MAX_TYPES)
            types = sorted({row[TYPE] for row in backend.total(query).results} - written.get(frame, set()))
            if types:
                stale.append((frame, end, types))
        return stale

    def start_bundle(self) -> None:
        #: Writes under way, oldest first: (the write's outcomes to come, the batch's window).
        self._pending: deque[tuple[Future[list[FrameOutcome]], BoundedWindow]] = deque()

    def process(self, batch: pa.RecordBatch,
                window: BoundedWindow = beam.DoFn.WindowParam) -> Iterator[WindowedValue | TaggedOutput]:  # type: ignore[assignment]  # Beam's parameter marker
        """Start writing ``batch`` on the writer thread; hand on the outcomes of writes that finished.

        At most ``_WRITES_AHEAD`` writes wait or run at once: the batch after them waits here, so
        memory holds a bounded number of rated batches.
        """
        while self._pending and (self._pending[0][0].done() or len(self._pending) >= _WRITES_AHEAD):
            yield from self._acknowledged(*self._pending.popleft())
        self._pending.append((self._writer.submit(self._write_batch, batch), window))

    def finish_bundle(self) -> Iterator[WindowedValue | TaggedOutput]:
        """Wait for every write of the bundle and hand on their outcomes."""
        while self._pending:
            yield from self._acknowledged(*self._pending.popleft())

    def _acknowledged(self, write: Future[list[FrameOutcome]],
                      window: BoundedWindow) -> Iterator[WindowedValue | TaggedOutput]:
        """The outcomes of a finished write (its error raised here), in its batch's window, then their tallies.

        In the batch's window, not the current element's: a streaming tick is a window, and the
        outcome of one tick's write must join that tick's plans.  Counted here: Beam counts on the
        bundle's thread only.
        """
        outcomes = write.result()
        self._tallies.inc("points_written", sum(o.points for o in outcomes if o.ok))
        self._tallies.inc("frames_failed_write", sum(not o.ok for o in outcomes))
        while self._deleted:
            self._tallies.inc("stale_types_deleted", self._deleted.popleft())
        for outcome in outcomes:
            yield WindowedValue(outcome, window.max_timestamp(), (window,))
        yield from self._tallies.drain(window)

    def _write_batch(self, batch: pa.RecordBatch) -> list[FrameOutcome]:
        """Write ``batch`` (on the writer thread): its frames' outcomes, frame by frame if refused for its data."""
        frames = manifest(batch)
        table = pa.Table.from_batches([batch])
        error = self._try_write(table, frames)
        if isinstance(error, SkippableConnectorError) and len(frames) > 1:
            LOG.info("batch of %d frames refused (%s); writing frame by frame", len(frames), error)
            outcomes: list[FrameOutcome] = []
            for frame in frames:
                rows = frame_rows(table, frame)
                outcomes += self._outcomes(rows, [frame], self._try_write(rows, [frame]))
            return outcomes
        return list(self._outcomes(table, frames, error))

    def _try_write(self, table: pa.Table, frames: list[Frame]) -> ConnectorError | None:
        """Write ``table`` (the points of ``frames``) to every backend; the error that fails its frames, or None.

        A fatal error (and any error that is not a connector's) propagates: it stops the run.
        """
        try:
            if table.num_rows or self._replace_period is not None:
                self._write(table, frames)
        except ConnectorError as exc:
            if not is_frame_failure(exc):
                raise
            return exc
        return None

    def _outcomes(
        self, table: pa.Table, frames: list[Frame], error: ConnectorError | None
    ) -> Iterator[FrameOutcome]:
        if error is None:
            points = points_per_frame(table)
            for frame in frames:
                types = points.get(frame, {})
                yield FrameOutcome(frame.scope_id, frame.begin, True, points=sum(types.values()),
                                   types=tuple(sorted(types.items())))
            return
        reason = f"write: {type(error).__name__}: {error}"
        for frame in frames:
            LOG.warning("scope %s period %s not written: %s", frame.scope_id, frame.begin.isoformat(), reason)
            yield FrameOutcome(frame.scope_id, frame.begin, False, WRITE_STAGE, reason)

    def teardown(self) -> None:
        writer = getattr(self, "_writer", None)
        if writer is not None:
            writer.shutdown(wait=True, cancel_futures=True)
        for backend in getattr(self, "_backends", []):
            backend.close()


class WriteToStorage(beam.PTransform):
    """Rated batches → one ``FrameOutcome`` per frame (``outcomes``, with the points written) + ``tallies``."""

    def __init__(self, storage_configs: tuple[Any, ...], replace_period: int | None = None,
                 scope_key: str | None = None) -> None:
        """Write to ``storage_configs``; a re-rating passes ``replace_period`` and CloudKitty's ``scope_key``.

        ``replace_period``: the period in seconds when re-rating (stale types are removed, see above);
        ``scope_key``: see ``make_backend`` (rewrites then replace CloudKitty's points too).
        """
        super().__init__()
        self._configs = tuple(storage_configs)
        self._replace_period = replace_period
        self._scope_key = scope_key

    def expand(self, rated: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        """Write every rated batch to each configured storage backend."""
        return rated | beam.ParDo(_WriteFn(self._configs, self._replace_period, self._scope_key)).with_outputs(
            TALLIES, main="outcomes")

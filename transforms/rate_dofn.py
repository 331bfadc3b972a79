"""``RateFrames``: re-batch frames into ~50k-row batches and rate them with the module chain.

Why re-batch: see ``transforms.rebatch`` (frames are never split).  After rating, CloudKitty drops
the points its ``skip_datapoints_expression`` selects (`cloudkitty/orchestrator.py:445-507`); frames the kernel fails
(`cloudkitty/rating/hash/__init__.py:193-199`) go to the ``failures`` output and nothing of them is written.

The rater is built once per worker (``DoFn.setup``).  A rater that is a :class:`PerTick` (the
streaming service's, which reads the rules again for each tick) is asked for the rater of each
batch's window: a streaming tick is a window of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

import apache_beam as beam
import polars as pl
import pyarrow as pa
from apache_beam.transforms.window import BoundedWindow

from ratebeam.transforms.frames import FrameOutcome, concat_frames, manifest, to_batch
from ratebeam.transforms.rebatch import RebatchingFn
from ratebeam.transforms.tallies import TALLIES

LOG = logging.getLogger(__name__)
FAILURES = "failures"

#: (usage frame) -> (rated frame, failed frames) — ``transforms.chain_rater.ChainRater``.
Rater = Callable[[pl.DataFrame], tuple[pl.DataFrame, list[FrameOutcome]]]


@runtime_checkable
class PerTick(Protocol):
    """A rater whose rating setup depends on the tick (window) of the batch it rates."""

    def for_tick(self, tick: BoundedWindow) -> Rater:
        """The rater of the batches of ``tick``."""
        ...


#: What ``RateFrames`` builds its rater with, on each worker: a ``Rater``, or a ``PerTick`` one.
RaterFactory = Callable[[], Rater | PerTick]


class _RateFn(RebatchingFn):
    def __init__(self, make_rater: RaterFactory, rebatch_rows: int) -> None:
        super().__init__(rebatch_rows)
        self._make_rater = make_rater

    def setup(self) -> None:
        self._rater = self._make_rater()

    def flush(self, batches: list[pa.RecordBatch], window: BoundedWindow) -> Iterator:
        frames = {f for b in batches for f in manifest(b)}
        usage = concat_frames(batches)
        self._tallies.inc("rating_batches")
        rater = self._rater.for_tick(window) if isinstance(self._rater, PerTick) else self._rater
        rated, failures = rater(usage) if usage.height else (usage, [])
        for failure in failures:
            self._tallies.inc("frames_failed_rate")
            LOG.warning("scope %s period %s: rating failed: %s", failure.scope_id, failure.begin.isoformat(),
                        failure.reason)
            yield beam.pvalue.TaggedOutput(FAILURES, failure)
        self._tallies.inc("points_rated", rated.height)
        yield to_batch(rated, frames - {f.frame for f in failures})


class RateFrames(beam.PTransform):
    """Usage batches → rated batches (main) + ``failures`` outcomes of frames that could not be rated + ``tallies``."""

    def __init__(self, make_rater: RaterFactory, rebatch_rows: int) -> None:
        super().__init__()
        self._fn = _RateFn(make_rater, rebatch_rows)

    def expand(self, usage: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        """Rate each re-batched group of usage batches; failed frames go to ``failures``."""
        # The main output is typed so Beam encodes batches with the Arrow IPC coder, not pickle.
        return usage | beam.ParDo(self._fn).with_output_types(pa.RecordBatch).with_outputs(FAILURES, TALLIES, main="rated")

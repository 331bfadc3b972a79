"""The event stream's unbounded source: the bus into the SQL inbox, the inbox into the job, matched.

A splittable DoFn that polls forever (poll ``k`` is offset ``k`` of an endless range, as
``PeriodicImpulse`` does): each poll drains the queue into the inbox — the messages are acknowledged
after that commit (``connectors.notifications``) — reads the inbox's rows this job has not read,
oldest first, and emits their matches (``events.match.BatchMatcher``), one element per scope,
stamped with the batch's oldest notification's time.  Its watermark is the latest
notification time read: event time moves with the notifications, so a replay or a test is
deterministic.  A new job (a restart: Prism keeps no state) reads every unfinished row again, so
the open trigger instances are rebuilt.

With ``wall_clock_lag``, event time is also at least the wall clock minus it — but only from the
second of two *caught-up* polls in a row, and then the wall clock at the start of the first one:
caught up means the broker said the queue had nothing more ready (``Inbox.drain``'s ``drained``)
and the inbox had no more rows for this job than one read takes.  Why: after an outage the queue
holds notifications older than the wall clock minus the lag; had the first poll moved event time
to the wall clock, every older notification read by a later poll would be late, and a late delete
never closes its instance (it would be billed as running for ever).  Everything published before
the first caught-up poll started was then in the inbox or in the hands of another consumer of the
queue (a shard's job: ``docs/events.md``, Sharding), which records it within its poll.  That poll
may take a while (a full prefetch converted and recorded on a loaded machine), so the floor waits
until the caught-up polls in a row have lasted :data:`SETTLE_SECONDS` (at most the lag itself):
what another job held when this one first found the queue empty is in the inbox by then.  While a backlog is read, event time moves with the
notifications read, as it does on a replay; a broker that cannot be reached holds event time too
(what waits on it is not lost).

A shard's job (``--shard K/N``) shares the queue with the other shards' jobs, and while a backlog
is drained one of them can hold a whole prefetch window delivered but not yet recorded (a slow
or busy job: the broker sends the rest of the queue to the others), older than what the others
read next.  So a shard job's event time also never passes the earliest of the jobs' *holding*
times (``Inbox.consumers_low``): each job reports, at every poll, the latest notification time it
recorded when its poll left messages on the queue — whatever was delivered to it and is not
recorded yet comes after those in the queue.  Measured before this bound: two shard jobs on a
preloaded queue of 1,500 notifications recorded 226 of them late, every run.
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.metrics import Metrics
from apache_beam.transforms import core
from apache_beam.transforms.window import TimestampedValue
from apache_beam.typehints import KV
from apache_beam.utils.timestamp import Duration, Timestamp

from ratebeam.connectors.errors import RetriableConnectorError
from ratebeam.connectors.notifications.client import NotificationConsumer
from ratebeam.pipelines.events.job import NAMESPACE, EventJob, InboxStep
from ratebeam.pipelines.events.match import BatchMatcher, ScopeBatch

LOG = logging.getLogger(__name__)
#: How long a job must find the queue and its inbox empty, poll after poll, before event time
#: follows the wall clock (at most ``wall_clock_lag``): the time another shard's job has to record
#: the messages it held then (module docstring).
SETTLE_SECONDS = 30.0
#: A shard job's holding time before its first poll: whatever the broker delivers it may be of any time.
HOLDING_ALL = datetime(1970, 1, 1, tzinfo=UTC)
#: Inbox rows one poll reads into the job at most.
TAKE_ROWS = 5000


class _OnePoller(OffsetRestrictionTracker):
    """The polls' tracker: it checkpoints (``defer_remainder``) but refuses the runner's splits.

    Why: a split would run two polling bundles at once, each with its own consumer on the queue;
    the broker then hands messages to a consumer whose DoFn instance may sit idle in the worker's
    cache, holding them unacknowledged until its connection closes (seen on Prism under load: a
    notification published, never read).  One poller is also what keeps the inbox read in order.
    """

    def try_split(self, fraction_of_remainder: float) -> tuple[OffsetRange, OffsetRange] | None:
        if fraction_of_remainder > 0:
            return None
        return super().try_split(fraction_of_remainder)


class _Polls(core.RestrictionProvider):
    """Poll ``k`` of the source is offset ``k`` of an endless range."""

    def initial_restriction(self, element: Any) -> OffsetRange:
        return OffsetRange(0, sys.maxsize)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return _OnePoller(restriction)

    def restriction_size(self, element: Any, restriction: OffsetRange) -> int:
        return 1

    def truncate(self, element: Any, restriction: OffsetRange) -> None:
        return None  # a drained job stops polling


class _ReadFn(InboxStep):
    """Each poll: the bus into the inbox, then the inbox's unread rows into the job (module docstring)."""

    def setup(self) -> None:
        super().setup()
        if self._job.shard[1] > 1:  # before it consumes: what the broker delivers it is held until its first poll
            self._inbox.consumers_low(self._job.run_id, HOLDING_ALL, datetime.now(UTC))
        self._consumer = NotificationConsumer(self._job.source)
        self._matcher = BatchMatcher(self._job, self._inbox)
        self._received = Metrics.counter(NAMESPACE, "notifications_received")
        self._duplicates = Metrics.counter(NAMESPACE, "notifications_duplicate")
        self._rejected = Metrics.counter(NAMESPACE, "notifications_dead_letter")
        self._read = Metrics.counter(NAMESPACE, "notifications_read")
        self._polls = Metrics.counter(NAMESPACE, "source_polls")  # the job's clock (ops.watchdog)
        self._emitted = Metrics.counter(NAMESPACE, "scope_batches_emitted")  # what Scopes must catch up with
        #: When the last poll that found the queue and the inbox drained started (None: the last did not).
        #: The starts of the caught-up polls in a row, the oldest first (none: not caught up).
        self._caught_up: deque[Timestamp] = deque()
        #: A shard job's holding time on the shared queue (``Inbox.consumers_low``).
        self._holding: datetime | None = HOLDING_ALL
        #: The latest notification time read so far: where event time goes once no bound holds it (a
        #: shard job's bound may hold it below the notifications already read, for polls that read none).
        self._read_through: Timestamp | None = None

    @beam.DoFn.unbounded_per_element()
    def process(self, _impulse: Any,
                tracker: Any = beam.DoFn.RestrictionParam(_Polls()),  # noqa: B008  (Beam's parameter markers)
                watermark: Any = beam.DoFn.WatermarkEstimatorParam(ManualWatermarkEstimator.default_provider()),  # noqa: B008
                ) -> Iterator[TimestampedValue[tuple[str, ScopeBatch]]]:
        """One poll (then the rest of the range is deferred to the next)."""
        self._polls.inc()
        poll = tracker.current_restriction().start
        if not tracker.try_claim(poll):
            return
        started = Timestamp.now()
        drained = backlog = False
        try:
            recorded = self._inbox.drain(self._consumer, wait=0.0)
            self._received.inc(recorded.new)
            self._duplicates.inc(recorded.duplicates)
            self._rejected.inc(recorded.rejected)
            drained, backlog = recorded.drained, not recorded.drained
            self._holding = None if drained else recorded.latest or self._holding
        except RetriableConnectorError as exc:  # the one retrying layer: the next poll connects again
            LOG.warning("notification source: %s (trying again at the next poll; event time holds)", exc)
        low = self._shared_queue_low(started)
        rows = self._inbox.take(self._job.run_id, TAKE_ROWS)
        self._read.inc(len(rows))
        backlog = backlog or len(rows) == TAKE_ROWS
        before = watermark.current_watermark()
        stream_time = None if before is None else before.micros
        if rows:  # one element per scope of the poll (the steps work on batches), at its oldest notification's time
            times = [Timestamp.from_utc_datetime(n.timestamp) for n in rows]
            self._read_through = max(times) if self._read_through is None else max(self._read_through, *times)
            oldest = min(times)
            for keyed in self._matcher(rows, stream_time):
                self._emitted.inc()
                yield TimestampedValue(keyed, oldest)
        latest = max((t for t in (before, self._read_through) if t is not None), default=None)
        lag = self._job.source.wall_clock_lag
        if not (drained and not backlog):
            self._caught_up.clear()
        settle = Duration(min(SETTLE_SECONDS, lag or 0.0))
        while len(self._caught_up) > 1 and started - self._caught_up[1] >= settle:
            self._caught_up.popleft()  # the oldest start kept is the latest one at least `settle` ago
        settled = self._caught_up[0] if self._caught_up and started - self._caught_up[0] >= settle else None
        if drained and not backlog:
            self._caught_up.append(started)
        if lag is not None and settled is not None:
            wall = settled - Duration(lag)
            latest = wall if latest is None or wall > latest else latest
        if low is not None and latest is not None and latest > low:
            latest = low  # another shard's job may still record notifications from then (module docstring)
        nudged = None if before is None else before + Duration(micros=1000)
        if nudged is not None and latest is not None and latest <= before and (low is None or nudged <= low):
            # Prism runs a stateful step (its new elements, its timers already due) only when its input
            # watermark moves: a poll that moves it no further (stragglers only, or nothing) moves it 1 ms
            # (Prism's clock unit), or that work would wait for the next newer notification.
            latest = nudged
        if latest is not None and (before is None or latest > before):
            watermark.set_watermark(latest)
        tracker.defer_remainder(Duration(0 if backlog else self._job.source.poll_seconds))

    def _shared_queue_low(self, now: Timestamp) -> Timestamp | None:
        """A shard job's bound on event time from the jobs sharing its queue (module docstring); else ``None``."""
        if self._job.shard[1] <= 1:
            return None
        try:
            low = self._inbox.consumers_low(self._job.run_id, self._holding,
                                            now.to_utc_datetime().replace(tzinfo=UTC))
        except RetriableConnectorError as exc:
            LOG.warning("notification source: %s (event time holds until the next poll)", exc)
            return Timestamp(micros=0)
        return None if low is None else Timestamp.from_utc_datetime(low)

    def teardown(self) -> None:
        consumer = getattr(self, "_consumer", None)
        if consumer is not None:
            consumer.close()
        if self._job.shard[1] > 1 and hasattr(self, "_inbox"):
            try:
                self._inbox.leave(self._job.run_id)
            except RetriableConnectorError as exc:  # its row goes stale (CONSUMER_STALE) instead
                LOG.warning("notification source: %s (its consumer row expires instead)", exc)
        super().teardown()


class ReadNotifications(beam.PTransform):
    """The unbounded source: ``(scope, (stream time in µs when read or None, matches))`` per scope and poll.

    Each at its poll's oldest notification's time.  The key's coder must be Beam's standard string
    coder (the type says so): with a Python-only one (the default for an untyped tuple) Prism keys
    the elements by other bytes than the SDK keys their state, and a scope's second bundle of
    elements started from empty state.
    """

    def __init__(self, job: EventJob) -> None:
        super().__init__()
        self._job = job

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        """Impulse, then the polling splittable DoFn."""
        return pipeline | beam.Impulse() | beam.ParDo(_ReadFn(self._job)).with_output_types(KV[str, Any])

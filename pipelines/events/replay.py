"""``ratebeam events reprocess``: the inbox replayed in event-time order, its frames in a range stored again.

The stream bills what came in time; a notification that came late is recorded in the inbox
(``late_at``) and left out.  This bounded job is the reprocessing that uses it: it reads the
inbox's notifications (late ones included) up to the range's end + the frames' delay, runs them
through the stream's own steps — the definitions and triggers (``MatchFn``), then each scope's
``ScopeFn`` with its state and timer in memory, fed in event-time order (a timer due before a
notification fires before it; a notification at a timer's instant comes first, as on the stream)
— and stores every (scope, period) frame of the range again, an empty one included, so a period
whose usage is gone is emptied.  The result is what the stream would have stored had every
notification come at its own time: a straggler within its instance is billed; one after its
instance fired is still late (its trigger's ``fire_delay`` was the deal).

Why the stream's steps and not a second implementation: one code path, so a reprocessed frame
and a streamed one cannot differ by anything but the order of arrival.  Why in memory: one scope's
notifications in a range are few (a batch runner holds the group), and a batch runner fires
timers only once its input is done, which is not the stream's order.  The inbox is only read: no
notification is finished, marked late or dead-lettered again (the stream's bookkeeping is its own;
a frame that fails is a dead letter of the replay's run); the discrepancies found are stored as the
stream stores them (once per finding).  Run it for
periods the stream has closed: a frame of the range the stream stores afterwards replaces the slice
with what the stream saw (the replay does not record its frames as the stream's, so the stream
still writes them).
"""

from __future__ import annotations

import heapq
import logging
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.typehints import KV
from apache_beam.utils.timestamp import Timestamp

from ratebeam.connectors.notifications.inbox import Inbox
from ratebeam.connectors.sql.run_tallies import RecordTallies
from ratebeam.connectors.storage.write_transform import WriteToStorage
from ratebeam.pipelines.cycle import run_to_completion
from ratebeam.pipelines.events.graph import CommitFrame
from ratebeam.pipelines.events.job import LATE, EventJob
from ratebeam.pipelines.events.match import MatchFn
from ratebeam.pipelines.events.scope import ScopeFn, frame_batch
from ratebeam.transforms import arrow_coder
from ratebeam.transforms.events.model import Notification
from ratebeam.transforms.frames import Frame, FrameOutcome, manifest
from ratebeam.transforms.rate_dofn import RateFrames, RaterFactory

LOG = logging.getLogger(__name__)
#: Inbox rows read per query.
PAGE_ROWS = 5000


@dataclass(frozen=True)
class Replay:
    """The range (``begin`` included, ``end`` excluded, on period boundaries) and the scopes (empty: all)."""

    begin: datetime
    end: datetime
    scopes: tuple[str, ...] = ()

    def periods(self, period: int) -> list[datetime]:
        """The period begins of the range."""
        count = int((self.end - self.begin).total_seconds()) // period
        return [self.begin + timedelta(seconds=k * period) for k in range(count)]


class _ReadOnlyInbox(Inbox):
    """The inbox as the replay's steps see it: read, never written; no frame counts as stored (all are rewritten)."""

    def finish(self, message_ids: Iterable[str], now: datetime | None = None) -> None:
        """The stream's bookkeeping: not the replay's."""

    def reject(self, message_id: str, reason: str, now: datetime | None = None) -> None:
        """Dead-lettered by the stream already (the step logs and counts it again)."""

    def late(self, message_id: str, reason: str, now: datetime | None = None) -> None:
        """Late for the replay too (after its instance fired): the step logs and counts it."""

    def await_frame(self, message_ids: Iterable[str], scope: str, begin: datetime) -> None:
        """The stream's bookkeeping: not the replay's."""

    def frame_stored(self, scope: str, begin: datetime) -> bool:
        """Every frame of the range is stored again."""
        return False


class _ReadInboxFn(beam.DoFn):
    """Every notification of the inbox generated up to ``until``, oldest first, as the stream's source emits them."""

    def __init__(self, job: EventJob, until: datetime) -> None:
        self._job, self._until = job, until

    def process(self, _start: Any) -> Iterator[tuple[list[Notification], None]]:
        inbox = Inbox(self._job.database_url)
        try:
            after = None
            while page := inbox.history(self._until, after, PAGE_ROWS):
                yield page, None  # a batch, as the stream's source; no stream time: nothing is late by the clock
                after = (page[-1].timestamp, page[-1].message_id)
        finally:
            inbox.engine.dispose()


class _ReplayMatch(MatchFn):
    """The stream's matching over the read-only inbox."""

    def open_inbox(self) -> Inbox:
        """Read, never written."""
        return _ReadOnlyInbox(self._job.database_url)


class _ReplayScope(ScopeFn):
    """The stream's scope step over the read-only inbox (held by ``_ReplayScopes``, never a step of the graph)."""

    def open_inbox(self) -> Inbox:
        """Read, never written."""
        return _ReadOnlyInbox(self._job.database_url)


class _ReplayScopes(beam.DoFn):
    """Each scope's matches through the stream's scope step, in event-time order (module docstring).

    The step is held, not inherited: this DoFn is not stateful for the runner (its input is grouped
    already); the step's own state and timers are the in-memory ``_Cell``, ``_Bag`` and ``_Timer``.
    """

    def __init__(self, job: EventJob, replay: Replay) -> None:
        self._job, self._replay = job, replay

    def setup(self) -> None:
        """The stream's scope step, over the read-only inbox."""
        self._step = _ReplayScope(self._job)
        self._step.setup()

    def teardown(self) -> None:
        """The step's connections."""
        step = getattr(self, "_step", None)
        if step is not None:
            step.teardown()

    def process(self, element: tuple[str, Iterable[Any]]) -> Iterator[pa.RecordBatch]:
        """One scope's matches → every frame of the range (empty where it has no rows)."""
        scope, batches = element
        head, log, timer = _Cell(), _Bag(), _Timer()
        sent: dict[datetime, pa.RecordBatch] = {}

        def fire_before(limit: Timestamp, inclusive: bool) -> None:
            while (when := timer.next()) is not None and (when < limit or (inclusive and when == limit)):
                timer.fired(when)
                for batch in self._step.on_due(key=scope, when=when, head=head, log=log, due=timer):
                    sent.update((f.begin, batch) for f in manifest(batch))

        matches = (match for _, scope_matches in batches for match in scope_matches)
        for match in sorted(matches, key=lambda m: (m[2].generated, m[2].message_id)):
            fire_before(Timestamp.from_utc_datetime(match[2].generated), inclusive=False)
            for out in self._step.process((scope, (None, [match])), head=head, log=log, due=timer):
                if isinstance(out, beam.pvalue.TaggedOutput) and out.tag == LATE:
                    LOG.info("replay: %s is late here too: %s", *out.value)
        fire_before(Timestamp.from_utc_datetime(self._replay.end + self._job.frame_delay), inclusive=True)
        for begin in self._replay.periods(self._job.period):
            yield sent[begin] if begin in sent else frame_batch([], Frame(scope, begin))


class _RecordFailures(CommitFrame):
    """A failed frame becomes a dead letter of the replay's run; a stored one is not recorded as the stream's.

    ``ratebeam_event_frames`` is the stream's bookkeeping: a frame found there is one the stream does
    not write again, so a replayed frame of a period the stream has not closed yet must not be in it.
    """

    def open_inbox(self) -> Inbox:
        """Read, never written."""
        return _ReadOnlyInbox(self._job.database_url)

    def process(self, outcome: FrameOutcome) -> None:
        """Record ``outcome`` if it failed."""
        if not outcome.ok:
            self._dead.add(self._job.run_id, [outcome])


class _Cell:
    """A state cell of one scope, in memory (``ScopeFn`` reads and writes it as Beam's)."""

    def __init__(self) -> None:
        self._value: Any = None

    def read(self) -> Any:
        return self._value

    def write(self, value: Any) -> None:
        self._value = value


class _Bag:
    """A bag state of one scope, in memory (``ScopeFn`` appends to it, reads and clears it as Beam's)."""

    def __init__(self) -> None:
        self._items: list[Any] = []

    def read(self) -> list[Any]:
        return list(self._items)

    def add(self, value: Any) -> None:
        self._items.append(value)

    def clear(self) -> None:
        self._items = []


class _Timer:
    """The scope's event-time timer family, in memory: the instants its timers are set for, by tag.

    A heap of (instant, tag), an entry current while its tag is still set for its instant: a scope
    of n instances sets about n timers, and looking for the earliest among them each time was O(n²)
    over a replay.
    """

    def __init__(self) -> None:
        self.timers: dict[str, Timestamp] = {}
        self._heap: list[tuple[Timestamp, str]] = []

    def set(self, when: Timestamp, dynamic_timer_tag: str = "") -> None:
        self.timers[dynamic_timer_tag] = when
        heapq.heappush(self._heap, (when, dynamic_timer_tag))

    def next(self) -> Timestamp | None:
        """The earliest instant a timer is set for."""
        while self._heap and self.timers.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)  # moved or fired since
        return self._heap[0][0] if self._heap else None

    def fired(self, when: Timestamp) -> None:
        """The timers of ``when`` fire (now)."""
        while self.next() == when:
            del self.timers[heapq.heappop(self._heap)[1]]


def build_replay(pipeline: beam.Pipeline, job: EventJob, rater: RaterFactory, replay: Replay) -> beam.PCollection:
    """The bounded graph of the module docstring; returns the writer's outcomes."""
    arrow_coder.register_arrow_coder()
    wanted = set(replay.scopes)
    matched = (pipeline
               | "Start" >> beam.Create([None])
               | "ReadInbox" >> beam.ParDo(_ReadInboxFn(job, replay.end + job.frame_delay))
               | "ConvertMatch" >> beam.ParDo(_ReplayMatch(job)).with_output_types(KV[str, Any]))
    if wanted:
        matched = matched | "OnlyScopes" >> beam.Filter(lambda m: m[0] in wanted)
    frames = (matched
              | "ByScope" >> beam.GroupByKey()
              | "Replay" >> beam.ParDo(_ReplayScopes(job, replay)).with_output_types(pa.RecordBatch))
    rated = frames | "Rate" >> RateFrames(rater, job.rebatch_rows)
    # Re-rating: the writer also deletes the types a frame no longer has (an empty frame: all of them).
    written = rated.rated | "Write" >> WriteToStorage(job.storage, job.period, job.scope_key)
    written.outcomes | "RecordFailures" >> beam.ParDo(_RecordFailures(job))
    rated.failures | "RecordRateFailures" >> beam.ParDo(_RecordFailures(job))
    # What the command reports, counted by the graph (any runner; Dask has no Beam metrics).
    stored = written.outcomes | "Stored" >> beam.Filter(lambda o: o.ok)
    scopes = (stored | "ScopeIds" >> beam.Map(lambda o: o.scope_id) | "Distinct" >> beam.Distinct()
              | "ScopeTally" >> beam.Map(lambda _: ("scopes_stored", 1)))
    ((written.tallies, stored | "FrameTally" >> beam.Map(lambda _: ("frames_stored", 1)), scopes)
     | "Tallies" >> beam.Flatten() | "RecordTallies" >> RecordTallies(job.database_url, job.run_id))
    return written.outcomes


@dataclass(frozen=True)
class ReplayReport:
    """What a replay stored (the graph's tallies) and the frames that failed."""

    tallies: dict[str, int]
    failed: list[FrameOutcome]


def run_replay(job: EventJob, rater: RaterFactory, replay: Replay, runner: str = "FnApiRunner",
               extra_options: Iterable[str] = ()) -> ReplayReport:
    """Run the replay to completion on ``runner``; what it stored, and the frames that failed."""
    run_id = job.run_id or uuid.uuid4().hex[:16]
    job = replace(job, run_id=run_id)
    pipeline = beam.Pipeline(options=PipelineOptions([f"--runner={runner}", *extra_options]))
    build_replay(pipeline, job, rater, replay)
    return ReplayReport(*run_to_completion(pipeline, job.database_url, run_id))


__all__ = ["Replay", "ReplayReport", "build_replay", "run_replay"]

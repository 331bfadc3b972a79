"""A streaming job that stops making progress is cancelled, so that its launcher starts it again.

Why: Prism (2.75 and 2.78, ``worker/bundle.go`` ``ProcessOn``) does not fail a job whose SDK
worker died between two bundles.  The next bundle sent to that worker finds it stopped, gets no
response and is waited for for ever: the job stays ``RUNNING``, rates nothing, and ``serve``'s
launcher goes on renewing its leases, so no other ``serve`` or ``run`` takes its scopes over.  A
worker killed *during* a bundle fails the job, as it should; an OOM kill or a pod eviction between
bundles is as likely.

Each job of ratebeam has a clock that must go on firing while the job lives, counted by a Beam
counter: ``serve``'s heartbeat (``heartbeats``, an impulse of its own every 30 s at most) and the
event stream's source (``source_polls``, one per poll of the bus).  The launcher reads the counters at
each poll of the job; a counter that stays the same for ``timeout`` seconds means a stuck job.
A step that runs in a worker of its own (the event stream's ``Scopes`` with resource hints) is
watched by what it has not caught up with: the scope batches the source emitted
(``scope_batches_emitted``) and those it applied (``scope_batches_applied``).

``serve``'s heartbeat is ``ops.heartbeat``; this module imports no Beam (the CLI imports it to build
its options).

The watch starts once the counter has been seen: a runner that reports no counters of a running
job is not watched (and says nothing wrong).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

#: Default seconds without a firing of the job's clock before the job is called stuck: well above a
#: clock's period (at most 30 s for ``serve``, ``poll_seconds`` for the event stream) and a long GC pause.
STALL_TIMEOUT_S = 300.0
#: The state a launcher gives a job it cancelled as stuck (then it starts the job again, as after a failure).
STALLED = "STALLED"


class StallWatch:
    """Says when the job's ``counter`` has not moved for ``timeout`` seconds while it should.

    It should move at all times (a clock), until it reaches ``done_at`` (a finite clock); or, with
    ``behind``, only while the counter ``behind`` names is ahead of it (a step that has not caught up
    with what its input step emitted).
    """

    def __init__(self, counter: str, timeout: float, done_at: int | None = None, behind: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.counter = counter
        self.timeout = timeout
        self._done_at = done_at  # a finite clock: its last firing; after it the job ends on its own
        self._behind = behind
        self._clock = clock
        self._value: int | None = None
        self._since = clock()

    def stalled(self, counters: Mapping[str, int]) -> bool:
        """True once the counter is the same as ``timeout`` seconds ago while it should have moved."""
        value = counters.get(self.counter)
        now = self._clock()
        if self._behind is not None:
            ahead = counters.get(self._behind)
            if ahead is None or ahead <= (value or 0):  # caught up: nothing to wait for
                self._value = None
                return False
            value = value or 0  # behind: waited for from now on (or since it last moved)
        if value is None or value != self._value:
            if value is not None:
                self._value, self._since = value, now
            return False
        if self._done_at is not None and value >= self._done_at:
            return False
        return now - self._since >= self.timeout

    def explain(self) -> str:
        """The log line of a stuck job."""
        waiting = f" while ratebeam_{self._behind} is ahead of it" if self._behind else ""
        return (f"ratebeam_{self.counter} has not moved for {self._clock() - self._since:.0f}s{waiting}: "
                "the job is stuck (a runner that lost its SDK worker between bundles keeps such a job RUNNING); "
                "cancelling it")


def first_stalled(watches: Sequence[StallWatch], counters: Mapping[str, int]) -> StallWatch | None:
    """The first of ``watches`` that finds the job stuck (each is asked, so each keeps its own time)."""
    found = [watch for watch in watches if watch.stalled(counters)]
    return found[0] if found else None

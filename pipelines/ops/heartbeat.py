"""``serve``'s heartbeat: the step that counts the beats the launcher's watchdog (``ops.watchdog``) reads.

The heartbeat is an impulse of its own beside the ticks (``pipelines.serve``): it beats at least
every :data:`HEARTBEAT_S` seconds whatever the tick interval, so a stuck job is found within
``--stall-timeout`` even with hourly ticks.  Kept apart from ``ops.watchdog``, which must not import
Beam (the command line imports it to build its options).
"""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
from apache_beam.metrics import Metrics

#: Longest time between two beats of ``serve``'s heartbeat.
HEARTBEAT_S = 30.0


class CountBeats(beam.DoFn):
    """Counts the firings of a heartbeat impulse (``heartbeats``, ``ratebeam_heartbeats`` on ``/metrics``); emits nothing."""

    def setup(self) -> None:
        """The ``heartbeats`` counter."""
        self._beats = Metrics.counter("ratebeam", "heartbeats")

    def process(self, _beat: float) -> Iterator[None]:
        """One beat."""
        self._beats.inc()
        yield from ()

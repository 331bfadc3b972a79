"""``serve``'s clock: the ticks of a ``PeriodicImpulse``, each in a window of its own that it closes.

```
PeriodicImpulse (every interval from the job's start) ─► BeginTick (count, stamp) ─► TickWindows ─► Clock (now)
```
``pipelines.serve`` feeds the ticks' ``now`` to the cycle (``pipelines.cycle.build_cycle``), whose
``CommitState`` groups each tick's outcomes in the tick's window: a tick commits when its window
closes, so the window decides when a tick's state advances (:class:`_BeginTick`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import apache_beam as beam
from apache_beam import coders
from apache_beam.metrics import Metrics
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse, RebaseMode
from apache_beam.utils.timestamp import Timestamp

#: Seconds a tick's window spans, ending at the instant the impulse fired the tick.
TICK_WINDOW_S = 0.001


@dataclass(frozen=True)
class TickClock:
    """The ``now`` of each tick: its impulse timestamp, or simulated time ``simulated_from + k × step``.

    With simulated time the impulse carries the tick's index ``k`` (``PeriodicImpulse(data=...)``),
    so a job that starts late, or again, still gives tick ``k`` its own instant.
    """

    simulated_from: datetime | None = None
    step: int = 0  # simulated seconds per tick

    def __call__(self, impulse: float | int) -> datetime:
        """The ``now`` of the tick this impulse firing is."""
        if self.simulated_from is None:
            return datetime.fromtimestamp(float(impulse), UTC)
        return self.simulated_from + timedelta(seconds=int(impulse) * self.step)


def tick_clock(pipeline: beam.Pipeline, clock: TickClock, interval: float, ticks: range | None,
               start: float) -> beam.PCollection:
    """Each tick's ``now`` (a ``datetime``) in a window of its own: ``ticks`` (None: for ever), ``interval`` s apart.

    The impulse starts when the job does (``REBASE_*``), not at ``start`` (when the graph was
    built), so a slow job start does not fire a burst of overdue ticks at once.  Each firing is a
    tick, and its window ends at the instant of the firing (:class:`_BeginTick`).
    """
    if clock.simulated_from is not None:  # the tick indices are the data
        if ticks is None:
            raise ValueError("a simulated clock needs a number of ticks")
        impulse = PeriodicImpulse(start_timestamp=start, fire_interval=interval, data=list(ticks),
                                  rebase=RebaseMode.REBASE_ALL)
    else:
        impulse = PeriodicImpulse(start_timestamp=start, fire_interval=interval,
                                  **impulse_span(run_seconds(ticks, interval), start))
    return (
        pipeline
        | "Ticks" >> impulse
        | "BeginTick" >> beam.ParDo(_BeginTick())
        | "TickWindows" >> beam.WindowInto(_TickWindows())
        | "Clock" >> beam.Map(clock)
    )


def run_seconds(ticks: range | None, interval: float) -> float | None:
    """How long ``ticks`` last, ``interval`` s apart (None: for ever)."""
    return None if ticks is None else len(ticks) * interval


def impulse_span(seconds: float | None, start: float) -> dict[str, Any]:
    """A ``PeriodicImpulse``'s end and rebase mode: ``seconds`` (None: for ever) from the job's start."""
    if seconds is None:
        return {"rebase": RebaseMode.REBASE_START}
    return {"stop_timestamp": start + seconds, "rebase": RebaseMode.REBASE_ALL}


class _BeginTick(beam.DoFn):
    """Counts the tick and stamps it :data:`TICK_WINDOW_S` before its firing, so its window ends there.

    The impulse sets its watermark to the instant of each firing as it fires, and the runner holds
    the watermark of every later step at the tick's stamp while the tick's work is in flight.  So
    the tick's window (``CommitState`` groups by it) closes as soon as that work has drained: the
    tick commits then.  With the tick stamped at the firing itself, the window would end after it
    and only a later firing of the impulse would close it.  (It was a pulse half an interval
    later; in CI, on a starved CPU, Prism once moved nothing at the pulse, and the tick committed
    only with the next tick, which skipped the scopes the first still leased.)  The stamp is earlier
    than the impulse's watermark, but no step sees it late: the tick is handed on, in the same
    bundle, before the runner takes that bundle's watermark.
    """

    def setup(self) -> None:
        """The ``cycles`` counter: ticks begun by this job (``ratebeam_cycles`` on ``/metrics``)."""
        self._cycles = Metrics.counter("ratebeam", "cycles")

    def process(self, value: float | int,
                fired: Timestamp = beam.DoFn.TimestampParam) -> Iterator[window.TimestampedValue]:
        """The tick, stamped just before its firing."""
        self._cycles.inc()
        yield window.TimestampedValue(value, fired - TICK_WINDOW_S)


class _TickWindows(window.NonMergingWindowFn):
    """One window per tick, from its stamp to the instant of its firing (:class:`_BeginTick`)."""

    def assign(self, context: window.WindowFn.AssignContext) -> list[window.IntervalWindow]:
        """The tick's own window."""
        return [window.IntervalWindow(context.timestamp, context.timestamp + TICK_WINDOW_S)]

    def get_window_coder(self) -> coders.coders.IntervalWindowCoder:
        """Interval windows' coder."""
        return coders.coders.IntervalWindowCoder()

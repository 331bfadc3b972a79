"""A run's figures as data of its graph, so that every runner gives the same ones.

Beam counters are the runner's business: FnApiRunner and Prism report them, Beam's DaskRunner
reports none (its result's ``metrics()`` raises), and what a runner does with the counters of a
bundle it retries or recomputes is its own.  ``ratebeam run``'s summary, its exit status, the
"every scope busy" decision and a job's points therefore come from *tallies*: each counting DoFn
emits ``(name, n)`` pairs on its ``tallies`` output, in the window of what it counted; the cycle
sums them and records the sums under the run id (``connectors.sql.run_tallies``), and the
launcher reads them back once the pipeline finished, as it reads the dead letters.  A bundle
that a runner retries or recomputes emits its tallies again together with its other outputs, and
like them they are kept once.

Each increment also goes to the Beam counter of the same name in the ``ratebeam`` namespace:
``serve`` (a streaming job, whose tallies are not summed) shows those live on ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.window import BoundedWindow
from apache_beam.utils.windowed_value import WindowedValue

#: The output tag of tallies, on every counting step.
TALLIES = "tallies"
NAMESPACE = "ratebeam"


class Tallies:
    """The counts of one DoFn not yet emitted, and the last totals it observed of its clients."""

    def __init__(self) -> None:
        self._pending: dict[str, int] = {}
        self._seen: dict[str, int] = {}

    def inc(self, name: str, n: int = 1) -> None:
        """Count ``n`` more of ``name`` (and tell Beam's counter of that name)."""
        if n:
            Metrics.counter(NAMESPACE, name).inc(n)
            self._pending[name] = self._pending.get(name, 0) + n

    def observe(self, totals: Mapping[str, int]) -> None:
        """Count what a client's running ``totals`` (e.g. HTTP requests so far) grew by since last observed."""
        for name, total in totals.items():
            self.inc(name, total - self._seen.get(name, 0))
            self._seen[name] = total

    def drain(self, window: BoundedWindow | None = None) -> Iterator[TaggedOutput]:
        """The pending counts as ``tallies`` outputs, then none pending.

        ``window``: the window to emit them in, for ``finish_bundle`` (which has no current element).
        """
        pending, self._pending = self._pending, {}
        for name, n in pending.items():
            value = (name, n) if window is None else WindowedValue((name, n), window.max_timestamp(), (window,))
            yield TaggedOutput(TALLIES, value)

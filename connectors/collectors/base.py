"""What a collector is: the raw samples of one metric for one scope and period (`cloudkitty/collector/__init__.py:64-119`).

A collector only collects.  It returns *raw samples* (``transforms.convert_usage``: scope, metric
key, begin/end, the value as collected, ``label.<key>`` columns) and declares, as data, the
arithmetic CloudKitty applies to its values (``numeric_context``); the pure ``ConvertUsage`` step
turns them into usage points, the same way for every collector.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from datetime import datetime
from typing import ClassVar

import pyarrow as pa

from ratebeam.transforms.conversion import NumericContext
from ratebeam.transforms.metric_defs import MetricDef


class Collector(abc.ABC):
    """Collects raw samples.  Built on workers (``DoFn.setup``) from its picklable configuration."""

    name: str
    #: How this collector's values become quantities (CloudKitty's Prometheus collector rounds to 9 digits).
    numeric_context: ClassVar[NumericContext] = NumericContext.EXACT
    #: Whether ``collect_periods`` answers many periods of a scope in one call (the collect stage
    #: then groups a bundle's frames by scope instead of calling ``collect`` frame by frame).
    collects_periods: ClassVar[bool] = False

    @abc.abstractmethod
    def collect(self, scope_id: str, begin: datetime, end: datetime, metric: MetricDef) -> pa.RecordBatch:
        """The raw samples of ``metric`` for the scope in ``[begin, end)``, in a stable order.

        Raises ``NoDataCollected`` when there is nothing, a ``connectors.errors`` error otherwise.
        """

    def collect_all(self, begin: datetime, end: datetime, metric: MetricDef) -> dict[str, pa.RecordBatch]:
        """The raw samples of ``metric`` in ``[begin, end)`` for every scope at once, by scope.

        Only collectors with a ``batched`` option implement it (the graph's batched stage calls it).
        """
        raise NotImplementedError(f"the {self.name} collector cannot collect every scope at once")

    def collect_periods(self, scope_id: str, begins: Sequence[datetime], period: int,
                        metric: MetricDef) -> pa.RecordBatch:
        """The raw samples of ``metric`` for the scope in every ``[begin, begin + period)`` of ``begins``.

        Only collectors whose ``collects_periods`` is set implement it: their samples are at hand
        (the file collector), so one call for a scope's periods costs what one period's call does.
        Raises like ``collect``: ``NoDataCollected`` when no period has anything.
        """
        raise NotImplementedError(f"the {self.name} collector collects one period at a time")

    def counts(self) -> dict[str, int]:
        """Running totals this collector keeps (HTTP requests, samples left out), by figure name.

        The graph tallies how much they grow (``transforms.tallies``): a collector counts, the graph reports.
        """
        return {}

    def check(self) -> None:  # noqa: B027 - optional hook
        """Raise ``FatalConnectorError`` for a configuration that cannot work.

        Checked once, before any lease is taken: a missing source is one configuration error, not one
        failure per period.
        """

    def not_read(self) -> list[tuple[str, str]]:
        """(source, why) of what the collector's source holds but it leaves (the file collector's files).

        Said in the run's summary, its log and ``ratebeam gaps``: usage left without a word is
        revenue lost without a word.
        """
        return []

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients."""

"""What a collector is: usage of one metric for one scope and period, as an Arrow batch (spec §3)."""

from __future__ import annotations

import abc
from datetime import datetime

import pyarrow as pa

from ratebeam.transforms.metric_defs import MetricDef


class Collector(abc.ABC):
    """Collects usage.  Built on workers (``DoFn.setup``) from its picklable configuration."""

    name: str

    @abc.abstractmethod
    def collect(self, scope_id: str, begin: datetime, end: datetime, metric: MetricDef) -> pa.RecordBatch:
        """The converted usage points of ``metric`` for the scope in ``[begin, end)``.

        Columns follow ``transforms.schema.usage_schema`` (time keys included, price 0).  Raises
        ``NoDataCollected`` when there is nothing, a ``connectors.errors`` error otherwise.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients."""

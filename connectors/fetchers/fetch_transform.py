"""``FetchScopes``: the scopes of each tick, read on a worker (not at graph construction).

A tick is the instant a cycle rates up to (``now``): one for a bounded ``ratebeam run``, one per
``PeriodicImpulse`` firing for ``ratebeam serve``.  Each scope is emitted with its tick, so the
planner downstream knows the clock of the cycle it plans — and picks up the scopes that appeared
since the last tick.

Reading the scope list inside the pipeline keeps the graph free of launch-time state, so the same
graph runs on the DirectRunner and on Flink.  Without the scope list there is no frame to fail, so
any connector error here (retriable ones already retried by the HTTP layer) stops the run as a
``FatalConnectorError``: one clear line instead of a run that silently rates nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import apache_beam as beam

from ratebeam.connectors.errors import ConnectorError, FatalConnectorError, is_frame_failure
from ratebeam.connectors.registry import make_fetcher
from ratebeam.transforms.tallies import TALLIES, Tallies

LOG = logging.getLogger(__name__)


class _FetchScopesFn(beam.DoFn):
    def __init__(self, fetcher_config: Any) -> None:
        self._config = fetcher_config
        self._tallies = Tallies()

    def setup(self) -> None:
        self._fetcher = make_fetcher(self._config)

    def process(self, tick: datetime) -> Iterator[tuple[datetime, str] | beam.pvalue.TaggedOutput]:
        """``(tick, scope)`` for every scope the fetcher lists, then its requests; a connector error stops the run.

        The scopes are counted where they are planned (``PlanPeriods``).
        """
        try:
            scopes = self._fetcher.scopes(tick)  # the scopes as of the tick (Prometheus: at that time)
        except ConnectorError as exc:
            if not is_frame_failure(exc):
                raise
            raise FatalConnectorError(f"{self._config.backend} fetcher: cannot list the scopes: {exc}") from exc
        LOG.info("fetched %d scope(s) from the %s fetcher", len(scopes), self._config.backend)
        for scope in scopes:
            yield tick, scope
        self._tallies.observe(self._fetcher.counts())
        yield from self._tallies.drain()

    def teardown(self) -> None:
        fetcher = getattr(self, "_fetcher", None)
        if fetcher is not None:
            fetcher.close()


class FetchScopes(beam.PTransform):
    """Ticks (``now`` instants) → (tick, scope id) per scope of each tick (``scopes``) + ``tallies``."""

    def __init__(self, fetcher_config: Any) -> None:
        super().__init__()
        self._config = fetcher_config

    def expand(self, ticks: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        """One fetcher call per tick, emitting ``(tick, scope id)`` for every scope."""
        return ticks | "Fetch" >> beam.ParDo(_FetchScopesFn(self._config)).with_outputs(TALLIES, main="scopes")

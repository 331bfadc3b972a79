"""``FetchScopes``: the bounded source of scopes, read on a worker (not at graph construction).

Reading the scope list inside the pipeline keeps the graph free of launch-time state, so the same
graph runs on the DirectRunner and on Flink.  Without the scope list there is no frame to fail, so
any connector error here (retriable ones already retried by the HTTP layer) stops the run as a
``FatalConnectorError``: one clear line instead of a run that silently rates nothing.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics

from ratebeam.connectors.errors import ConnectorError, FatalConnectorError, is_frame_failure
from ratebeam.connectors.registry import make_fetcher

LOG = logging.getLogger(__name__)


class _FetchScopesFn(beam.DoFn):
    def __init__(self, fetcher_config: Any, at: datetime | None) -> None:
        self._config = fetcher_config
        self._at = at
        self._fetched = Metrics.counter("ratebeam", "scopes_fetched")

    def setup(self) -> None:
        self._fetcher = make_fetcher(self._config)

    def process(self, _impulse: bytes):
        try:
            scopes = self._fetcher.scopes(self._at)
        except ConnectorError as exc:
            if not is_frame_failure(exc):
                raise
            raise FatalConnectorError(f"{self._config.backend} fetcher: cannot list the scopes: {exc}") from exc
        LOG.info("fetched %d scope(s) from the %s fetcher", len(scopes), self._config.backend)
        self._fetched.inc(len(scopes))
        yield from scopes

    def teardown(self) -> None:
        fetcher = getattr(self, "_fetcher", None)
        if fetcher is not None:
            fetcher.close()


class FetchScopes(beam.PTransform):
    """Impulse → the scope ids of the configured fetcher at ``at`` (the cycle's now), one element per scope."""

    def __init__(self, fetcher_config: Any, at: datetime | None = None) -> None:
        super().__init__()
        self._config = fetcher_config
        self._at = at

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        """One impulse, then one fetcher call that emits every scope id."""
        return pbegin | "Impulse" >> beam.Impulse() | "Fetch" >> beam.ParDo(_FetchScopesFn(self._config, self._at))

"""The progress of ``ratebeam run``: periods due as scopes are planned, done as scopes commit.

The rating runs inside Beam, whose counters are read only when the pipeline has finished; the
planning and commit steps log each scope's figures as record attributes (``periods_due``,
``periods_committed``) instead, and this handler turns those records into progress.  Workers
running in this process (the in-memory runner, Prism LOOPBACK) are seen as they go; with workers
elsewhere the bar stays empty until the end, when the run's counters set the exact figures.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from ratebeam.pipelines.commands.progress import Progress, progress

#: The logger of the DoFns that plan and commit periods (``connectors.sql.state_transforms``).
STATE_LOGGER = "ratebeam.connectors.sql.state_transforms"


class _PeriodsHandler(logging.Handler):
    """Feeds a :class:`Progress` from the planning and commit records."""

    def __init__(self, shown: Progress) -> None:
        super().__init__(logging.INFO)
        self._shown = shown

    def emit(self, record: logging.LogRecord) -> None:
        due = getattr(record, "periods_due", None)
        if due is not None:
            self._shown.add_total(due)
        committed = getattr(record, "periods_committed", None)
        if committed is not None:
            self._shown.advance(committed)


@contextmanager
def periods_progress() -> Iterator[Progress]:
    """A run's :func:`progress` in periods, fed by its planning and commit records while it runs."""
    logger = logging.getLogger(STATE_LOGGER)
    with progress(None, "period", desc="ratebeam run: progress") as shown:
        handler = _PeriodsHandler(shown)
        logger.addHandler(handler)
        try:
            yield shown
        finally:
            logger.removeHandler(handler)

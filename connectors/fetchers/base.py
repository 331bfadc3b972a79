"""What a scope fetcher is: the bounded source of the scopes to rate (`cloudkitty/fetcher/__init__.py`)."""

from __future__ import annotations

import abc
from datetime import datetime


class Fetcher(abc.ABC):
    """Lists scope ids.  Built on workers from its (picklable) configuration."""

    name: str

    @abc.abstractmethod
    def scopes(self, at: datetime | None = None) -> list[str]:
        """The scope ids to consider this cycle, de-duplicated, in a stable order.

        ``at`` is the cycle's *now* (``run --now`` pretends one): a fetcher reading a time series
        lists the scopes present then, so a run over past data finds that data's scopes.
        """

    def counts(self) -> dict[str, int]:
        """Running totals this fetcher keeps (HTTP requests, samples left out), by figure name.

        The graph tallies how much they grow (``transforms.tallies``): a fetcher counts, the graph reports.
        """
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients."""

"""The ``source`` fetcher: a static scope list from the configuration (CloudKitty's ``fetcher_source``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from ratebeam.connectors.fetchers.base import Fetcher


class SourceFetcher(Fetcher):
    """Returns the configured scopes verbatim (de-duplicated, first occurrence kept)."""

    name = "source"

    def __init__(self, scopes: Sequence[str]) -> None:
        self._scopes = list(dict.fromkeys(scopes))

    def scopes(self, at: datetime | None = None) -> list[str]:
        """A copy of the configured list (whatever ``at``), so callers cannot change the fetcher's."""
        return list(self._scopes)

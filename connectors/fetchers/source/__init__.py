"""The ``source`` fetcher: a static list of scope ids (CloudKitty's ``fetcher_source``)."""

from __future__ import annotations

from typing import Any

from ratebeam.connectors.fetchers.base import Fetcher


def build(options: Any) -> Fetcher:
    """A ``SourceFetcher`` over ``options.scopes``."""
    from ratebeam.connectors.fetchers.source.fetcher import SourceFetcher

    return SourceFetcher(options.scopes)

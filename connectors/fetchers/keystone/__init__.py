"""The ``keystone`` fetcher: the projects where the rating user has the ``rating`` role (`cloudkitty/fetcher/keystone.py:55-105`).

Its Keystone session (``session.py``: keystoneauth1 tokens, the API calls through ``connectors.http``)
is shared with the Aetos collector.
"""

from __future__ import annotations

from typing import Any

from ratebeam.connectors.fetchers.base import Fetcher


def build(options: Any) -> Fetcher:
    """A ``KeystoneFetcher`` from the validated fetcher section."""
    from ratebeam.connectors.fetchers.keystone.fetcher import KeystoneFetcher

    return KeystoneFetcher(options.credentials, options.ignore_rating_role, options.ignore_disabled_tenants)

"""The ``aetos`` collector: CloudKitty's Prometheus queries sent through Aetos with a Keystone token.

Aetos is OpenStack's reverse proxy enforcing Keystone multi-tenancy in front of Prometheus.  The
query builder and HTTP client are the Prometheus collector's (``collectors/prometheus``), the
Keystone session the Keystone fetcher's (``fetchers/keystone/session.py``).
"""

from __future__ import annotations

from typing import Any

from ratebeam.connectors.collectors.base import Collector


def build(options: Any, scope_key: str) -> Collector:
    """An ``AetosCollector`` from the validated collector section (``batched`` shapes the graph)."""
    from ratebeam.connectors.collectors.aetos.collector import AetosCollector

    return AetosCollector(options.connection, scope_key)

"""The ``prometheus`` collector: CloudKitty's PromQL per metric, scope and period (`cloudkitty/collector/prometheus_base.py:115-174`).

Its HTTP client (``client.py``) and query builder (``promql.py``) are shared with the Prometheus
fetcher.
"""

from __future__ import annotations

from typing import Any

from ratebeam.connectors.collectors.base import Collector


def build(options: Any, scope_key: str) -> Collector:
    """A ``PrometheusCollector`` from the validated collector section (``batched`` shapes the graph)."""
    from ratebeam.connectors.collectors.prometheus.collector import PrometheusCollector

    return PrometheusCollector(options.connection, scope_key)

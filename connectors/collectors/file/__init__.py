"""The ``file`` collector: usage samples in Parquet, CSV or JSONL files at any fsspec URL."""

from __future__ import annotations

from typing import Any

from ratebeam.connectors.collectors.base import Collector


def build(options: Any, scope_key: str) -> Collector:
    """A ``FileCollector`` over ``options.url`` in ``options.format``, spilling past ``options.spill_rows``."""
    from ratebeam.connectors.collectors.file.collector import FileCollector

    return FileCollector(options.url, options.format, scope_key, options.spill_rows, options.spill_dir)

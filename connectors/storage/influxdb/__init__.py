"""The ``influxdb`` storage backend: CloudKitty's InfluxDB points over the v1 or the v2 API (`cloudkitty/storage/v2/influx.py:107-744`)."""

from __future__ import annotations

from typing import Any

from ratebeam.connectors.storage.base import StorageBackend


def build(options: Any) -> StorageBackend:
    """An ``InfluxDBStorage`` (v1) or ``InfluxDB2Storage`` (v2) as ``options`` says."""
    from ratebeam.connectors.storage.influxdb.backend import InfluxDBStorage

    return InfluxDBStorage.from_config(options)

"""Reprocessing into an HTTP backend: the demo rated into a real InfluxDB 1.6.7, re-rated after a crash.

The same checks as ``test_reprocessing.py`` (a ratebeam schedule and one CloudKitty's code
inserted, a SIGKILL mid-job then a rerun, a type and a resource gone, other scopes untouched),
read back through the backend's own ``retrieve``.
"""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime

import polars as pl
from pipeline_support import ratebeam, run_cycle
from reprocess_support import (
    RANGES,
    change_rules,
    drop_resources,
    influx_workspace,
    job_store,
    outside,
    schedule_both_after_a_change,
    within,
)
from servers import influxdb as influx_servers

from ratebeam.connectors.storage.influxdb.backend import InfluxDBStorage
from ratebeam.connectors.storage.influxdb.config import InfluxConnection

_influx_servers = influx_servers._influx_servers
influx_v1 = influx_servers.influx_v1


def _points(url: str, database: str) -> pl.DataFrame:
    backend = InfluxDBStorage(InfluxConnection(url=url, database=database))
    try:
        got = backend.retrieve(datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 5, tzinfo=UTC), limit=100_000)
    finally:
        backend.close()
    frame = pl.from_arrow(got.points)
    assert isinstance(frame, pl.DataFrame)
    columns = sorted(frame.columns)
    return frame.select(columns).sort(columns, nulls_last=True)


def test_reprocessing_into_influxdb_resumes_after_sigkill_and_replaces_stale_points(influx_v1, tmp_path):
    config, database = influx_workspace(tmp_path / "ws", influx_v1.url)
    assert run_cycle(config).returncode == 0
    before = _points(influx_v1.url, database)
    schedule_both_after_a_change(config)

    crashed = ratebeam("reprocess", "run", "-c", str(config), "--chunk", "2",
                       env={"RATEBEAM_FAILPOINT": "job-commit:3"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    store = job_store(config)
    assert any(j.current is not None and not j.finished for j in store.schedules())  # progress kept
    time.sleep(2.5)
    rerun = ratebeam("reprocess", "run", "-c", str(config), "--chunk", "2")
    assert rerun.returncode == 0, rerun.stderr
    assert all(j.finished for j in store.schedules())
    store.engine.dispose()

    ref_config, ref_database = influx_workspace(tmp_path / "ref", influx_v1.url)
    change_rules(ref_config)
    drop_resources(ref_config)
    assert run_cycle(ref_config).returncode == 0
    clean = _points(influx_v1.url, ref_database)

    after = _points(influx_v1.url, database)
    assert within(after, RANGES).equals(within(clean, RANGES))
    assert outside(after, RANGES).equals(outside(before, RANGES))
    assert not within(after, RANGES).equals(within(before, RANGES))
    gone = after.filter((pl.col("scope_id") == "globex") & (pl.col("begin") == datetime(2026, 1, 2, 3, tzinfo=UTC)))
    assert sorted(set(gone["type"].to_list())) == ["instance", "volume.size"]

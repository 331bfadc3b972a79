"""Faults in ``ratebeam serve`` on Prism: a storage outage of two ticks, an SDK worker killed mid-tick.

Both end where the bounded ``ratebeam run`` cycles at the same instants end, row for row: no
period lost, none stored twice.  Without a binding ``max_periods_per_run`` the tick after a fault
catches up on everything due, so the end state does not depend on which tick the fault hit.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from pipeline_support import ratebeam, setup_database, stored_rows, workspace
from servers import influxdb as influx_servers
from servers.prism import prism_endpoint  # noqa: F401  (session fixture)
from test_portable_runners import influx_rows, started_workers
from test_serve import STEP, T0, TICKS, Serving, leases, serve_args, states, wait_for

from ratebeam.connectors.sql.dead_letters import DeadLetterStore
from ratebeam.connectors.sql.models import DeadLetter
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.runners.launch import worker_pool

UNCAPPED = {"lease_seconds": 3}


def bounded_runs(config: Path) -> None:
    """The reference: TICKS bounded runs at the ticks' instants."""
    setup_database(config)
    for k in range(TICKS):
        done = ratebeam("run", "-c", str(config), "--now", (T0 + timedelta(seconds=k * STEP)).isoformat())
        assert done.returncode == 0, done.stderr


@pytest.fixture
def influx() -> Iterator[influx_servers.InfluxProcess]:
    try:
        with influx_servers.stoppable("v1") as server:
            yield server
    except influx_servers.InfluxUnavailable as exc:
        influx_servers.unavailable(str(exc))


def influx_workspace(root: Path, url: str, database: str) -> Path:
    config = workspace(root, **UNCAPPED)
    doc = yaml.safe_load(config.read_text())
    doc["storage"] = {"backends": [{"backend": "influxdb", "url": url, "database": database, "retries": 0,
                                    "timeout": 2}]}
    config.write_text(yaml.safe_dump(doc))
    return config


def test_a_storage_outage_of_two_ticks_is_caught_up(tmp_path, influx, prism_endpoint):  # noqa: F811
    """InfluxDB stopped after tick 0 committed and started again after tick 2 failed its writes:
    nothing is committed meanwhile, the failed frames are dead letters and counted, and tick 3
    catches up: the end equals the bounded runs'."""
    reference = influx_workspace(tmp_path / "bounded", influx.url, "reference")
    bounded_runs(reference)
    after_tick_0 = {s: "2026-01-01T03:00:00+00:00" for s in states(reference)}

    config = influx_workspace(tmp_path / "ws", influx.url, "served")
    setup_database(config)
    serving = Serving(serve_args(config, prism_endpoint))
    wait_for(lambda: states(config) == after_tick_0, "tick 0 to commit")
    influx.stop()
    # ticks 1 and 2 both plan every scope from 04:00 (tick 1 committed nothing) and fail to write
    wait_for(lambda: serving.count("period(s) due from 2026-01-01T04:00:00") == 8, "tick 2 to plan")
    failed_before = serving.count("not written")
    wait_for(lambda: serving.count("not written") > failed_before, "tick 2 to fail")
    assert states(config) == after_tick_0  # nothing of the outage committed
    influx.start()
    log = serving.wait()
    assert serving.proc.returncode == 0, log[-3000:]

    assert states(config) == states(reference)
    assert influx_rows(influx.url, "served") == influx_rows(influx.url, "reference")
    (run_id,) = set(re.findall(r"serve: run (\w+),", log))
    store = DeadLetterStore(load_config(config).database_url)
    with store.engine.connect() as conn:  # one row per failed frame, resolved once a later tick wrote it
        dead = conn.execute(sa.select(DeadLetter).where(DeadLetter.run_id == run_id)).all()
    store.engine.dispose()
    assert dead and {f.stage for f in dead} == {"write"}
    assert all(f.resolved_at is not None for f in dead)  # caught up: every failed frame committed after
    assert min(f.period_begin for f in dead).replace(tzinfo=None) == datetime(2026, 1, 1, 4)  # noqa: DTZ001
    assert int(re.findall(r"frames_failed_write=(\d+)", log)[-1]) == sum(f.failures for f in dead)


def runner_config_file(path: Path, endpoint: str, pool: str) -> Path:
    path.write_text(yaml.safe_dump({"runner": "PortableRunner", "prism": {"endpoint": endpoint},
                                    "environment": {"type": "EXTERNAL", "endpoint": pool}}))
    return path


def pool_workers(port: str) -> list[int]:
    """The PIDs of the SDK worker processes of the pool listening on ``port`` (its children)."""
    proc = Path("/proc")
    pools = [int(p.name) for p in proc.iterdir() if p.name.isdigit() and _cmdline(p).endswith(
        f"worker_pool_main --service_port={port}")]
    return [int(p.name) for p in proc.iterdir() if p.name.isdigit() and _ppid(p) in pools]


def _cmdline(process: Path) -> str:
    try:
        return (process / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _ppid(process: Path) -> int | None:
    try:
        return int((process / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _serve_on_pool(tmp_path: Path, endpoint: str, signum: int, after: str) -> tuple[Path, Path, str]:
    """``serve`` on an EXTERNAL worker pool, its worker sent ``signum`` once ``after`` ("tick 0", or "tick 1
    leased"); returns the bounded runs' workspace, the served one and the log.  A failed or stuck job
    (``--stall-timeout 12``) is started again, twice at most.

    Its five ticks last 50 s of wall clock (a tick every 10 s): a job started again after that has
    no tick left, so a stuck job must be found well before (the heartbeat beats every 5 s here)."""
    reference = workspace(tmp_path / "bounded", **UNCAPPED)
    bounded_runs(reference)
    after_tick_0 = {s: "2026-01-01T03:00:00+00:00" for s in states(reference)}
    config = workspace(tmp_path / "ws", **UNCAPPED)
    setup_database(config)
    log_path = tmp_path / "pool.log"
    with worker_pool(log_path) as pool:
        loopback = serve_args(config, endpoint, interval="10")
        runner = runner_config_file(tmp_path / "external.yaml", endpoint, pool)
        serving = Serving([*loopback[:3], "--runner-config", str(runner), *loopback[7:], "--max-restarts", "2",
                           "--stall-timeout", "12"])
        wait_for(lambda: states(config) == after_tick_0, "tick 0 to commit")
        if after == "tick 1 leased":
            wait_for(lambda: bool(leases(config)), "tick 1 to lease its scopes")
        (worker,) = pool_workers(pool.rsplit(":", 1)[1])
        os.kill(worker, signum)
        try:
            log = serving.wait()
        finally:
            with contextlib.suppress(ProcessLookupError):  # the pool stops the worker of a cancelled job
                os.kill(worker, signal.SIGKILL)
        assert serving.proc.returncode == 0, log[-3000:]
        assert started_workers(log_path) == 2, log[-4000:]  # the worker signalled and the restarted job's
    assert "starting it again" in log and "ratebeam serve: stopped after 2 job(s)" in log
    assert leases(config) == []
    return reference, config, log


def test_an_sdk_worker_killed_mid_tick_the_job_restarts_and_stores_the_same(tmp_path, prism_endpoint):  # noqa: F811
    """SIGKILL the EXTERNAL SDK worker process (not the launcher) while tick 1 holds its leases: the
    job fails (the worker was in a bundle) or is stuck (Prism waits for ever for a worker that died
    between bundles: the watchdog cancels it), ``serve`` releases its leases and starts it again
    (``--max-restarts``), and the end equals the bounded runs': no period lost, none stored twice."""
    reference, config, _ = _serve_on_pool(tmp_path, prism_endpoint, signal.SIGKILL, "tick 1 leased")
    assert states(config) == states(reference)
    assert stored_rows(config).equals(stored_rows(reference))


def test_a_frozen_sdk_worker_stalls_the_job_which_is_cancelled_and_started_again(tmp_path, prism_endpoint):  # noqa: F811
    """SIGSTOP the EXTERNAL SDK worker after tick 0: the runner waits for it for ever and the job stays
    RUNNING, while the launcher would renew its leases for ever.  Its heartbeat (``ratebeam_heartbeats``)
    stops, so after ``--stall-timeout`` the launcher cancels the job, releases its leases and starts it
    again on a new worker; the end equals the bounded runs'."""
    reference, config, log = _serve_on_pool(tmp_path, prism_endpoint, signal.SIGSTOP, "tick 0")
    assert re.search(r"ratebeam_heartbeats has not moved for \d+s", log), log[-3000:]
    assert "ended STALLED: starting it again" in log
    assert states(config) == states(reference)
    assert stored_rows(config).equals(stored_rows(reference))

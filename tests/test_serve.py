"""``ratebeam serve`` on Prism: N ticks store what N bounded ``ratebeam run`` cycles store, row for row.

The clock is simulated (``--now`` and ``--step``: tick k rates up to T0 + k × 6 h) and the cap of
4 periods per scope and cycle makes every tick's work depend on its own ``now``, so the comparison
is tick by tick, not only "everything got rated in the end".  The demo workspace: file usage,
Parquet storage, SQLite state.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import datetime, timedelta

import pytest
from pipeline_support import RATEBEAM, ratebeam, setup_database, stored_rows, workspace

from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.state_store import StateStore
from ratebeam.pipelines.config import load_config

pytest_plugins = ["servers.prism"]  # the prism_endpoint session fixture

T0 = datetime.fromisoformat("2026-01-01T06:00:00+00:00")
STEP = 6 * 3600
TICKS = 5
SETTINGS = {"max_periods_per_run": 4, "lease_seconds": 3}
INTERVAL = "5"  # wall seconds between ticks: more than a tick takes, so ticks never overlap


def states(config) -> dict[str, str]:
    cfg = load_config(config)
    store = StateStore(make_engine(cfg.database_url), cfg.scope_key, "source", "file")
    return {s.scope: s.last_processed.isoformat() for s in store.list_states()}


@pytest.fixture(scope="module")
def bounded(tmp_path_factory):
    """The reference: TICKS bounded runs at T0, T0 + 6 h, ..."""
    config = workspace(tmp_path_factory.mktemp("bounded"), **SETTINGS)
    setup_database(config)
    for k in range(TICKS):
        done = ratebeam("run", "-c", str(config), "--now", (T0 + timedelta(seconds=k * STEP)).isoformat())
        assert done.returncode == 0, done.stderr
    return stored_rows(config), states(config)


def serve_args(config, endpoint: str, first: int = 0, ticks: int = TICKS) -> list[str]:
    return ["serve", "-c", str(config), "--runner", "PortableRunner", f"--option=--job_endpoint={endpoint}",
            "--option=--environment_type=LOOPBACK", "--interval", INTERVAL,
            "--now", (T0 + timedelta(seconds=first * STEP)).isoformat(), "--step", str(STEP), "--ticks", str(ticks)]


def test_serve_help_names_its_options():
    done = ratebeam("serve", "--help")
    assert done.returncode == 0
    for option in ("--runner-config", "--interval", "--now", "--step", "--ticks", "--metrics-port"):
        assert option in done.stdout


def test_serve_refuses_the_in_memory_runner_in_one_line(tmp_path):
    config = workspace(tmp_path / "ws")
    setup_database(config)
    done = ratebeam("serve", "-c", str(config), "--ticks", "1")
    assert done.returncode == 2, done.stderr
    assert "ratebeam: serve needs a runner that runs unbounded sources" in done.stderr
    assert "Traceback" not in done.stderr


def test_five_ticks_store_what_five_bounded_runs_store(tmp_path, bounded, prism_endpoint):
    rows, state = bounded
    config = workspace(tmp_path / "ws", **SETTINGS)
    setup_database(config)
    done = ratebeam(*serve_args(config, prism_endpoint), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert states(config) == state
    assert stored_rows(config).equals(rows)
    assert state["globex"] == "2026-01-01T19:00:00+00:00"  # 5 ticks x at most 4 periods


def test_a_job_killed_mid_tick_and_started_again_stores_the_same(tmp_path, bounded, prism_endpoint):
    """SIGKILL the whole job (launcher and its loopback worker) while tick 2 works; its leases
    expire lease_seconds after its last heartbeat; ``serve`` started again from tick 2 catches up."""
    rows, state = bounded
    config = workspace(tmp_path / "ws", **SETTINGS)
    setup_database(config)
    proc = subprocess.Popen([*RATEBEAM, *serve_args(config, prism_endpoint)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RATEBEAM_LOG_LEVEL": "INFO"})  # the INFO lines read below
    log = []
    deadline = time.monotonic() + 300
    for line in proc.stderr:  # tick 2 plans the periods from 08:00
        log.append(line)
        if "period(s) due from 2026-01-01T08:00:00" in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert any("due from 2026-01-01T08:00:00" in line for line in log), "".join(log)[-3000:]
    assert max(states(config).values()) <= "2026-01-01T11:00:00+00:00"  # tick 2 not (all) committed
    time.sleep(float(SETTINGS["lease_seconds"]) + 1)  # the dead job's leases expire
    again = ratebeam(*serve_args(config, prism_endpoint, first=2, ticks=TICKS - 2), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert states(config) == state
    assert stored_rows(config).equals(rows)

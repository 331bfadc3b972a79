"""``run --wait-for-leases``: a scope whose lease a live run holds is rated, by the same command,
once that lease is free; without the flag it is skipped, as before.

The other run is this test process itself: alive (so never taken over), renewing its lease on
one scope every second until the waiting run has said what it waits for, then silent: the lease
expires and the waiting run rates the scope.
"""

from __future__ import annotations

import subprocess
import threading
from datetime import UTC, datetime

from pipeline_support import NOW, RATEBEAM, counters, setup_database, workspace

from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.lease_owner import make_owner
from ratebeam.connectors.sql.state_store import StateStore
from ratebeam.pipelines.config import load_config

TTL = 3


def test_run_waits_for_a_live_runs_lease_then_rates_its_scope(tmp_path):
    config = workspace(tmp_path / "ws")
    setup_database(config)
    cfg = load_config(config)
    store = StateStore(make_engine(cfg.database_url), cfg.scope_key, cfg.fetcher.backend, cfg.collector.backend)
    owner = make_owner("live")
    assert store.acquire("globex", owner, TTL, datetime.now(UTC))
    silent = threading.Event()

    def beat() -> None:
        while not silent.wait(1):
            store.heartbeat(owner, TTL, datetime.now(UTC))

    threading.Thread(target=beat, daemon=True).start()
    run = subprocess.Popen([*RATEBEAM, "run", "-c", str(config), "--now", NOW, "--wait-for-leases"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = next(line for line in run.stderr if "ratebeam run: waiting for" in line)
    finally:
        silent.set()
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, said + err[-3000:]
    assert f"waiting for 1 scope lease(s) of other runs; the first, scope globex's (run {owner}), expires at" in said
    first, second = (counters(line) for line in out.splitlines() if line.startswith("periods:"))
    assert first["due"] == first["committed"] > 0 and f"scope globex skipped: run {owner}" in out
    assert second["due"] == second["committed"] > 0  # globex's periods, after the wait
    states = {s.scope: s.last_processed for s in store.list_states()}
    assert "globex" in states and len(set(states.values())) == 1, states
    store.engine.dispose()

"""Two ``ratebeam run`` processes started together on one database rate each scope × period once.

The scope lease (an atomic conditional UPDATE) decides who rates a scope; the other process skips
it or finds it up to date (and exits 1 when it could rate nothing at all because of leases).  Checked on SQLite (WAL) and on the real PostgreSQL test server.
"""

from __future__ import annotations

import subprocess

from pipeline_support import NOW, RATEBEAM, counters, run_cycle, setup_database, stored_rows, workspace


def test_two_concurrent_runs_rate_every_period_exactly_once(tmp_path, db_url):
    config = workspace(tmp_path / "ws", database_url=db_url, rebatch_rows=40)
    setup_database(config)
    procs = [
        subprocess.Popen([*RATEBEAM, "run", "-c", str(config), "--now", NOW],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        # A run that found every scope leased by the other rated nothing: it says so and exits 1
        # (a streaming job must end with a non-zero status then).
        blocked = proc.returncode == 1 and "nothing was rated: other runs hold the lease" in err
        assert proc.returncode == 0 or blocked, err
    figures = [counters(out) for out, _ in outputs]
    # Every due period was planned, rated and committed by exactly one of the two processes.
    assert sum(f["committed"] for f in figures) == sum(f["due"] for f in figures) == 288
    rows = stored_rows(config)
    assert sum(f["rated"] for f in figures) == rows.height
    assert rows.select("scope_id", "type", "begin", "groupby.id").is_duplicated().sum() == 0
    # And nothing is left to do.
    assert counters(run_cycle(config).stdout)["due"] == 0

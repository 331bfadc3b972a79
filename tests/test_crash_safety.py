"""SIGKILL ``ratebeam run`` at chosen points, rerun, and get exactly the clean run's stored rows.

The crash points are real SIGKILLs (``ratebeam.failpoints``): during collection, between two
writes of one scope (batches of 40 rows, so a scope's periods span many writes), and after every
write but before the state commit.  A last case kills the process from outside at a random moment.
Every rerun starts at once, with the default ``lease_seconds``: the killed run's leases are taken
over because its process is gone, not waited for until they expire.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time

import pytest
import sqlalchemy as sa
from pipeline_support import (
    NOW,
    RATEBEAM,
    counters,
    parquet_workspace,
    ratebeam,
    run_cycle,
    setup_database,
    stored_rows,
    workspace,
)

from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.models import Lease
from ratebeam.pipelines.config import load_config

#: Small batches (the leases keep their default: a minute, far longer than the test waits).
SMALL_BATCHES = {"rebatch_rows": 40}


@pytest.fixture(scope="module")
def clean_rows(tmp_path_factory):
    config = workspace(tmp_path_factory.mktemp("clean"), **SMALL_BATCHES)
    setup_database(config)
    done = run_cycle(config)
    assert done.returncode == 0, done.stderr
    return stored_rows(config)


def _rerun_until_done(config) -> None:
    rerun = run_cycle(config)
    assert rerun.returncode == 0, rerun.stderr
    assert counters(rerun.stdout)["due"] == counters(rerun.stdout)["committed"]
    final = run_cycle(config)
    assert counters(final.stdout)["due"] == 0, final.stderr


@pytest.mark.parametrize(
    "failpoint",
    [
        "collect:6",  # in the middle of collection (6th call of 12: one per scope and metric, 72 periods each)
        "write:7",  # between writes: the 7th batch write, scopes half written
        "commit:1",  # every write acknowledged, before the first state commit
        "commit:3",  # some scopes committed, others not
    ],
)
def test_sigkill_then_rerun_stores_exactly_the_clean_rows(tmp_path, clean_rows, failpoint):
    config = workspace(tmp_path / "ws", **SMALL_BATCHES)
    setup_database(config)
    crashed = run_cycle(config, env={"RATEBEAM_FAILPOINT": failpoint})
    assert crashed.returncode == -signal.SIGKILL, (crashed.returncode, crashed.stderr[-2000:])
    _rerun_until_done(config)
    rows = stored_rows(config)
    assert rows.height == clean_rows.height
    assert rows.equals(clean_rows)


def _leases(config) -> int:
    engine = make_engine(load_config(config, metrics=False).database_url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(Lease)).scalar_one()
    except sa.exc.SQLAlchemyError:  # the run's first transaction still creating the file
        return 0
    finally:
        engine.dispose()


def test_sigkill_from_outside_at_a_random_moment(tmp_path, clean_rows, db_url):
    """On SQLite and on PostgreSQL, killed at a random moment of its work (it holds its leases from
    then on): the rerun right after the kill completes, and stores the clean rows."""
    seed = random.randrange(1 << 30)
    delay = random.Random(seed).uniform(0.0, 1.0)
    config = workspace(tmp_path / "ws", db_url if db_url.startswith("postgresql") else None, **SMALL_BATCHES)
    setup_database(config)
    proc = subprocess.Popen([*RATEBEAM, "run", "-c", str(config), "--now", NOW],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not _leases(config) and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    left = _leases(config)
    _rerun_until_done(config)
    assert stored_rows(config).equals(clean_rows), f"seed {seed}, killed {delay:.2f}s in, leaving {left} lease(s)"


def _debris(config) -> int:
    info = ratebeam("storage", "info", "-c", str(config), "-f", "json")
    assert info.returncode == 0, info.stderr
    (row,) = json.loads(info.stdout)
    return row["debris"]


def test_a_writer_killed_before_its_rename_leaves_debris_that_info_counts_and_the_rerun_removes(tmp_path,
                                                                                                clean_rows):
    """The parquet backend writes a temporary file, then renames it: killed in between, the hidden
    temporary files stay; ``storage info`` counts them and the rerun's writes of those slices remove them."""
    config = parquet_workspace(tmp_path / "ws", **SMALL_BATCHES)
    setup_database(config)
    crashed = run_cycle(config, env={"RATEBEAM_FAILPOINT": "parquet-rename:5"})
    assert crashed.returncode == -signal.SIGKILL, (crashed.returncode, crashed.stderr[-2000:])
    assert _debris(config) >= 1
    _rerun_until_done(config)
    assert _debris(config) == 0
    assert stored_rows(config).equals(clean_rows)

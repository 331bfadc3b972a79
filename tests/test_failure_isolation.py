"""A frame that cannot be rated fails alone: reported with its reason, never committed, never blocking.

A tenant threshold on a non-numeric field makes CloudKitty fail every frame of that tenant (spec
`cloudkitty/rating/hash/__init__.py:193-199`); ratebeam does the same for that scope only, the other scopes are rated and committed, the run
exits 1 with a summary, and once the rule is fixed the next run rates what was left.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
from pipeline_support import (
    break_rules_of,
    counters,
    fix_rules_of,
    run_cycle,
    setup_database,
    stored_rows,
    workspace,
)

from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.state_store import StateStore
from ratebeam.pipelines.config import load_config


def test_one_failing_scope_does_not_block_the_others(tmp_path):
    config = workspace(tmp_path / "ws")
    setup_database(config)
    break_rules_of(config)

    failed = run_cycle(config)
    assert failed.returncode == 1, failed.stderr
    assert "frame(s) failed" in failed.stdout
    failure_lines = [line for line in failed.stdout.splitlines() if line.startswith("  scope ")]
    assert failure_lines and all("scope globex" in line and "[rate]" in line for line in failure_lines)
    assert "os_distro" in failure_lines[0]

    cfg = load_config(config)
    states = {s.scope: s for s in StateStore(make_engine(cfg.database_url), "project_id", "source",
                                             "file").list_states()}
    # globex stops just before its first failed period (earlier hours had no instance: rated, committed).
    first_failed = datetime.fromisoformat(failure_lines[0].split()[3])
    assert states["globex"].last_processed == first_failed - timedelta(hours=1)
    for scope in ("acme-web", "acme-data", "initech"):
        assert states[scope].last_processed.isoformat() == "2026-01-03T23:00:00+00:00"
    # Nothing of a failed frame is stored (later frames that rated fine are, uncommitted: rewritten later).
    failed_begins = {datetime.fromisoformat(line.split()[3]) for line in failure_lines}
    globex = stored_rows(config).filter(pl.col("scope_id") == "globex")
    assert not failed_begins & set(globex["begin"].to_list())

    fix_rules_of(config)
    fixed = run_cycle(config)
    assert fixed.returncode == 0, fixed.stderr
    done_before = int((first_failed - datetime(2026, 1, 1, tzinfo=UTC)).total_seconds() // 3600)
    assert counters(fixed.stdout)["committed"] == 72 - done_before  # the rest of globex, nothing else
    assert "globex" in set(stored_rows(config)["scope_id"].unique())

"""One rating cycle through the real pipeline (DirectRunner, in memory): file usage → Parquet.

Runs against SQLite and the real PostgreSQL test server for the state.
"""

from __future__ import annotations

from decimal import Decimal

import polars as pl
import pytest
from pipeline_support import counters, run_cycle, setup_database, stored_rows, workspace


@pytest.fixture
def rated_workspace(tmp_path, db_url):
    config = workspace(tmp_path / "ws", database_url=db_url)
    setup_database(config)
    first = run_cycle(config)
    assert first.returncode == 0, first.stderr
    return config, first


def test_first_run_rates_every_due_period(rated_workspace):
    config, first = rated_workspace
    figures = counters(first.stdout)
    # 4 scopes x 72 hourly periods (2026-01-01..03), all due at 2026-01-04T02:00Z with wait_periods 2.
    assert figures["due"] == 288
    assert figures["committed"] == 288
    rows = stored_rows(config)
    assert rows.height == figures["written"] > 0
    assert set(rows["scope_id"].unique()) == {"acme-web", "acme-data", "globex", "initech"}
    assert set(rows["type"].unique()) == {"instance", "volume.size", "ip.floating"}


def test_second_run_rates_nothing_new_and_stores_nothing_twice(rated_workspace):
    config, _ = rated_workspace
    before = stored_rows(config)
    second = run_cycle(config)
    assert second.returncode == 0, second.stderr
    assert counters(second.stdout) == {"due": 0, "committed": 0, "rated": 0, "written": 0}
    after = stored_rows(config)
    assert after.equals(before)
    identity = ["scope_id", "type", "begin", "groupby.id"]
    assert after.select(identity).is_duplicated().sum() == 0


def test_prices_follow_the_rules(rated_workspace):
    """Spot-check prices against the rules by hand: flavor flat x qty, ssd volumes x 2.5, tenant override."""
    config, _ = rated_workspace
    rows = stored_rows(config)

    def price(scope: str, type_: str, **labels: str) -> set[Decimal]:
        cond = (pl.col("scope_id") == scope) & (pl.col("type") == type_) & (pl.col("qty") > 0)
        for key, value in labels.items():
            cond &= pl.col(key) == value
        return set(rows.filter(cond)["price"].to_list())

    # globex m1.small windows: compute 0.02 + license 0.03 per instance-hour.
    assert price("globex", "instance", **{"metadata.flavor_name": "m1.small"}) == {Decimal("0.05")}
    # acme-data m1.xlarge: the tenant rule (0.12) replaces the global 0.16; rhel license 0.015.
    assert price("acme-data", "instance", **{"metadata.flavor_name": "m1.xlarge"}) == {Decimal("0.135")}
    # acme-web ssd 50 GiB: 0.00012 x 2.5 x 50; hdd 200 GiB: 0.00012 x 200.
    assert price("acme-web", "volume.size", **{"metadata.volume_type": "ssd"}) == {Decimal("0.015")}
    assert price("acme-web", "volume.size", **{"metadata.volume_type": "hdd"}) == {Decimal("0.024")}
    # acme-data hdd 2000 GiB: the service threshold (>= 1000) rate 0.9 applies: 0.00012 x 2000 x 0.9.
    assert price("acme-data", "volume.size", **{"metadata.volume_type": "hdd"}) == {Decimal("0.216")}


def test_state_is_committed_to_the_last_due_period(rated_workspace):
    from ratebeam.connectors.sql.engine import make_engine
    from ratebeam.connectors.sql.state_store import StateStore
    from ratebeam.pipelines.config import load_config

    config, _ = rated_workspace
    cfg = load_config(config)
    states = StateStore(make_engine(cfg.database_url), cfg.scope_key, "source", "file").list_states()
    assert {s.scope: s.last_processed.isoformat() for s in states} == {
        scope: "2026-01-03T23:00:00+00:00" for scope in ("acme-web", "acme-data", "globex", "initech")
    }
    assert all(s.lease_owner is None for s in states)

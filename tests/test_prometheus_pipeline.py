"""The Prometheus collector and fetcher in the real pipeline: batched mode, a server that is down,
and a whole ``ratebeam run`` cycle into Parquet whose totals are computed by hand from the samples."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
from pipeline_support import counters, ratebeam, stored_rows
from prometheus_support import collector, expected, metric, period, qty, rows
from servers import prometheus as servers_prometheus
from servers.prometheus import DOMAINS, PROJECT_INFO, SCOPES, START, free_port, series

from ratebeam.connectors.errors import NoDataCollected
from ratebeam.connectors.sql import rules_repository
from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.migrations import upgrade
from ratebeam.pipelines.commands.rules import enable_hashmap_if_unset
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.cycle import run_cycle
from ratebeam.pipelines.interchange import read_rules
from ratebeam.pipelines.rating import load_rater
from ratebeam.transforms.schema import quantize_price

prometheus_server = servers_prometheus.prometheus_server  # the session fixture

METRICS = {
    "ratebeam_instance_up": {"alt_name": "instance", "unit": "instance", "groupby": ["id"],
                             "metadata": ["flavor_name", "os_distro"], "mutate": "NUMBOOL"},
    "ratebeam_volume_bytes": {"alt_name": "volume.size", "unit": "GiB", "factor": "1/1073741824",
                              "groupby": ["id"], "metadata": ["volume_type"]},
    "ratebeam_net_bytes_total": {"alt_name": "net", "unit": "B/s", "groupby": ["interface"],
                                 "extra_args": {"range_function": "rate", "aggregation_method": "sum"}},
}
FLAVOR_COST = {"m1.tiny": "0.01", "m1.small": "0.02", "m1.large": "0.08"}
VOLUME_COST = "0.0001"
RULES = {
    "groups": ["compute", "storage"],
    "services": [
        {"name": "instance", "fields": [{"name": "flavor_name", "mappings": [
            {"value": v, "type": "flat", "cost": c, "group": "compute"} for v, c in FLAVOR_COST.items()]}]},
        {"name": "volume.size", "mappings": [{"type": "flat", "cost": VOLUME_COST, "group": "storage"}]},
    ],
}
NOW = START + timedelta(hours=6)  # wait_periods 1: periods 00:00..04:00 are due (04:00 has no samples)


def definitions():
    return [metric(name, **dict(d)) for name, d in METRICS.items()]


# ---- batched mode ----


def test_batched_gives_the_same_rows_with_fewer_requests(prometheus_server):
    per_scope, batched = collector(prometheus_server.api), collector(prometheus_server.api, batched=True)
    frames = [(s, h, m) for h in range(5) for m in definitions() for s in SCOPES]
    got = {}
    for name, col in (("per_scope", per_scope), ("batched", batched)):
        out = []
        for scope, hour, m in frames:
            try:
                out.append(rows(col.collect(scope, *period(hour), m)))
            except NoDataCollected:
                continue
        got[name] = pl.concat(out, how="diagonal_relaxed")
    assert got["batched"].height > 0
    assert got["batched"].equals(got["per_scope"])
    assert per_scope.requests == len(frames)
    assert batched.requests == 5 * len(METRICS)  # one query per metric x period, all scopes


# ---- the whole cycle ----


def workspace(root: Path, api: str, *, batched: bool = False, fetcher: dict | None = None, **collector_extra) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "metrics.yml").write_text(json.dumps({"metrics": METRICS}))  # JSON is YAML
    (root / "rules.json").write_text(json.dumps(RULES))
    config = {
        "database_url": f"sqlite:///{root / 'ratebeam.db'}",
        "period": 3600, "wait_periods": 1, "metrics": "metrics.yml",
        "fetcher": fetcher or {"backend": "prometheus", "url": api, "metric": PROJECT_INFO},
        "collector": {"backend": "prometheus", "url": api, "batched": batched, "timeout": 10, **collector_extra},
        "storage": {"backends": [{"backend": "parquet", "url": "rated/"}]},
    }
    (root / "ratebeam.yaml").write_text(json.dumps(config))
    return root / "ratebeam.yaml"


def run(path: Path):
    config = load_config(path)
    engine = make_engine(config.database_url)
    upgrade(engine)
    rules_repository.replace_rules(engine, read_rules(path.parent / "rules.json"))
    enable_hashmap_if_unset(engine)
    rater = load_rater(engine, config.metrics)
    engine.dispose()
    return run_cycle(config, rater, now=NOW)


def hand_totals() -> dict[str, tuple[Decimal, Decimal]]:
    """(qty, price) per type over the 4 hours with data and every scope, from the generated samples."""
    defs = {m.rating_type: m for m in definitions()}
    totals = {t: [Decimal(0), Decimal(0)] for t in defs}
    for hour in range(4):
        for s in series("ratebeam_instance_up"):
            q = qty(expected(s, "max", hour), defs["instance"])
            totals["instance"][0] += q
            totals["instance"][1] += quantize_price(q * Decimal(FLAVOR_COST[s.labels["flavor_name"]]))
        for s in series("ratebeam_volume_bytes"):
            q = qty(expected(s, "max", hour), defs["volume.size"])
            totals["volume.size"][0] += q
            totals["volume.size"][1] += quantize_price(q * Decimal(VOLUME_COST))  # stored at scale 20
        for s in series("ratebeam_net_bytes"):
            window = s.window(period(hour)[1], 3600)
            # rate() over evenly spaced samples of a straight line is its slope (per second); the
            # counters start far from 0, so Prometheus extrapolates to both window edges every hour
            totals["net"][0] += qty((window[-1] - window[0]) / (60 * (len(window) - 1)), defs["net"])
    return {t: (q, p) for t, (q, p) in totals.items()}


@pytest.fixture(scope="module")
def per_scope_run(prometheus_server, tmp_path_factory):
    path = workspace(tmp_path_factory.mktemp("prom-e2e"), prometheus_server.api)
    return path, run(path)


def test_run_stores_the_totals_computed_by_hand(per_scope_run):
    path, report = per_scope_run
    assert report.ok, report.failures
    assert report.counters["scopes_fetched"] == len(DOMAINS)
    assert report.counters["periods_committed"] == len(SCOPES) * 5
    stored = stored_rows(path)
    assert set(stored["scope_id"]) == set(SCOPES)
    got = {t: (sum(g["qty"].to_list(), Decimal(0)), sum(g["price"].to_list(), Decimal(0)))
           for (t,), g in stored.group_by("type")}
    assert got == hand_totals()
    # one request per scope x period x metric, plus the fetcher's one
    assert report.counters["prometheus_requests"] == len(SCOPES) * 5 * len(METRICS) + 1


def test_batched_run_stores_the_same_rows_with_fewer_requests(prometheus_server, per_scope_run, tmp_path):
    path, report = per_scope_run
    batched_path = workspace(tmp_path / "batched", prometheus_server.api, batched=True)
    batched = run(batched_path)
    assert batched.ok, batched.failures
    assert stored_rows(batched_path).equals(stored_rows(path))
    assert batched.counters["collector_calls"] == report.counters["collector_calls"] == len(SCOPES) * 5 * len(METRICS)
    # one query per metric x period for all scopes (one worker, one collector), plus the fetcher's one
    assert batched.counters["prometheus_requests"] == 5 * len(METRICS) + 1


def test_server_down_fails_frames_not_the_run(tmp_path):
    down = f"http://127.0.0.1:{free_port()}/api/v1"
    path = workspace(tmp_path / "down", down, fetcher={"backend": "source", "scopes": ["p1", "p2"]},
                     retries=1, backoff=0.01)
    report = run(path)
    assert not report.ok
    assert {f.scope_id for f in report.failures} == {"p1", "p2"}
    assert all("RetriableConnectorError" in f.reason and "after 2 attempts" in f.reason for f in report.failures)
    assert report.counters.get("periods_committed", 0) == 0
    assert stored_rows(path).height == 0


def test_batched_cache_eviction_only_costs_requests(prometheus_server, monkeypatch):
    from ratebeam.connectors.collectors.prometheus import collector as module

    monkeypatch.setattr(module, "CACHE_POINTS", 1)  # keep only the newest (metric, period) result
    small, plain = collector(prometheus_server.api, batched=True), collector(prometheus_server.api)
    up = definitions()[0]
    for hour in (0, 1, 0, 1):
        for scope in ("p1", "p2"):
            assert rows(small.collect(scope, *period(hour), up)).equals(rows(plain.collect(scope, *period(hour), up)))
    assert small.requests == 4  # each hour change evicts the other hour's result


def test_ratebeam_run_cli(prometheus_server, per_scope_run, tmp_path):
    """The same cycle through the command line a user runs: same stored rows, exit status 0."""
    path = workspace(tmp_path / "cli", prometheus_server.api)
    for args in (("db", "upgrade", "-c", str(path)), ("rules", "import", "-c", str(path), str(path.parent / "rules.json"))):
        done = ratebeam(*args)
        assert done.returncode == 0, done.stderr
    done = ratebeam("run", "-c", str(path), "--now", NOW.isoformat())
    assert done.returncode == 0, done.stderr
    assert counters(done.stderr)["committed"] == len(SCOPES) * 5
    assert stored_rows(path).equals(stored_rows(per_scope_run[0]))
    # The run prints its request counts: one Prometheus request per scope x period x metric + the fetch.
    assert f"{len(SCOPES) * 5 * len(METRICS) + 1} Prometheus HTTP requests" in done.stderr

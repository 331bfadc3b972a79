"""The Prometheus collector and fetcher in the real pipeline: batched mode (the default where exact),
a server that is down, and a whole ``ratebeam run`` cycle into Parquet whose totals are computed by hand
from the samples."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

import apache_beam as beam
import polars as pl
import pyarrow as pa
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from pipeline_support import counters, ratebeam, stored_rows
from prometheus_support import collector, expected, metric, period, qty, rows, usage
from servers import prometheus as servers_prometheus
from servers.prometheus import DOMAINS, PROJECT_INFO, SCOPES, START, free_port, series

from ratebeam.connectors.collectors.collect_transform import CollectUsage
from ratebeam.connectors.errors import NoDataCollected
from ratebeam.connectors.sql import rules_repository
from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.migrations import upgrade
from ratebeam.pipelines.commands.rules import enable_hashmap_if_unset
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.cycle import run_cycle
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.interchange import read_rules
from ratebeam.pipelines.rating import load_rater
from ratebeam.transforms.convert_usage import ConvertUsage, convert_samples
from ratebeam.transforms.frames import Frame, manifest
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
    per_scope, batched = collector(prometheus_server.api), collector(prometheus_server.api)
    frames = [(s, h, m) for h in range(5) for m in definitions() for s in SCOPES]
    got = {"per_scope": [], "batched": []}
    for scope, hour, m in frames:
        try:
            got["per_scope"].append(usage(per_scope, scope, *period(hour), m))
        except NoDataCollected:
            continue
    for hour in range(5):
        for m in definitions():
            found = batched.collect_all(*period(hour), m)  # what the batched stage sends per (period, metric)
            got["batched"] += [rows(convert_samples(found[s], [m], batched.numeric_context))
                               for s in SCOPES if s in found]
    got = {name: pl.concat(out, how="diagonal_relaxed") for name, out in got.items()}
    assert got["batched"].height > 0
    assert got["batched"].equals(got["per_scope"])
    assert per_scope.requests == len(frames)
    assert batched.requests == 5 * len(METRICS)  # one query per metric x period, all scopes


# ---- the whole cycle ----


def workspace(root: Path, api: str, *, batched: bool | None = None, fetcher: dict | None = None,
              metrics: dict | None = None, **collector_extra) -> Path:
    """A ratebeam.yaml over ``api`` (``batched`` None: the key is absent, the default)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "metrics.yml").write_text(json.dumps({"metrics": metrics or METRICS}))  # JSON is YAML
    if batched is not None:
        collector_extra["batched"] = batched
    (root / "rules.json").write_text(json.dumps(RULES))
    config = {
        "database_url": f"sqlite:///{root / 'ratebeam.db'}",
        "period": 3600, "wait_periods": 1, "metrics": "metrics.yml",
        "fetcher": fetcher or {"backend": "prometheus", "url": api, "metric": PROJECT_INFO},
        "collector": {"backend": "prometheus", "url": api, "timeout": 10, **collector_extra},
        "storage": {"backends": [{"backend": "parquet", "url": "rated/"}]},
    }
    (root / "ratebeam.yaml").write_text(json.dumps(config))
    return root / "ratebeam.yaml"


def prepare(path: Path):
    """``db upgrade`` and the rules of the workspace: (configuration, rater) for ``run_cycle`` (the bench
    bench/bench_prometheus_cycle.py times the cycle alone)."""
    config = load_config(path)
    engine = make_engine(config.database_url)
    upgrade(engine)
    rules_repository.replace_rules(engine, read_rules(path.parent / "rules.json"))
    enable_hashmap_if_unset(engine)
    rater = load_rater(engine, config.metrics)
    engine.dispose()
    return config, rater


def run(path: Path, now: datetime = NOW):
    """One in-process cycle at ``now`` on a prepared workspace."""
    return run_cycle(*prepare(path), now=now)


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
    path = workspace(tmp_path_factory.mktemp("prom-e2e"), prometheus_server.api, batched=False)
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


@pytest.mark.parametrize("batched", [None, True], ids=["default", "batched-true"])
def test_batched_run_stores_the_same_rows_with_fewer_requests(prometheus_server, per_scope_run, tmp_path, batched):
    """Without ``batched`` (the default) as with ``batched: true``: every metric here has no
    query_prefix/suffix, so every one is batched."""
    path, report = per_scope_run
    batched_path = workspace(tmp_path / "batched", prometheus_server.api, batched=batched)
    before = prometheus_server.queries_answered()
    batched = run(batched_path)
    answered = prometheus_server.queries_answered() - before
    assert batched.ok, batched.failures
    assert stored_rows(batched_path).equals(stored_rows(path))
    assert batched.counters["collector_calls"] == report.counters["collector_calls"] == len(SCOPES) * 5 * len(METRICS)
    # one query per metric x period for all scopes (one worker, one collector), plus the fetcher's one
    assert batched.counters["prometheus_requests"] == answered == 5 * len(METRICS) + 1


#: The metrics above with the volume's query wrapped in ``sum(`` … ``)``: it cannot be batched exactly.
SUMMED = {**METRICS, "ratebeam_volume_bytes": {**METRICS["ratebeam_volume_bytes"],
                                               "extra_args": {"query_prefix": "sum(", "query_suffix": ")"}}}


def test_a_metric_with_a_prefix_is_collected_per_scope_by_default(prometheus_server, tmp_path):
    """The default mixes: the volume (``sum(`` prefix) per scope, the two other metrics batched, in
    one run, and stores what ``batched: false`` stores (batching the volume would lose it: see
    test_prometheus_collector's test_a_prefix_that_aggregates_scopes_would_lose_usage_if_batched)."""
    reports, stored = {}, {}
    for name, batched in (("default", None), ("per-scope", False)):
        path = workspace(tmp_path / name, prometheus_server.api, batched=batched, metrics=SUMMED)
        reports[name] = run(path)
        assert reports[name].ok, reports[name].failures
        stored[name] = stored_rows(path)
    assert stored["default"].equals(stored["per-scope"])
    volume = stored["default"].filter(pl.col("type") == "volume.size")
    assert set(volume["scope_id"]) == {"p1", "p2"} and volume.height == 2 * 4  # one summed point per scope-hour
    periods = 5
    # per scope: every (scope, period, metric), plus the fetcher's request
    assert reports["per-scope"].counters["prometheus_requests"] == len(SCOPES) * periods * len(METRICS) + 1
    # default: the volume per (scope, period), the two others once per period
    assert reports["default"].counters["prometheus_requests"] == len(SCOPES) * periods + 2 * periods + 1


def test_batched_true_with_a_prefix_is_a_configuration_error(prometheus_server, tmp_path):
    path = workspace(tmp_path, prometheus_server.api, batched=True, metrics=SUMMED)
    with pytest.raises(InputError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: collector.batched: true, but metric 'ratebeam_volume_bytes' cannot be batched: its "
        "query_prefix/query_suffix may aggregate the scope away (remove batched to collect it per scope "
        "and the others batched)"
    )
    done = ratebeam("run", "-c", str(path), "--now", NOW.isoformat())
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [f"ratebeam: {info.value}"]


@pytest.fixture(scope="module")
def small_prometheus(tmp_path_factory):
    """A Prometheus over the same samples that refuses a query holding more than 64 samples at once.

    Measured on 2.42: ``max(max_over_time(m[3600s])) by (...)`` holds one series' 60 one-minute
    samples at a time plus the results so far, so one scope's instances (2 series at most: 62) and
    all scopes' volumes or counters (2 series each: 62) fit, all scopes' instances (6 series: 66) do not.
    """
    with servers_prometheus.backfilled(tmp_path_factory.mktemp("prometheus-small"),
                                       flags=("--query.max-samples=64",)) as server:
        yield server


def test_a_batched_query_prometheus_refuses_is_sent_scope_by_scope(small_prometheus, per_scope_run, tmp_path, caplog):
    """The instances' query for all scopes is too big for this server: each (period) is retried per
    scope, and the run stores exactly what the per-scope run stores."""
    path = workspace(tmp_path, small_prometheus.api)
    report = run(path)
    assert report.ok, report.failures
    assert stored_rows(path).equals(stored_rows(per_scope_run[0]))
    periods, refused = 5, 4  # 04:00 has no samples: its query loads none and is answered
    # the instances: per refused period, the query for all scopes then one per scope; per other period,
    # the query for all scopes; the two other metrics batched; the fetcher's request
    assert report.counters["prometheus_requests"] == refused * (1 + len(SCOPES)) + (periods - refused) \
        + 2 * periods + 1
    logged = [r.getMessage() for r in caplog.records if "scope by scope instead" in r.getMessage()]
    assert len(logged) == refused and all("ratebeam_instance_up" in m for m in logged)


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


def _points(batch: pa.RecordBatch) -> list[tuple]:
    """The points of a usage batch, each as its sorted (column, value) pairs without absent labels."""
    return [tuple(sorted((k, v) for k, v in row.items() if v is not None))
            for row in pl.from_arrow(batch).iter_rows(named=True)]


def test_batched_stage_sends_one_request_per_metric_and_period_for_all_scopes(prometheus_server, tmp_path):
    """The batched stage groups frames by (period, metric) in the graph: one query per group however
    the frames are shuffled across workers (two here), and every frame still gets all its metrics."""
    config = load_config(workspace(tmp_path, prometheus_server.api, batched=True))
    metrics, hours = config.metrics.metrics, range(5)
    plain = collector(prometheus_server.api)
    want = []
    for scope in SCOPES:
        for hour in hours:
            for m in metrics:
                try:
                    want += _points(convert_samples(plain.collect(scope, *period(hour), m), [m], plain.numeric_context))
                except NoDataCollected:
                    continue
    options = PipelineOptions(["--direct_num_workers=2", "--direct_running_mode=multi_threading"])
    pipeline = beam.Pipeline(runner="FnApiRunner", options=options)
    items = (pipeline | beam.Create([(s, period(h)[0]) for s in SCOPES for h in hours])
             | beam.Reshuffle())
    collected = items | CollectUsage(config.collector, metrics, 3600, "project_id")
    converted = collected["samples"] | ConvertUsage(metrics, config.rebatch_rows)
    assert_that(converted.usage | beam.FlatMap(_points), equal_to(want), label="SameUsage")
    assert_that(collected["samples"] | beam.FlatMap(manifest),
                equal_to([Frame(s, period(h)[0]) for s in SCOPES for h in hours]), label="EveryFrameOnce")
    assert_that(collected["failures"], equal_to([]), label="NoFailure")
    result = pipeline.run()
    result.wait_until_finish()
    requests = result.metrics().query(MetricsFilter().with_name("prometheus_requests"))["counters"]
    assert sum(c.committed or c.attempted for c in requests) == len(hours) * len(metrics)


def test_batched_stage_fails_the_frames_of_a_failing_metric_as_a_unit(prometheus_server, tmp_path):
    """One (period, metric) query failing fails every frame of that period, and only those (`cloudkitty/orchestrator.py:418-443`)."""
    path = workspace(tmp_path, prometheus_server.api, batched=True)
    bad = {**METRICS, "ratebeam_net_bytes_total": {**METRICS["ratebeam_net_bytes_total"],
                                                   "extra_args": {"range_function": "irange"}}}
    (path.parent / "metrics.yml").write_text(json.dumps({"metrics": bad}))
    config = load_config(path)
    pipeline = beam.Pipeline(runner="FnApiRunner")
    items = pipeline | beam.Create([(s, period(h)[0]) for s in ("p1", "p2") for h in (0, 1)])
    collected = items | CollectUsage(config.collector, config.metrics.metrics, 3600, "project_id")
    assert_that(collected["samples"], equal_to([]), label="NoSamples")
    assert_that(collected["failures"] | beam.Map(lambda o: (o.scope_id, o.begin, o.ok, o.stage, "irange" in o.reason)),
                equal_to([(s, period(h)[0], False, "collect", True) for s in ("p1", "p2") for h in (0, 1)]),
                label="EveryFrameFails")
    pipeline.run().wait_until_finish()


def test_ratebeam_run_cli(prometheus_server, per_scope_run, tmp_path):
    """The same cycle through the command line a user runs, with the collector's defaults (batched:
    no metric has a query_prefix/suffix): the per-scope run's rows, exit status 0."""
    path = workspace(tmp_path / "cli", prometheus_server.api)
    for args in (("db", "upgrade", "-c", str(path)), ("rules", "import", "-c", str(path), str(path.parent / "rules.json"))):
        done = ratebeam(*args)
        assert done.returncode == 0, done.stderr
    done = ratebeam("run", "-c", str(path), "--now", NOW.isoformat())
    assert done.returncode == 0, done.stderr
    assert counters(done.stdout)["committed"] == len(SCOPES) * 5
    assert stored_rows(path).equals(stored_rows(per_scope_run[0]))
    # The run prints its request counts: one Prometheus request per period x metric + the fetch.
    assert f"{len(SCOPES) * 5 * len(METRICS)} collector calls, {5 * len(METRICS) + 1} Prometheus HTTP requests" \
        in done.stdout


def test_run_now_over_past_data_fetches_the_scopes_present_then(prometheus_server, tmp_path):
    """The fetcher queries at ``--now``: the backfilled (long stale) usage's scopes are found and rated."""
    path = workspace(tmp_path / "past", prometheus_server.api,
                     fetcher={"backend": "prometheus", "url": prometheus_server.api, "metric": "ratebeam_instance_up"})
    for args in (("db", "upgrade", "-c", str(path)), ("rules", "import", "-c", str(path), str(path.parent / "rules.json"))):
        assert ratebeam(*args).returncode == 0
    now = START + timedelta(hours=4)  # the usage's last samples are within Prometheus' 5-minute lookback
    done = ratebeam("run", "-c", str(path), "--now", now.isoformat())
    assert done.returncode == 0, done.stderr
    assert f"scopes: {len(SCOPES)} fetched, {len(SCOPES)} rated" in done.stdout
    assert counters(done.stdout)["committed"] == len(SCOPES) * 3  # 00:00, 01:00, 02:00 (wait_periods 1)

"""The Gnocchi collector and fetcher against a real Gnocchi 4.7.1 (``servers.gnocchi``).

Expectations are computed by hand from the measures the fixture loaded (``servers.gnocchi.RESOURCES``):
Gnocchi's buckets (``floor(t / granularity)``), the aggregation of each bucket, and CloudKitty's rule
that a group's quantity is its **first** aggregate in the period.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import polars as pl
import pytest
from pipeline_support import ratebeam, stored_rows
from servers import free_port
from servers import gnocchi as servers_gnocchi
from servers.gnocchi import HOSTILE, P1, P2, RESOURCES, Resource

from ratebeam.connectors.collectors.gnocchi.client import (
    GnocchiAnswerError,
    GnocchiConnection,
    GnocchiRefused,
)
from ratebeam.connectors.collectors.gnocchi.collector import GnocchiCollector
from ratebeam.connectors.collectors.gnocchi.revisions import filter_revisions
from ratebeam.connectors.errors import NoDataCollected, RetriableConnectorError, SkippableConnectorError
from ratebeam.connectors.fetchers.gnocchi.fetcher import GnocchiFetcher
from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.state_store import StateStore
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.metrics_config import load_metrics, parse_metrics
from ratebeam.transforms.conversion import convert_value
from ratebeam.transforms.convert_usage import convert_samples
from ratebeam.transforms.metric_defs import MetricDef
from ratebeam.transforms.schema import quantize_price

gnocchi_server = servers_gnocchi.gnocchi_server  # the session fixture
pytestmark = pytest.mark.postgres

AGGREGATIONS = {
    "mean": statistics.fmean, "max": max, "min": min, "sum": math.fsum, "last": lambda v: v[-1],
    "count": lambda v: float(len(v)),
}
#: CloudKitty's default metrics.yml for Gnocchi (etc/cloudkitty/metrics.yml): ``mean``, and 300 s buckets
#: for instances and volumes.
DEFAULT_METRICS = {
    "cpu": {"unit": "instance", "alt_name": "instance", "groupby": ["id", "user_id", "project_id"],
            "metadata": ["flavor_name", "flavor_id", "vcpus"], "mutate": "NUMBOOL",
            "extra_args": {"aggregation_method": "mean", "resource_type": "instance", "force_granularity": 300}},
    "image.size": {"unit": "MiB", "factor": "1/1048576", "groupby": ["id", "user_id", "project_id"],
                   "metadata": ["container_format", "disk_format"],
                   "extra_args": {"aggregation_method": "mean", "resource_type": "image"}},
    "volume.size": {"unit": "GiB", "groupby": ["id", "user_id", "project_id"], "metadata": ["volume_type"],
                    "extra_args": {"aggregation_method": "mean", "resource_type": "volume", "force_granularity": 300}},
    "network.outgoing.bytes.rate": {"unit": "MB", "groupby": ["id", "project_id", "user_id"], "factor": "3600/1000000",
                                    "metadata": ["instance_id"],
                                    "extra_args": {"aggregation_method": "mean",
                                                   "resource_type": "instance_network_interface"}},
    "ip.floating": {"unit": "ip", "groupby": ["id", "user_id", "project_id"], "metadata": ["state"],
                    "mutate": "NUMBOOL", "extra_args": {"aggregation_method": "mean", "resource_type": "network"}},
}


def metric(name: str, **definition) -> MetricDef:
    """One metrics.yml definition, validated for the gnocchi collector (scope key and resource_key appended)."""
    definition.setdefault("unit", "u")
    return parse_metrics({"metrics": {name: definition}}, "metrics.yml", "project_id", "gnocchi").metrics[0]


def default(name: str) -> MetricDef:
    return metric(name, **json.loads(json.dumps(DEFAULT_METRICS[name])))


def collector(server, **connection) -> GnocchiCollector:
    connection.setdefault("username", "admin")
    return GnocchiCollector(GnocchiConnection(server.url, timeout=30, retries=0, **connection), "project_id")


def period(server, hour: int) -> tuple[datetime, datetime]:
    return server.at(hour), server.at(hour + 1)


def usage(col: GnocchiCollector, scope: str, begin: datetime, end: datetime, m: MetricDef) -> pl.DataFrame:
    return pl.from_arrow(convert_samples(col.collect(scope, begin, end, m), [m], col.numeric_context))


def first_aggregate(r: Resource, name: str, agg: str, granularity: int, hour: int) -> float | None:
    """The first non-empty ``granularity`` bucket of ``r``'s measures in hour ``hour``, aggregated."""
    buckets: dict[int, list[float]] = {}
    for second, value in r.measures.get(name, ()):
        bucket = second // granularity * granularity
        if hour * 3600 <= bucket < (hour + 1) * 3600:
            buckets.setdefault(bucket, []).append(value)
    return AGGREGATIONS[agg](buckets[min(buckets)]) if buckets else None


def resources(scope: str, type_: str, name: str) -> list[Resource]:
    return [r for r in RESOURCES if r.project_id == scope and r.type == type_ and name in r.measures]


def expected(scope: str, type_: str, name: str, m: MetricDef, agg: str, granularity: int, hour: int) -> dict:
    """id -> qty for every resource of the scope with measures in the hour."""
    out = {}
    for r in resources(scope, type_, name):
        raw = first_aggregate(r, name, agg, granularity, hour)
        if raw is not None:
            out[r.id] = convert_value(raw, m)
    return out


def qty_by_id(frame: pl.DataFrame) -> dict:
    return dict(zip(frame["groupby.id"].to_list(), frame["qty"].to_list(), strict=True))


# ---- collector: CloudKitty's default metrics and every aggregation ----


@pytest.mark.parametrize("name", sorted(DEFAULT_METRICS))
def test_default_metrics_quantities_equal_hand_aggregates(gnocchi_server, name):
    col, m = collector(gnocchi_server), default(name)
    args = m.extra_args
    found_any = False
    for scope in (P1, P2):
        for hour in range(4):
            want = expected(scope, args.resource_type, name, m, "mean", args.force_granularity, hour)
            try:
                got = qty_by_id(usage(col, scope, *period(gnocchi_server, hour), m))
            except NoDataCollected:
                got = {}
            assert got == want, (scope, hour)
            found_any |= bool(got)
    assert found_any


def test_first_bucket_of_a_finer_granularity_is_the_quantity(gnocchi_server):
    """cpu of instance 1 rises by 1 every 5 minutes: 300 s buckets give the period's first (10 + 12 h),
    3600 s buckets the hour's mean (10 + 12 h + 5.5)."""
    col = collector(gnocchi_server)
    fine = metric("cpu", groupby=["id"], extra_args={"aggregation_method": "mean", "resource_type": "instance",
                                                     "force_granularity": 300})
    coarse = metric("cpu", groupby=["id"], extra_args={"aggregation_method": "mean", "resource_type": "instance"})
    for hour in range(4):
        first = qty_by_id(usage(col, P1, *period(gnocchi_server, hour), fine))["aaaaaaaa-0000-0000-0000-000000000001"]
        mean = qty_by_id(usage(col, P1, *period(gnocchi_server, hour), coarse))["aaaaaaaa-0000-0000-0000-000000000001"]
        assert (first, mean) == (Decimal(10 + 12 * hour), Decimal(10 + 12 * hour) + Decimal("5.5"))


@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
def test_every_aggregation_method(gnocchi_server, agg):
    col = collector(gnocchi_server)
    m = metric("cpu", groupby=["id"], extra_args={"aggregation_method": agg, "resource_type": "instance"})
    for hour in range(4):
        got = qty_by_id(usage(col, P1, *period(gnocchi_server, hour), m))
        assert got == expected(P1, "instance", "cpu", m, agg, 3600, hour)


def test_rate_re_aggregation_starts_one_granularity_earlier(gnocchi_server):
    """``rate:mean`` needs the previous bucket: volume 1 grows by 10 GiB an hour, so every hour but the
    first (no bucket before the data) rates 10."""
    col = collector(gnocchi_server)
    m = metric("volume.size", groupby=["id"], extra_args={"aggregation_method": "mean", "resource_type": "volume",
                                                          "re_aggregation_method": "rate:mean"})
    with pytest.raises(NoDataCollected):
        usage(col, P1, *period(gnocchi_server, 0), m)
    for hour in (1, 2, 3):
        assert qty_by_id(usage(col, P1, *period(gnocchi_server, hour), m)) == {
            "bbbbbbbb-0000-0000-0000-000000000001": Decimal(10)}


def test_resource_key_groups_several_resources(gnocchi_server):
    """``resource_key: host`` makes one group of the instances of a host.  Gnocchi 4.7's history grouping
    (``use_history``, which CloudKitty always asks for) joins the revisions of a group that start at the
    same instant, so only the group's first resource (by id) is aggregated: h1 gives instance 1's max."""
    col = collector(gnocchi_server)
    m = metric("cpu", groupby=["host"], extra_args={"aggregation_method": "max", "resource_type": "instance",
                                                     "resource_key": "host", "re_aggregation_method": "max"})
    assert m.groupby == ("host", "project_id")
    for hour in range(4):
        frame = usage(col, P1, *period(gnocchi_server, hour), m)
        got = dict(zip(frame["groupby.host"].to_list(), frame["qty"].to_list(), strict=True))
        first: dict[str, Resource] = {}
        for r in sorted(resources(P1, "instance", "cpu"), key=lambda r: r.id):
            first.setdefault(r.attributes["host"], r)
        want = {host: first_aggregate(r, "cpu", "max", 3600, hour) for host, r in first.items()}
        assert got == {host: convert_value(v, m) for host, v in want.items() if v is not None}
        assert got["h1"] == Decimal(21 + 12 * hour)


def test_groupby_and_metadata_from_resource_attributes(gnocchi_server):
    col = collector(gnocchi_server)
    frame = usage(col, P1, *period(gnocchi_server, 0), default("cpu")).sort("groupby.id")
    assert frame.select("groupby.id", "groupby.user_id", "groupby.project_id", "metadata.flavor_name",
                        "metadata.flavor_id", "metadata.vcpus").rows() == [
        ("aaaaaaaa-0000-0000-0000-000000000001", "u1", P1, "m1.small", "f1", "1.0"),
        ("aaaaaaaa-0000-0000-0000-000000000002", "u1", P1, "m1.large", "f2", "4.0"),
    ]
    assert frame["qty"].to_list() == [Decimal(1), Decimal(1)]  # NUMBOOL
    assert set(frame["type"]) == {"instance"}  # alt_name


def test_a_resource_living_inside_the_period_and_one_ended_before(gnocchi_server):
    """Instance 3 lives 01:30-02:30: rated in hours 1 and 2 (from its first bucket, 01:30) with its
    attributes; instance 4 ended 3 h before the data: never rated."""
    col = collector(gnocchi_server)
    three, four = "aaaaaaaa-0000-0000-0000-000000000003", "aaaaaaaa-0000-0000-0000-000000000004"
    seen = {}
    for hour in range(4):
        frame = usage(col, P1, *period(gnocchi_server, hour), default("cpu"))
        seen[hour] = set(frame["groupby.id"])
        if three in seen[hour]:
            assert frame.filter(pl.col("groupby.id") == three)["metadata.flavor_name"].to_list() == ["m1.small"]
    assert [three in seen[h] for h in range(4)] == [False, True, True, False]
    assert not any(four in ids for ids in seen.values())


def test_hostile_scope_is_one_json_value(gnocchi_server):
    col = collector(gnocchi_server)
    m = metric("cpu", groupby=["id"], extra_args={"aggregation_method": "max", "resource_type": "instance"})
    frame = usage(col, HOSTILE, *period(gnocchi_server, 0), m)
    assert frame["groupby.id"].to_list() == ["aaaaaaaa-0000-0000-0000-000000000006"]
    assert set(frame["scope_id"]) == {HOSTILE}
    assert "aaaaaaaa-0000-0000-0000-000000000006" not in set(usage(col, P1, *period(gnocchi_server, 0), m)["groupby.id"])


def test_batched_gives_the_same_rows_with_one_request_per_period_and_metric(gnocchi_server):
    per_scope, batched = collector(gnocchi_server), collector(gnocchi_server)
    metrics = [default(name) for name in sorted(DEFAULT_METRICS)]
    scopes = (P1, P2, HOSTILE)
    want, got = [], []
    for hour in (1, 2):
        for m in metrics:
            for scope in scopes:
                with contextlib.suppress(NoDataCollected):
                    want += usage(per_scope, scope, *period(gnocchi_server, hour), m).rows()
            found = batched.collect_all(*period(gnocchi_server, hour), m)
            got += [row for s in scopes if s in found for row in
                    pl.from_arrow(convert_samples(found[s], [m], batched.numeric_context)).rows()]
    assert sorted(map(str, got)) == sorted(map(str, want)) and want
    assert batched.requests < per_scope.requests
    assert batched.requests == 2 * len(metrics) * 2  # one aggregates call and one resource search each


def test_a_metric_gnocchi_does_not_have_is_no_data_and_an_unknown_method_is_fatal(gnocchi_server):
    col = collector(gnocchi_server)
    with pytest.raises(NoDataCollected):
        usage(col, P1, *period(gnocchi_server, 0), metric("nosuch", extra_args={"resource_type": "instance"}))
    with pytest.raises(GnocchiRefused, match="unknown aggregation"):
        usage(col, P1, *period(gnocchi_server, 0),
              metric("cpu", extra_args={"resource_type": "instance", "aggregation_method": "median"}))


# ---- fetcher ----


def test_fetcher_lists_the_scopes_of_the_resources(gnocchi_server):
    connection = GnocchiConnection(gnocchi_server.url, username="admin", timeout=30, retries=0)
    fetcher = GnocchiFetcher(connection)
    assert fetcher.scopes() == sorted({P1, P2, HOSTILE})
    assert GnocchiFetcher(connection, ["volume", "network"]).scopes() == [P1, P2]
    assert GnocchiFetcher(connection, ["generic"], "user_id").scopes() == ["u1", "u2", "u3", "u4"]


# ---- a whole run ----

FLAVOR_COST = {"m1.small": "0.02", "m1.large": "0.08", "m1.tiny": "0.01"}
VOLUME_COST = "0.0001"
RULES = {
    "groups": ["compute", "storage"],
    "services": [
        {"name": "instance", "fields": [{"name": "flavor_name", "mappings": [
            {"value": v, "type": "flat", "cost": c, "group": "compute"} for v, c in FLAVOR_COST.items()]}]},
        {"name": "volume.size", "mappings": [{"type": "flat", "cost": VOLUME_COST, "group": "storage"}]},
    ],
}


def workspace(root: Path, url: str, **connection) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "metrics.yml").write_text(json.dumps({"metrics": DEFAULT_METRICS}))  # JSON is YAML
    (root / "rules.json").write_text(json.dumps(RULES))
    options = {"url": url, "timeout": 30, **connection}
    config = {
        "database_url": f"sqlite:///{root / 'ratebeam.db'}", "period": 3600, "wait_periods": 1, "metrics": "metrics.yml",
        "fetcher": {"backend": "gnocchi", **options}, "collector": {"backend": "gnocchi", **options},
        "storage": {"backends": [{"backend": "parquet", "url": "rated/"}]},
    }
    (root / "ratebeam.yaml").write_text(json.dumps(config))
    return root / "ratebeam.yaml"


def hand_totals(server) -> dict[str, tuple[Decimal, Decimal]]:
    """(qty, price) per type over the 4 hours, every scope, from the loaded measures."""
    totals: dict[str, list[Decimal]] = {}
    for name in DEFAULT_METRICS:
        m = default(name)
        for scope in (P1, P2, HOSTILE):
            for hour in range(4):
                for r in resources(scope, m.extra_args.resource_type, name):
                    raw = first_aggregate(r, name, "mean", m.extra_args.force_granularity, hour)
                    if raw is None:
                        continue
                    q = convert_value(raw, m)
                    cost = {"instance": FLAVOR_COST.get(str(r.attributes.get("flavor_name"))),
                            "volume.size": VOLUME_COST}.get(m.rating_type)
                    total = totals.setdefault(m.rating_type, [Decimal(0), Decimal(0)])
                    total[0] += q
                    total[1] += quantize_price(q * Decimal(cost)) if cost else Decimal(0)
    return {t: (q, p) for t, (q, p) in totals.items()}


def test_run_stores_the_totals_computed_by_hand(gnocchi_server, tmp_path):
    path = workspace(tmp_path / "ws", gnocchi_server.url, username="admin")
    for args in (("db", "upgrade", "-c", str(path)), ("rules", "import", "-c", str(path), str(path.parent / "rules.json"))):
        assert ratebeam(*args).returncode == 0
    store = StateStore(make_engine(f"sqlite:///{path.parent / 'ratebeam.db'}"), "project_id", "gnocchi", "gnocchi")
    for scope in (P1, P2, HOSTILE):  # start at the data, not at the month's start
        assert store.acquire(scope, "test", 60, datetime.now(gnocchi_server.base.tzinfo)) is not None
        assert store.commit(scope, "test", gnocchi_server.at(-1))
        assert store.release(scope, "test")
    done = ratebeam("run", "-c", str(path), "--now", (gnocchi_server.at(5) - timedelta(seconds=1)).isoformat())
    assert done.returncode == 0, done.stderr
    assert "scopes: 3 fetched, 3 rated" in done.stdout
    stored = stored_rows(path)
    got = {t: (sum(g["qty"].to_list(), Decimal(0)), sum(g["price"].to_list(), Decimal(0)))
           for (t,), g in stored.group_by("type")}
    assert got == hand_totals(gnocchi_server)
    assert got["instance"][1] > 0 and got["volume.size"][1] > 0


def test_refused_credentials_stop_the_run_with_one_message(gnocchi_server, tmp_path):
    """No user name: Gnocchi answers 401, the run stops with exit status 2 and one line."""
    path = workspace(tmp_path / "ws", gnocchi_server.url)
    assert ratebeam("db", "upgrade", "-c", str(path)).returncode == 0
    done = ratebeam("run", "-c", str(path), "--now", gnocchi_server.at(5).isoformat())
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("ratebeam:")]
    assert len(lines) == 1 and "401" in lines[0] and "authentication refused" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


# ---- revisions and the shipped example ----


def _group(rid: str, flavor: str, revision: str, *values: float) -> dict:
    return {"group": {"id": rid, "flavor_name": flavor, "revision_start": revision},
            "measures": {"measures": {"aggregated": [["t", 3600.0, v] for v in values]}}}


def test_revisions_filter_is_cloudkittys():
    """One group per id: the last revision's labels, the sum of the single-aggregate revisions'
    quantities (CloudKitty's ``filter_unnecessary_measurements``)."""
    groups = [_group("i1", "m1.large", "2026-01-01T01:30", 2.0), _group("i1", "m1.small", "2026-01-01T00:00", 3.0),
              _group("i2", "m1.tiny", "2026-01-01T00:00", 5.0, 7.0), _group("i2", "m1.tiny", "2026-01-01T00:10", 1.0)]
    kept = filter_revisions(groups)
    assert [(g["group"]["id"], g["group"]["flavor_name"], g["measures"]["measures"]["aggregated"][0][2]) for g in kept] \
        == [("i1", "m1.large", 5.0), ("i2", "m1.tiny", 1.0)]
    assert groups[0]["measures"]["measures"]["aggregated"][0][2] == 2.0  # the input is left as it was
    no_id = [{"group": {"host": "h"}, "measures": {"measures": {"aggregated": [["t", 1.0, 1.0]]}}}]
    assert filter_revisions(no_id) == no_id


def test_the_example_metrics_are_cloudkittys_defaults():
    path = Path(__file__).resolve().parents[1] / "docs" / "examples" / "keystone-gnocchi" / "metrics.yml"
    loaded = load_metrics(path, "project_id", "gnocchi").metrics
    by_name = {m.name: m for m in loaded}
    for name, definition in DEFAULT_METRICS.items():
        assert by_name[name] == default(name), name
        assert by_name[name].extra_args.aggregation_method == definition["extra_args"]["aggregation_method"]


# ---- configuration, a down server, a malformed answer ----


def _config(tmp_path: Path, collector_section: dict, fetcher_section: dict | None = None) -> Path:
    (tmp_path / "metrics.yml").write_text(json.dumps({"metrics": {"cpu": DEFAULT_METRICS["cpu"]}}))
    doc = {"metrics": "metrics.yml", "fetcher": fetcher_section or {"backend": "source", "scopes": ["p1"]},
           "collector": collector_section, "storage": {"backends": [{"backend": "parquet", "url": "rated/"}]}}
    (tmp_path / "ratebeam.yaml").write_text(json.dumps(doc))
    return tmp_path / "ratebeam.yaml"


def test_configuration_is_validated_at_the_edge(tmp_path):
    good = load_config(_config(tmp_path, {"backend": "gnocchi", "url": "http://g:8041", "username": "admin"},
                               {"backend": "gnocchi", "url": "http://g:8041", "resource_types": ["instance"]}))
    assert good.collector.connection.url == "http://g:8041" and good.fetcher.resource_types == ("instance",)
    assert good.fetcher.scope_attribute == "project_id" and good.collector.batched is False
    cases = [
        ({"backend": "gnocchi", "url": "ftp://g"}, "collector.url: not an http(s) URL (Gnocchi's root"),
        ({"backend": "gnocchi", "url": "http://g", "username": ""}, "collector.username: expected a non-empty string"),
        ({"backend": "gnocchi", "url": "http://g", "region": "x"}, "collector.region: unknown key"),
        ({"backend": "gnocchi", "url": "http://g", "retries": 99}, "collector.retries: expected an integer <= 10"),
    ]
    for section, message in cases:
        with pytest.raises(InputError) as info:
            load_config(_config(tmp_path, section))
        assert message in str(info.value), str(info.value)
    with pytest.raises(InputError, match="fetcher.resource_types: expected a non-empty list of strings"):
        load_config(_config(tmp_path, {"backend": "gnocchi", "url": "http://g"},
                            {"backend": "gnocchi", "url": "http://g", "resource_types": []}))


def test_a_down_server_is_retried_then_a_retriable_error():
    col = GnocchiCollector(GnocchiConnection(f"http://127.0.0.1:{free_port()}", "admin", retries=2, backoff=0.01))
    with pytest.raises(RetriableConnectorError, match="after 3 attempts"):
        col.collect(P1, datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 1, tzinfo=UTC), default("cpu"))
    assert col.requests == 3


@pytest.mark.parametrize("body", [b'{"not": "a list"}', b'[{"group": {"id": "i"}, "measures": {}}]',
                                  b'[{"group": {"id": "i", "user_id": "u", "project_id": "p"}, '
                                  b'"measures": {"measures": {"aggregated": [["t", 300, "7"]]}}}]'])
def test_an_answer_that_is_not_gnocchis_fails_the_frame_naming_it(body):
    class Answer(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        col = GnocchiCollector(GnocchiConnection(f"http://127.0.0.1:{server.server_port}", "admin", retries=0))
        with pytest.raises(GnocchiAnswerError, match="gnocchi") as info:
            col.collect(P1, datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 1, tzinfo=UTC), default("cpu"))
        assert isinstance(info.value, SkippableConnectorError)
    finally:
        server.shutdown()

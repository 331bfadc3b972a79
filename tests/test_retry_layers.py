"""Each request is retried in one layer only: ``retries: 2`` is 3 attempts, never 6.

A local server answering HTTP 500 to everything plays Prometheus, Gnocchi, Keystone and each storage
backend over HTTP; ``ratebeam run`` is run against it and the server counts what it received.
Every request it got must have come exactly ``retries + 1`` times (a layer retrying what the HTTP
layer already retried sends the same request again), and for the collectors the number of queries
is that times the queries one collection needs: a batched query that failed after its retries
used to be asked again scope by scope — 3 more attempts per scope.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from bad_input.hostile import HostileServer, Reply
from hardening_support import configure, copied, one_sample, query, run

NOW = "2026-01-01T03:00:00Z"  # one period due
SCOPES = ["p1", "p2"]
RETRIES = 2
FAILING = Reply(500, json.dumps({"status": "error", "error": "down"}).encode())


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = one_sample(tmp_path_factory.mktemp("retries") / "ws")
    configure(root, fetcher={"backend": "source", "scopes": SCOPES})
    (root / "gnocchi-metrics.yml").write_text(yaml.safe_dump({"metrics": {"cpu": {
        "unit": "instance", "groupby": ["id", "project_id"],
        "extra_args": {"aggregation_method": "mean", "resource_type": "instance"}}}}))
    return root


@pytest.fixture
def server() -> Iterator[HostileServer]:
    with HostileServer() as failing:
        failing.reply = FAILING
        yield failing


def each_request_sent(server: HostileServer, attempts: int) -> Counter:
    """The requests the server got, each asserted to have come exactly ``attempts`` times."""
    counts = Counter(server.requests)
    assert counts, "the server got no request"
    assert set(counts.values()) == {attempts}, {(m, p): n for (m, p, _), n in counts.items()}
    return counts


def frames_failed(ws: Path) -> int:
    return query(ws, "SELECT count(*) FROM ratebeam_dead_letters")[0][0]


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "per-scope"])
def test_prometheus_answering_500_gets_retries_plus_one_requests_per_query(template, tmp_path, capsys, server,
                                                                          batched):
    ws = copied(template, tmp_path)
    configure(ws, collector={"backend": "prometheus", "url": f"{server.url}/api/v1", "retries": RETRIES,
                             "backoff": 0, "timeout": 5, "batched": batched})
    status, err = run(ws, capsys, NOW)
    assert status == 1, err[-3000:]
    periods = frames_failed(ws) // len(SCOPES)
    assert periods == 1, err[-3000:]
    queries = each_request_sent(server, RETRIES + 1)
    assert len(queries) == queries_per_period(ws, batched) * periods


def queries_per_period(ws: Path, batched: bool, metrics: str = "metrics.yml") -> int:
    """Batched: one query per metric for all scopes; per scope: the first metric failing fails the frame."""
    return len(yaml.safe_load((ws / metrics).read_text())["metrics"]) if batched else len(SCOPES)


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "per-scope"])
def test_gnocchi_answering_500_gets_retries_plus_one_requests_per_query(template, tmp_path, capsys, server,
                                                                       batched):
    ws = copied(template, tmp_path)
    configure(ws, metrics="gnocchi-metrics.yml", collector={
        "backend": "gnocchi", "url": server.url, "username": "rating", "retries": RETRIES, "backoff": 0,
        "timeout": 5, "batched": batched})
    status, err = run(ws, capsys, NOW)
    assert status == 1, err[-3000:]
    assert frames_failed(ws) == len(SCOPES), err[-3000:]
    queries = each_request_sent(server, RETRIES + 1)
    assert len(queries) == queries_per_period(ws, batched, "gnocchi-metrics.yml")


def test_keystone_answering_500_gets_retries_plus_one_token_requests(template, tmp_path, capsys, server):
    """keystoneauth retries its token request itself (``session._RetryingSession``): nothing on top of it."""
    ws = copied(template, tmp_path)
    configure(ws, fetcher={"backend": "keystone", "url": f"{server.url}/v3", "username": "rating", "password": "pw",
                           "user_domain_name": "Default", "project_name": "service",
                           "project_domain_name": "Default", "retries": RETRIES, "backoff": 0, "timeout": 5})
    status, err = run(ws, capsys, NOW)
    assert status != 0, err[-3000:]
    tokens = each_request_sent(server, RETRIES + 1)
    assert [path for _, path, _ in tokens] == ["/v3/auth/tokens"]


STORAGE = {
    "influxdb": ({"backend": "influxdb", "url": "{url}", "database": "rated", "retries": RETRIES, "timeout": 5},
                 RETRIES + 1),
    "loki": ({"backend": "loki", "url": "{url}/loki/api/v1", "retries": RETRIES, "timeout": 5}, RETRIES + 1),
    # no ``retries`` option: the search client's own 5 attempts
    "opensearch": ({"backend": "opensearch", "url": "{url}", "index_name": "rated", "timeout": 5}, 5),
}


@pytest.mark.parametrize("backend", STORAGE)
def test_storage_answering_500_gets_retries_plus_one_requests_each(template, tmp_path, capsys, server, backend):
    section, attempts = STORAGE[backend]
    ws = copied(template, tmp_path)
    configure(ws, storage={"backends": [{k: v.format(url=server.url) if isinstance(v, str) else v
                                         for k, v in section.items()}]})
    status, err = run(ws, capsys, NOW)
    assert status != 0, err[-3000:]
    each_request_sent(server, attempts)

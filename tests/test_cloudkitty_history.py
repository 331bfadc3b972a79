"""History CloudKitty wrote before the switch is replaced, not doubled, when ratebeam re-rates it.

CloudKitty's own v2 storage driver (its venv, ``tests/cloudkitty/ck_storage.py``) writes the demo's
rated points into InfluxDB (read by ratebeam through the v1 and the v2 API), OpenSearch and Loki
(the stand-in of ``test_storage_loki_double.py``: no real Loki can be had), the way ``cloudkitty-processor`` pushes them: CloudKitty's points carry only the scope
key label (``project_id``), none of ratebeam's scope marker.  Then, on a copy of the rated demo
workspace pointed at that storage, ``ratebeam state reset`` (the delete path) for one scope and a
state moved back without any delete (the rewrite path) for another, and one ``ratebeam run``.
CloudKitty's driver then counts exactly the demo's points and its totals are the demo's.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest
import requests
import yaml
from pipeline_support import counters, ratebeam, run_cycle, stored_rows
from servers import cloudkitty_python
from servers import influxdb as influx_servers
from servers.search import opensearch_url  # noqa: F401  (session fixture)
from test_storage_loki_double import LokiDouble

from ratebeam.connectors.sql.migrations import make_engine
from ratebeam.connectors.sql.state_store import StateStore
from ratebeam.pipelines.config import load_config
from ratebeam.transforms.schema import GROUPBY_PREFIX, METADATA_PREFIX

_influx_servers = influx_servers._influx_servers
influx_v1 = influx_servers.influx_v1
influx_v2 = influx_servers.influx_v2

CK_STORAGE = Path(__file__).parent / "cloudkitty" / "ck_storage.py"
WINDOW = {"begin": "2026-01-01T00:00:00+00:00", "end": "2026-02-01T00:00:00+00:00"}
RESET, REWOUND = "acme-web", "globex"  # deleted by `state reset`; only its state moved back
#: Re-rate the demo's last day only (24 periods per scope): the earlier days stay CloudKitty's.
FROM = "2026-01-03T00:00:00+00:00"


def _cloudkitty(command: str, request: dict) -> dict:
    done = subprocess.run([cloudkitty_python(), CK_STORAGE, command], input=json.dumps(request), text=True,
                          capture_output=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout) if done.stdout.strip() else {}


def _points(config: Path) -> list[dict]:
    """The rated demo's points in CloudKitty's terms (exact decimals as strings)."""
    points = []
    for row in stored_rows(config).iter_rows(named=True):
        points.append({
            "scope_id": row["scope_id"], "type": row["type"], "unit": row["unit"],
            "begin": row["begin"].isoformat(), "end": row["end"].isoformat(),
            "qty": str(row["qty"]), "price": str(row["price"]),
            "groupby": {k[len(GROUPBY_PREFIX):]: v for k, v in row.items() if k.startswith(GROUPBY_PREFIX) and v is not None},
            "metadata": {k[len(METADATA_PREFIX):]: v for k, v in row.items()
                         if k.startswith(METADATA_PREFIX) and v is not None},
        })
    return points


def _totals(points: list[dict]) -> dict[str, tuple[Decimal, Decimal]]:
    sums: dict[str, tuple[Decimal, Decimal]] = {}
    for p in points:
        key = f"{p['groupby']['project_id']}|{p['type']}"
        qty, rate = sums.get(key, (Decimal(0), Decimal(0)))
        sums[key] = (qty + Decimal(p["qty"]), rate + Decimal(p["price"]))
    return sums


def _assert_totals(got: dict[str, list[str]], expected: dict[str, tuple[Decimal, Decimal]]) -> None:
    """CloudKitty's totals equal ``expected``, to float32: InfluxDB stores float64, but CloudKitty's
    OpenSearch driver maps no field, so a document CloudKitty wrote first makes ``price`` a float."""
    assert got.keys() == expected.keys()
    for key, (qty, rate) in expected.items():
        assert [float(v) for v in got[key]] == pytest.approx([float(qty), float(rate)], rel=1e-6), key


def _assert_reports_find(config: Path, scope: str, points: list[dict]) -> None:
    """ratebeam's reads select CloudKitty's points by scope (they carry only its scope key label):
    ``report dataframes --filter scope_id=`` lists each, under its scope; ``report summary``'s
    total is theirs."""
    window = ("--begin", WINDOW["begin"], "--end", WINDOW["end"], "--filter", f"scope_id={scope}")
    listed = ratebeam("report", "dataframes", "-c", str(config), *window, "-f", "csv", "--limit", "100000")
    assert listed.returncode == 0, listed.stderr
    rows = list(csv.DictReader(io.StringIO(listed.stdout)))
    assert len(rows) == len(points) and {r["scope_id"] for r in rows} == {scope}
    summed = ratebeam("report", "summary", "-c", str(config), *window, "-f", "json")
    assert summed.returncode == 0, summed.stderr
    per_unit = json.loads(summed.stdout)["results"]  # one row per unit: the scope's rate is their sum
    assert sum(float(r["rate"]) for r in per_unit) == pytest.approx(float(sum(Decimal(p["price"]) for p in points)), rel=1e-6)


def _storage(kind: str, request: pytest.FixtureRequest) -> tuple[dict, dict, Callable[[], object], Callable[[], object]]:
    """(ratebeam's storage section, CloudKitty's request base, settle, cleanup) on a fresh database / index.

    ``settle`` makes what CloudKitty pushed visible to searches: its OpenSearch driver posts ``_bulk``
    without ``refresh``, so its documents appear only at the index's next refresh (1 s by default), as
    they would to a dashboard; the test refreshes instead of waiting for it."""
    name = f"ck-history-{uuid.uuid4().hex[:10]}"
    if kind.startswith("influx"):
        server = request.getfixturevalue(f"influx_{kind[-2:]}")
        database = name.replace("-", "_")
        host, port = server.url.removeprefix("http://").split(":")
        ck = {"backend": "influxdb", "options": {"host": host, "port": int(port), "database": database}}
        requests.post(f"{server.url}/query", data={"q": f'CREATE DATABASE "{database}"'}, timeout=10).raise_for_status()
        ours = {"backend": "influxdb", "url": server.url, "database": database} if kind == "influx_v1" else {
            "backend": "influxdb", "version": 2, "url": server.url, "bucket": f"{database}/autogen", "token": "x:x"}
        return ours, ck, lambda: None, lambda: requests.post(
            f"{server.url}/query", data={"q": f'DROP DATABASE "{database}"'}, timeout=10)
    if kind == "loki":
        double = LokiDouble()  # no real Loki can be had (tests/test_storage_loki_double.py)
        ck = {"backend": "loki", "options": {"url": double.url, "tenant": "cloudkitty"}}
        return {"backend": "loki", "url": double.url, "tenant": "cloudkitty"}, ck, lambda: None, double.close
    url = request.getfixturevalue(f"{kind}_url")
    ck = {"backend": kind, "options": {"host": url, "index_name": name}}
    requests.put(f"{url}/{name}", timeout=30).raise_for_status()  # CloudKitty's init wants the index made
    return ({"backend": kind, "url": url, "index_name": name}, ck,
            lambda: requests.post(f"{url}/{name}/_refresh", timeout=30).raise_for_status(),
            lambda: requests.delete(f"{url}/{name}", timeout=30))


@pytest.mark.cloudkitty
# Not Elasticsearch: CloudKitty 25's driver cannot init an index on Elasticsearch 8 (it PUTs a typed
# mapping, `_mapping/_doc?include_type_name=true`, which 8.x no longer routes); ratebeam's delete
# and rewrite queries are the same for both engines (queries.py), which OpenSearch exercises here.
@pytest.mark.parametrize("kind", ["influx_v1", "influx_v2", "opensearch", "loki"])
def test_rerating_cloudkitty_history_keeps_one_copy(rated, tmp_path, request, kind):
    reference = _points(rated)
    expected = _totals(reference)
    ours, ck, settle, cleanup = _storage(kind, request)
    try:
        _cloudkitty("push", {**ck, "points": reference})
        settle()
        assert _cloudkitty("count", {**ck, **WINDOW}) == {"total": len(reference)}
        workdir = tmp_path / "ws"
        shutil.copytree(rated.parent, workdir)
        config = workdir / "ratebeam.yaml"
        doc = yaml.safe_load(config.read_text())
        doc["storage"] = {"backends": [ours]}
        config.write_text(yaml.safe_dump(doc))
        _assert_reports_find(config, RESET, [p for p in reference if p["scope_id"] == RESET])

        done = ratebeam("state", "reset", RESET, "--from", FROM, "--yes", "-c", str(config))
        assert done.returncode == 0, done.stderr
        deleted = [p for p in reference if p["scope_id"] == RESET and p["begin"] >= FROM]
        assert deleted  # CloudKitty's points of the reset scope from FROM on went, nothing else
        assert _cloudkitty("count", {**ck, **WINDOW}) == {"total": len(reference) - len(deleted)}
        loaded = load_config(config, metrics=False)
        store = StateStore(make_engine(loaded.database_url), loaded.scope_key, "source", "file")
        last = store.get(RESET).last_processed  # what the reset stored: the period before FROM
        store.reset(REWOUND, last)  # state only: the run must rewrite over CloudKitty's points

        run = run_cycle(config)
        assert run.returncode == 0, run.stderr
        assert counters(run.stdout)["committed"] == 2 * 24
        assert _cloudkitty("count", {**ck, **WINDOW}) == {"total": len(reference)}
        _assert_totals(_cloudkitty("total", {**ck, **WINDOW}), expected)
    finally:
        cleanup()

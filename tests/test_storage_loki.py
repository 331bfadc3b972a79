"""The Loki storage backend: pushes against a real Loki-push receiver, reads against a stand-in.

* Push path: real **VictoriaLogs v1.52.1** (``tests/servers/victorialogs.py``), which implements
  Loki's push API; every pushed line and label is read back with VictoriaLogs' own LogsQL API.
* Read path (``query_range``, LogQL, delete): **not run against a real Loki** (none can be had
  here).  ``LokiDouble`` (``test_storage_loki_double.py``) answers in the formats of Loki's HTTP API
  documentation ("Query logs within a range of time", "Request log deletion") and refuses LogQL
  outside the subset ratebeam and CloudKitty emit.  The conformance suite runs on that double.
* CloudKitty 25.0.0's own ``LokiClient`` (in its venv) queries the double holding ratebeam's lines.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest
from servers.victorialogs import victorialogs  # noqa: F401  (session fixture)
from storage_conformance import HOUR, JANUARY, T0, StorageConformance, point, rated_table, sample
from test_storage_loki_double import LokiDouble

from ratebeam.connectors.config_model import ConfigModel
from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.registry import make_backend
from ratebeam.connectors.storage.base import TotalQuery
from ratebeam.connectors.storage.loki.backend import LokiStorage, PushOnlyLokiStorage
from ratebeam.connectors.storage.loki.config import LokiStorageConfig
from ratebeam.connectors.storage.loki.lines import timestamps
from ratebeam.connectors.storage.rated_frames import rated_frame
from ratebeam.transforms.point_identity import point_ids

REPO = Path(__file__).resolve().parents[1]
HOSTILE = ['p"1', "p\\2", "p}3", 'a|b"} or {x=~".*']


def backend(url: str, **options) -> LokiStorage:
    return LokiStorage(LokiStorageConfig(url=url, timeout=10, retries=0, **options))


@pytest.fixture
def loki():
    """A fresh stand-in Loki (``LokiDouble``) for one test."""
    double = LokiDouble()
    yield double
    double.close()


class TestLokiConformance(StorageConformance):
    """The whole contract on the stand-in (small pages and shards: pagination is exercised)."""

    @pytest.fixture
    def make_backend(self, loki):
        return lambda: backend(loki.url, page_size=7, shard_days=1)


def test_identical_rewrite_is_one_entry_per_point(loki):
    storage = backend(loki.url)
    storage.write(rated_table(sample()))
    storage.write(rated_table(sample()))
    assert sum(len(v) for v in loki.entries.values()) == len(sample())


def test_totals_are_exact_past_any_page_limit(loki):
    """CloudKitty sums at most ``limit`` entries per shard; ratebeam pages until the end."""
    points = [point("p1", "cpu", T0 + h * HOUR, "0.1", "0.000000000000000001", {"id": str(h)}) for h in range(700)]
    storage = backend(loki.url, page_size=50, shard_days=2)
    storage.write(rated_table(points))
    total = storage.total(TotalQuery(begin=JANUARY[0], end=JANUARY[1]))
    assert total.results[0]["qty"] == Decimal("70") and total.results[0]["rate"] == Decimal("0.0000000000000007")
    assert storage.retrieve(*JANUARY, limit=10, offset=695).points.num_rows == 5
    assert len(loki.queries) > 14  # paged, not one capped query


@pytest.mark.parametrize("scope", HOSTILE)
def test_hostile_scope_ids_cannot_change_a_query(loki, scope):
    storage = backend(loki.url)
    storage.write(rated_table([point(scope, "cpu", T0, "1", "1", {"id": scope}), point("other", "cpu", T0, "2", "2")]))
    got = storage.retrieve(*JANUARY, filters={"scope_id": [scope], "id": scope})
    assert got.total == 1 and got.points["scope_id"].to_pylist() == [scope]
    assert storage.total(TotalQuery(begin=JANUARY[0], end=JANUARY[1], filters={"scope_id": scope})).results[0]["qty"] == 1
    storage.delete(None, None, {"scope_id": scope})
    assert storage.retrieve(*JANUARY).points["scope_id"].to_pylist() == ["other"]
    assert all(f'scope_id={json.dumps(scope)}' in d["query"] for d in loki.deletes)


def test_delete_puts_the_scope_in_the_selector_and_labels_by_point_id(loki):
    storage = backend(loki.url, tenant="t1")
    storage.write(rated_table(sample()))
    storage.delete(T0, None, {"scope_id": "p2"})
    storage.delete(None, None, {"scope_id": "p1", "os_distro": "windows"})
    first, second = loki.deletes
    assert first["query"] == '{service="cloudkitty", scope_id="p2"}' and first["start"] == "2024-01-01T00:00:00.000000000Z"
    assert second["query"].startswith('{service="cloudkitty", scope_id="p1"} |~ "\\"point_id\\":')
    left = storage.retrieve(*JANUARY, limit=1000).points.to_pylist()
    assert {(p["scope_id"], p.get("metadata.os_distro")) for p in left} == {("p1", "ubuntu"), ("p1", None)}


def test_tenant_and_credentials_are_sent(loki):
    backend(loki.url, tenant="acme", bearer_token="s3cret", compression="none").write(rated_table(sample()[:1]))
    headers = loki.pushes[-1]
    assert headers["X-Scope-OrgID"] == "acme" and headers["Authorization"] == "Bearer s3cret"
    assert "Content-Encoding" not in headers and "acme" in loki.entries
    backend(loki.url, username="u", password="p").write(rated_table(sample()[:1]))
    assert loki.pushes[-1]["Authorization"].startswith("Basic ")


def test_a_refused_query_is_a_clear_error(loki):
    storage = backend(loki.url.replace("/loki/api/v1", "/nowhere"))
    with pytest.raises(FatalConnectorError, match="loki storage .*/nowhere/query_range: HTTP 404"):
        storage.retrieve(*JANUARY)


def test_config_refuses_half_credentials_and_bad_stream_labels():
    for bad in ({"username": "u"}, {"bearer_token": "t", "username": "u", "password": "p"},
                {"stream": {"bad-name": "x"}}, {"stream": {"scope_id": "x"}}, {"page_size": 0}):
        with pytest.raises(ValueError):
            LokiStorageConfig(**bad)
    assert isinstance(make_backend(LokiStorageConfig()), LokiStorage)
    assert issubclass(LokiStorageConfig, ConfigModel)


# -- the push path against a real receiver ---------------------------------------------------------


def test_every_pushed_line_and_label_reaches_victorialogs(victorialogs):  # noqa: F811
    points = sample() + [point(s, "cpu", T0, "12345678901234567890.123456789012345678",
                               "0.00000000000000000001", {"id": s}, {"note": "x"}) for s in HOSTILE]
    table = rated_table(points)
    storage = PushOnlyLokiStorage(LokiStorageConfig(url=victorialogs.api, tenant="42", batch_lines=5, timeout=30,
                                                  push_only=True))
    assert storage.write(table) == len(points)
    frame = rated_frame(table, "loki")
    ids = point_ids(frame)
    expected_ts = dict(zip(ids.to_list(), timestamps(frame, ids).to_list(), strict=True))
    rows = {r["point_id"]: r for r in victorialogs.query("*", tenant="42", expect=len(points))}
    assert len(rows) == len(points)
    for p, point_id in zip(points, ids.to_list(), strict=True):
        row = rows[point_id]
        ns = int(expected_ts[point_id])
        whole, _, fraction = row["_time"].removesuffix("Z").partition(".")
        seconds = int(datetime.fromisoformat(whole + "+00:00").timestamp())
        assert seconds * 10**9 + int(fraction.ljust(9, "0")) == ns
        stream = {"service": "cloudkitty", "project_id": p.groupby["project_id"], "scope_id": p.scope}
        assert {k: row[k] for k in stream} == stream
        assert row["type"] == p.type and row["unit"] == p.unit and row["scope_id"] == p.scope
        assert Decimal(row["qty"]) == p.qty and Decimal(row["price"]) == p.price
        assert row["start"] == p.begin.isoformat() and row["end"] == p.end.isoformat()
        for key, value in p.groupby.items():
            assert row.get(f"groupby.{key}", "") == value
        for key, value in p.metadata.items():
            assert row.get(f"metadata.{key}", "") == value
    assert victorialogs.query("*", tenant="43") == []


# -- CloudKitty reads what ratebeam wrote ------------------------------------------------------------

_CK_SCRIPT = r"""
import json, sys, types
from datetime import datetime, timezone
from cloudkitty.storage.v2.loki import LokiStorage
from cloudkitty.storage.v2.loki.client import LokiClient
url, begin, end = sys.argv[1], datetime.fromisoformat(sys.argv[2]), datetime.fromisoformat(sys.argv[3])
client = LokiClient(url, "cloudkitty", {"service": "cloudkitty"}, "application/json", 1, 7, None, True, 10)
count, logs = client.retrieve(begin, end, {"project_id": "p1"}, ["instance"], 5000)
frames = LokiStorage._build_dataframes(types.SimpleNamespace(_log_to_datapoint=LokiStorage._log_to_datapoint), logs)
points = [dict(type=t, qty=str(p.qty), price=str(p.price), groupby=dict(p.groupby), metadata=dict(p.metadata))
          for f in frames for t, p in f.iterpoints()]
_, totals = client.total(begin, end, None, None, ["type"], None, 0, 5000, False)
print(json.dumps({"count": count, "points": points,
                  "totals": {t["key"]["type"]: t["sum_price"]["value"] for t in totals}}))
"""


def test_cloudkitty_reads_what_ratebeam_wrote(loki):
    python = Path(os.environ.get("RATEBEAM_RC", REPO / ".rc")) / "cloudkitty-venv" / "bin" / "python"
    if not python.exists():
        pytest.skip("CloudKitty's venv is not installed: run tests/cloudkitty/setup_venv.sh")
    points = sample()
    backend(loki.url).write(rated_table(points))
    done = subprocess.run([str(python), "-c", _CK_SCRIPT, loki.url, JANUARY[0].isoformat(), JANUARY[1].isoformat()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.splitlines()[-1])
    mine = [p for p in points if p.scope == "p1" and p.type == "instance"]
    assert got["count"] == len(mine)
    assert sorted((Decimal(p["qty"]), Decimal(p["price"]), p["groupby"]["id"]) for p in got["points"]) == sorted(
        (p.qty, p.price, p.groupby["id"]) for p in mine)
    assert got["totals"] == {"instance": pytest.approx(10.5), "volume": pytest.approx(0.63)}  # both scopes

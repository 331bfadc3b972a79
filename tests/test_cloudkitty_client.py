"""The real ``cloudkitty`` client (python-cloudkittyclient 6.2.0) against CloudKitty's API, ratebeam rating.

A user's view of the switch: CloudKitty 25.0.0's API (``servers/cloudkitty_api.py``: noauth, storage
v2 on the session's InfluxDB 1.x, RPC on the session's RabbitMQ) on a database CloudKitty's own
migrations built (``ck_dbsync.py``, then ``ratebeam db upgrade``), and ratebeam rating into that
InfluxDB database.  Everything a user does goes through the client's ``cloudkitty`` command (its own
venv, ``tests/cloudkitty/setup_client_venv.sh``) with ``--os-auth-type cloudkitty-noauth``: the
client's plugin for CloudKitty's noauth mode (keystoneauth's ``none`` plugin sends a token, which
the mapping controller then tries to validate with Keystone).

CloudKitty 25 refuses a rule whose start is in the past, so the rules start at ``H0``, the next full
hour of the real clock, and the usage covers the hours from ``H0`` on; ratebeam runs with a simulated
``--now`` after them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import requests
from pipeline_support import RATEBEAM, ratebeam, workspace
from servers import cloudkitty_python, rc_dir, unavailable
from servers import influxdb as influx_servers
from servers.cloudkitty_api import cloudkitty_api, wait_for
from servers.rabbitmq import rabbitmq_url  # noqa: F401  (session fixture)

from ratebeam.connectors.sql.migrations import make_engine
from ratebeam.connectors.sql.state_store import StateStore
from ratebeam.pipelines.config import load_config

pytest_plugins = ["servers.prism"]  # the prism_endpoint session fixture
_influx_servers = influx_servers._influx_servers
influx_v1 = influx_servers.influx_v1

CK_DBSYNC = Path(__file__).parent / "cloudkitty" / "ck_dbsync.py"
SCOPES = ("acme-web", "acme-data")
HOURS = 6  # of usage, from H0
#: Where the rule change and the reprocessing task start (hours after H0).
CHANGE_AT = 3


@dataclass
class Deployment:
    """CloudKitty's API and ratebeam on one database and one InfluxDB database, rated once."""

    url: str
    config: Path
    h0: datetime
    mappings: dict[str, str]  # what the rules were created as: name -> mapping id
    rpc_log: Path

    def client(self, *args: str, version: str = "2") -> subprocess.CompletedProcess:
        """``cloudkitty ARGS`` as a user types it (the client's own venv)."""
        command = rc_dir() / "cloudkittyclient-venv" / "bin" / "cloudkitty"
        if not command.exists():
            unavailable(f"python-cloudkittyclient missing: {command} (run tests/cloudkitty/setup_client_venv.sh)")
        return subprocess.run([str(command), "--os-auth-type", "cloudkitty-noauth", "--os-endpoint", self.url,
                               "--os-rating-api-version", version, *args],
                              capture_output=True, text=True, timeout=120, check=False)

    def json(self, *args: str, version: str = "2"):
        done = self.client(*args, "-f", "json", version=version)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def at(self, hours: int) -> str:
        return (self.h0 + timedelta(hours=hours)).isoformat()

    def state(self, scope: str) -> datetime | None:
        loaded = load_config(self.config, metrics=False)
        engine = make_engine(loaded.database_url)
        try:
            return StateStore(engine, loaded.scope_key, "source", "file").get(scope).last_processed
        finally:
            engine.dispose()


def _usage(h0: datetime) -> str:
    """An instance per scope (m1.small, m1.xlarge) up every hour, and one floating IP of acme-web."""
    lines = ["metric,timestamp,value,project_id,id,flavor_name,os_distro,volume_type"]
    for hour in range(HOURS):
        stamp = (h0 + timedelta(hours=hour, minutes=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
        lines += [f"openstack_nova_server_status,{stamp},1,acme-web,vm-web,m1.small,ubuntu,",
                  f"openstack_nova_server_status,{stamp},1,acme-data,vm-data,m1.xlarge,rhel,",
                  f"openstack_neutron_floating_ip,{stamp},1,acme-web,ip-web,,,"]
    return "\n".join(lines) + "\n"


def _ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def _create_rules(ck: Deployment) -> dict[str, str]:
    """The rules, created with the client: per-flavor prices (one per tenant) and a flat IP price."""
    start = ("--start", ck.h0.strftime("%Y-%m-%dT%H:%M:%S"))
    value = ("-f", "value", "-c")
    _ok(ck.client("module", "enable", "hashmap"))
    instance = _ok(ck.client("hashmap", "service", "create", "instance", *value, "Service ID"))
    flavor = _ok(ck.client("hashmap", "field", "create", instance, "flavor_name", *value, "Field ID"))
    ip = _ok(ck.client("hashmap", "service", "create", "ip.floating", *value, "Service ID"))
    made = {}
    for name, rule in {"small": ("--field-id", flavor, "--value", "m1.small", "0.02"),
                       "xlarge": ("--field-id", flavor, "--value", "m1.xlarge", "0.16"),
                       "xlarge@acme-data": ("--field-id", flavor, "--value", "m1.xlarge", "-p", "acme-data", "0.12"),
                       "ip": ("-s", ip, "0.006")}.items():
        made[name] = _ok(ck.client("hashmap", "mapping", "create", "-t", "flat", *start, *rule, *value, "Mapping ID"))
    return made


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, influx_v1, rabbitmq_url) -> Iterator[Deployment]:  # noqa: F811
    root = tmp_path_factory.mktemp("ckclient")
    now = datetime.now(UTC)
    h0 = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=2)  # rules created before it starts
    database = root / "cloudkitty.db"
    dbsync = subprocess.run([cloudkitty_python(), CK_DBSYNC, f"sqlite:///{database}"], capture_output=True,
                            text=True, timeout=300, check=False)
    assert dbsync.returncode == 0, dbsync.stderr[-3000:]
    influx_db = f"ck_client_{uuid.uuid4().hex[:10]}"
    requests.post(f"{influx_v1.url}/query", data={"q": f'CREATE DATABASE "{influx_db}"'},
                  timeout=10).raise_for_status()
    config = workspace(root / "ws", database_url=f"sqlite:///{database}",
                       fetcher={"backend": "source", "scopes": list(SCOPES)},
                       storage={"backends": [{"backend": "influxdb", "url": influx_v1.url, "database": influx_db}]})
    (config.parent / "usage.csv").write_text(_usage(h0))
    _ok(ratebeam("db", "upgrade", "-c", str(config)))
    for scope in SCOPES:  # a first run would start at the month's start: start them at H0
        _ok(ratebeam("state", "reset", scope, "--from", h0.isoformat(), "--yes", "--create", "-c", str(config)))
    port = int(influx_v1.url.rsplit(":", 1)[1])
    rpc_log = root / "rpc.log"
    with cloudkitty_api(database, rabbitmq_url, root, influx=(port, influx_db)) as url:
        ck = Deployment(url, config, h0, {}, rpc_log)
        ck.mappings = _create_rules(ck)
        run = ratebeam("run", "-c", str(config), "--now", ck.at(HOURS + 2))
        assert run.returncode == 0, run.stderr[-3000:]
        yield ck
    requests.post(f"{influx_v1.url}/query", data={"q": f'DROP DATABASE "{influx_db}"'}, timeout=10)
    shutil.rmtree(root, ignore_errors=True)


def _ratebeam_summary(ck: Deployment) -> dict[tuple[str, str], float]:
    """``ratebeam report summary`` of the usage hours by project and type.

    InfluxDB keeps prices as float64 and sums them so (for CloudKitty's reads and ratebeam's alike):
    the two summaries are compared as the floats they are, the expected prices to float precision."""
    done = ratebeam("report", "summary", "-c", str(ck.config), "--begin", ck.at(0), "--end", ck.at(HOURS),
                    "--groupby", "project_id,type", "-f", "json")
    return {(r["project_id"], r["type"]): float(r["rate"]) for r in json.loads(_ok(done))["results"]}


def _cloudkitty_summary(ck: Deployment) -> dict[tuple[str, str], float]:
    """``cloudkitty summary get`` (v2) of the usage hours by project and type."""
    rows = ck.json("summary", "get", "-b", ck.at(0), "-e", ck.at(HOURS), "-g", "project_id", "-g", "type")
    return {(r["Project id"], r["Type"]): float(r["Rate"]) for r in rows}


def _approx(prices: dict[tuple[str, str], Decimal]):
    return pytest.approx({key: float(value) for key, value in prices.items()}, rel=1e-12)


@pytest.mark.cloudkitty
def test_the_clients_rules_summaries_and_reprocessing_tasks_work_with_ratebeam(deployment):
    ck = deployment
    # The client's rules rated every hour: m1.small 0.02, acme-data's own m1.xlarge price, the IP's.
    expected = {("acme-web", "instance"): Decimal("0.02") * HOURS, ("acme-web", "ip.floating"): Decimal("0.006") * HOURS,
                ("acme-data", "instance"): Decimal("0.12") * HOURS}
    ours = _ratebeam_summary(ck)
    assert ours == _approx(expected)
    assert _cloudkitty_summary(ck) == pytest.approx(ours, rel=1e-12)  # v2 summary, of ratebeam's points
    frames = ck.json("dataframes", "get", "-b", ck.at(0), "-e", ck.at(HOURS))
    assert len(frames) == 3 * HOURS
    assert sorted(f["Price"] for f in frames) == sorted([0.02, 0.12, 0.006] * HOURS)
    total = ck.json("total", "get", "-b", ck.at(0), "-e", ck.at(HOURS), "-a", version="1")
    assert total["Total"] == pytest.approx(float(sum(expected.values())), rel=1e-12)

    # The client's reset is refused by the API itself (see docs/migrating-from-cloudkitty.md): it
    # sends `state`, the API's body schema knows only `last_processed_timestamp` (and forbids extras).
    refused = ck.client("scope", "state", "reset", "--scope-id", "acme-web", ck.at(1))
    assert refused.returncode != 0 and "HTTP 400" in refused.stderr
    assert "extra keys not allowed (path: '['state']')" in refused.stderr, refused.stderr

    # A price change the CloudKitty 25 way (end the rule, start a new one), then a reprocessing task.
    change = ck.h0 + timedelta(hours=CHANGE_AT)
    _ok(ck.client("hashmap", "mapping", "update", ck.mappings["small"], "--end", change.strftime("%Y-%m-%dT%H:%M:%S")))
    flavor = ck.json("hashmap", "mapping", "get", ck.mappings["small"], version="1")[0]["Field ID"]
    _ok(ck.client("hashmap", "mapping", "create", "-t", "flat", "--field-id", flavor, "--value", "m1.small",
                  "--start", change.strftime("%Y-%m-%dT%H:%M:%S"), "0.05"))
    _ok(ck.client("tasks", "reprocessing", "create", "--scope-id", "acme-web", "--start-reprocess-time",
                  ck.at(CHANGE_AT), "--end-reprocess-time", ck.at(HOURS - 1), "--reason", "m1.small price"))
    pending = ck.json("tasks", "reprocessing", "get")
    assert [(t["Scope ID"], t["Current reprocessing time"]) for t in pending] == [("acme-web", "")], pending
    done = ratebeam("run", "-c", str(ck.config), "--now", ck.at(HOURS + 2))
    assert done.returncode == 0, done.stderr[-3000:]
    finished = ck.json("tasks", "reprocessing", "get")
    assert [t["Current reprocessing time"] for t in finished] == [ck.at(HOURS - 1)[:19]], finished
    changed = {**expected, ("acme-web", "instance"): Decimal("0.02") * CHANGE_AT
               + Decimal("0.05") * (HOURS - CHANGE_AT)}
    again = _ratebeam_summary(ck)
    assert again == _approx(changed)
    assert _cloudkitty_summary(ck) == pytest.approx(again, rel=1e-12)


@pytest.mark.cloudkitty
def test_a_reset_cast_by_cloudkittys_api_while_serve_runs_is_rated_again(deployment, rabbitmq_url,  # noqa: F811
                                                                          prism_endpoint, tmp_path):
    ck = deployment
    before = _cloudkitty_summary(ck)
    end = ck.state("acme-web")
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        serve = subprocess.Popen([*RATEBEAM, "-v", "serve", "-c", str(ck.config), "--rpc", "--transport-url",
                                  rabbitmq_url, "--runner", "PortableRunner", f"--option=--job_endpoint={prism_endpoint}",
                                  "--option=--environment_type=LOOPBACK", "--interval", "3",
                                  "--now", ck.at(HOURS + 2), "--step", "60", "--ticks", "40"], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for("serve's RPC", lambda: "serving CloudKitty's RPC" in log.read_text(), log, serve)
        answer = requests.put(f"{ck.url}/v2/scope", json={"scope_id": "acme-web",
                                                          "last_processed_timestamp": ck.at(1)}, timeout=30)
        assert answer.status_code == 202, answer.text
        wait_for("the next tick re-rating from the reset", lambda: f"due from {ck.at(1)[:19]}" in log.read_text()
                 and ck.state("acme-web") == end, log, serve, timeout=120)
    finally:
        serve.terminate()
        serve.wait(timeout=60)
    assert _cloudkitty_summary(ck) == before  # re-rated once: nothing lost, nothing doubled

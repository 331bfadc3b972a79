"""Portability: the same rating cycle on FnApiRunner, on Prism with a LOOPBACK worker, on Prism
with an EXTERNAL worker (a process of a ``worker_pool_main`` pool) and on Prism with two EXTERNAL
worker processes stores the same rows, commits the same state and counts the same counters — once with usage files into Delta and into Parquet, once with the real Prometheus into
the real InfluxDB.  Also: the shipped ``prism.yaml`` through the command line, the fatal-error stop
on Prism, and the one-line exit 2 of a runner that cannot start or an option Beam does not know.

Prism is built by ``tests/servers/prism_install.sh`` at the pinned Beam version (``prism_endpoint``
is one job server for the session).  Prism starts one SDK worker per environment, i.e. one worker
process for the cycle (the pool's log says how many it started); with resource hints on the Rate
stage that stage is an environment of its own, so the job runs in two worker processes — whose
counters Prism (2.75 and 2.78) reads right only because ratebeam's pool numbers each worker's metric short
ids apart (``pipelines/runners/sdk_worker.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml
from pipeline_support import NOW as DEMO_NOW
from pipeline_support import RATEBEAM, counters, ratebeam, setup_database, stored_rows, workspace
from servers import influxdb as influx_servers
from servers import prometheus as servers_prometheus
from servers import unavailable
from servers.prism import prism_binary, prism_endpoint  # noqa: F401  (session fixture)
from test_fatal_errors import ADMIN, assert_stopped, configured, influx_with_auth  # noqa: F401
from test_prometheus_pipeline import NOW as PROMETHEUS_NOW
from test_prometheus_pipeline import workspace as prometheus_workspace

from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.state_store import StateStore
from ratebeam.pipelines.cli import main
from ratebeam.pipelines.commands.common import parse_instant
from ratebeam.pipelines.commands.run import run_configured_cycle
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.runners.config import RunnerConfig
from ratebeam.pipelines.runners.launch import worker_pool
from ratebeam.pipelines.runners.sdk_worker import HarnessRequest, parse_pool_command

prometheus_server = servers_prometheus.prometheus_server
_influx_servers = influx_servers._influx_servers
influx_v1 = influx_servers.influx_v1

RUNNERS = ("fnapi", "prism-loopback", "prism-external", "prism-external-2")


def runner_configs(endpoint: str, pool: str) -> dict[str, RunnerConfig | None]:
    return {
        "fnapi": None,  # the default: FnApiRunner in memory
        "prism-loopback": RunnerConfig.model_validate(
            {"runner": "PortableRunner", "prism": {"endpoint": endpoint}, "environment": {"type": "LOOPBACK"}}),
        "prism-external": RunnerConfig.model_validate(
            {"runner": "PortableRunner", "prism": {"endpoint": endpoint},
             "environment": {"type": "EXTERNAL", "endpoint": pool}}),
        "prism-external-2": RunnerConfig.model_validate(  # Rate in its own environment: a second worker
            {"runner": "PortableRunner", "prism": {"endpoint": endpoint},
             "environment": {"type": "EXTERNAL", "endpoint": pool}, "resource_hints": {"Rate": {"min_ram": "1GB"}}}),
    }


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """An EXTERNAL worker pool for the module, started by ratebeam's own launcher; and its log."""
    log = tmp_path_factory.mktemp("pool") / "pool.log"
    with worker_pool(log) as endpoint:
        yield endpoint, log


def started_workers(log: Path) -> int:
    return log.read_text().count("Starting worker with command")


def states(config_path: Path) -> dict[str, str]:
    config = load_config(config_path)
    engine = make_engine(config.database_url)
    try:
        store = StateStore(engine, config.scope_key, config.fetcher.backend, config.collector.backend)
        return {s.scope: s.last_processed and s.last_processed.isoformat() for s in store.list_states()}
    finally:
        engine.dispose()


def run_everywhere(paths: dict[str, Path], now: str, endpoint: str, pool: tuple[str, Path]) -> dict:
    """Run one cycle per runner, each in its own workspace; returns the reports."""
    configs = runner_configs(endpoint, pool[0])
    before = started_workers(pool[1])
    reports = {name: run_configured_cycle(load_config(paths[name]), parse_instant(now, "now"), configs[name])
               for name in RUNNERS}
    # prism-external: one worker process of the pool; prism-external-2: two
    assert started_workers(pool[1]) - before == 3
    return reports


def failed_frames(report) -> set[tuple]:
    return {(f.scope_id, f.begin, f.stage, f.reason) for f in report.failures}


#: Counters that describe how a runner bundled the work, not what was done: the number of rating
#: batches and of collector calls (each a bundle's buffered frames; a metric without data counts once
#: per call) follow the bundle sizes, which differ between runners and with the machine's load.
BUNDLING_COUNTERS = frozenset({"rating_batches", "collector_calls", "metrics_without_data"})


def work_counters(counters: dict[str, int]) -> dict[str, int]:
    """The counters of the work done (scopes, periods, points, requests, failures)."""
    return {name: value for name, value in counters.items() if name not in BUNDLING_COUNTERS}


@pytest.mark.parametrize("storage", ["delta", "parquet"])
def test_file_to_embedded_store_cycle_is_the_same_on_every_runner(tmp_path, prism_endpoint, pool, storage):  # noqa: F811
    """Usage files into the embedded default (a Delta table) and into the Parquet backend."""
    backends = {"backends": [{"backend": storage, "url": "rated"}]}
    paths = {name: workspace(tmp_path / name, storage=backends) for name in RUNNERS}
    for path in paths.values():
        setup_database(path)
    reports = run_everywhere(paths, DEMO_NOW, prism_endpoint, pool)

    assert all(report.ok for report in reports.values()), {n: r.failures for n, r in reports.items()}
    baseline = reports["fnapi"].counters
    assert baseline["periods_committed"] == 288 and baseline["points_written"] > 0
    rows = {name: stored_rows(path) for name, path in paths.items()}
    assert rows["fnapi"].height == baseline["points_written"]
    for name in RUNNERS[1:]:
        assert work_counters(reports[name].counters) == work_counters(baseline), name  # Prism reports them alike
        assert rows[name].equals(rows["fnapi"]), name
        assert states(paths[name]) == states(paths["fnapi"]), name
    assert set(states(paths["fnapi"]).values()) == {"2026-01-03T23:00:00+00:00"}


def influx_rows(url: str, database: str) -> list[list]:
    found = requests.post(f"{url}/query", timeout=30, data={
        "db": database, "q": 'SELECT * FROM "dataframes"', "epoch": "s"}).json()
    (series,) = found["results"][0]["series"]
    return sorted(series["values"], key=json.dumps)


def test_prometheus_to_influxdb_cycle_is_the_same_on_every_runner(
        tmp_path, prometheus_server, influx_v1, prism_endpoint, pool):  # noqa: F811
    paths, databases = {}, {}
    for name in RUNNERS:
        path = prometheus_workspace(tmp_path / name, prometheus_server.api)
        doc = json.loads(path.read_text())
        databases[name] = f"portable_{tmp_path.name[-12:]}_{name}".replace("-", "_")
        doc["storage"] = {"backends": [{"backend": "influxdb", "url": influx_v1.url, "database": databases[name]}]}
        path.write_text(json.dumps(doc))
        setup_database(path)
        paths[name] = path
    reports = run_everywhere(paths, PROMETHEUS_NOW.isoformat(), prism_endpoint, pool)

    baseline = reports["fnapi"].counters
    assert baseline["prometheus_requests"] > 1 and baseline["points_written"] > 0
    # the fixture's scope 'line\nbreak' cannot be an InfluxDB tag: its frames fail, on every runner alike
    assert {f[0] for f in failed_frames(reports["fnapi"])} == {"line\nbreak"}
    rows = {name: influx_rows(influx_v1.url, databases[name]) for name in RUNNERS}
    assert len(rows["fnapi"]) == baseline["points_written"]
    for name in RUNNERS[1:]:
        assert work_counters(reports[name].counters) == work_counters(baseline), name
        assert failed_frames(reports[name]) == failed_frames(reports["fnapi"]), name
        assert rows[name] == rows["fnapi"], name
        assert states(paths[name]) == states(paths["fnapi"]), name


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The command line in ``cwd`` (where a relative ``--runner-config`` is looked for first)."""
    return subprocess.run([*RATEBEAM, *args], capture_output=True, text=True, cwd=cwd, timeout=300, check=False,
                          env={**os.environ, **(env or {})})


def with_prism_on_path() -> dict[str, str]:
    binary = prism_binary()
    if binary is None:
        unavailable("prism is not built: run tests/servers/prism_install.sh")
    return {"PATH": f"{Path(binary).parent}{os.pathsep}{os.environ['PATH']}"}


def test_shipped_prism_yaml_through_the_cli_starts_prism_itself(tmp_path):
    """``--runner-config prism.yaml`` from a directory without such a file: the installed one is
    used, ratebeam starts Prism from PATH, and the run rates what FnApiRunner rates."""
    env = with_prism_on_path()
    config = workspace(tmp_path / "ws")
    setup_database(config)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    done = cli("run", "-c", str(config), "--now", DEMO_NOW, "--runner-config", "prism.yaml", env=env, cwd=elsewhere)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(PortableRunner)" in done.stderr
    assert counters(done.stdout) == {"due": 288, "committed": 288, "rated": 1550, "written": 1550}
    assert stored_rows(config).height == 1550


def test_a_prism_binary_named_in_the_runner_config_is_started(tmp_path):
    """``prism: {binary: /path/to/prism}``: ratebeam starts that binary (nothing on PATH needed)."""
    binary = prism_binary()
    if binary is None:
        unavailable("prism is not built: run tests/servers/prism_install.sh")
    config = workspace(tmp_path / "ws")
    setup_database(config)
    runner = tmp_path / "named-prism.yaml"
    runner.write_text(yaml.safe_dump({"runner": "PortableRunner", "prism": {"binary": binary},
                                      "environment": {"type": "LOOPBACK"}}))
    done = cli("run", "-c", str(config), "--now", DEMO_NOW, "--runner-config", str(runner), cwd=tmp_path,
               env={"PATH": os.defpath})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(PortableRunner)" in done.stderr
    assert counters(done.stdout) == {"due": 288, "committed": 288, "rated": 1550, "written": 1550}


def test_a_fatal_error_on_prism_stops_the_run_in_one_line(tmp_path, influx_with_auth, prism_endpoint):  # noqa: F811
    storage = {"backends": [{"backend": "influxdb", "url": influx_with_auth, "database": "rated",
                             "username": ADMIN, "password": "not-the-password"}]}
    config = configured(tmp_path, storage=storage)
    runner = tmp_path / "prism-here.yaml"
    runner.write_text(yaml.safe_dump({"runner": "PortableRunner", "prism": {"endpoint": prism_endpoint},
                                      "environment": {"type": "LOOPBACK"}}))
    done = ratebeam("run", "-c", str(config), "--now", DEMO_NOW, "--runner-config", str(runner))
    assert_stopped(config, done, f"ratebeam: influxdb storage {influx_with_auth}/query", "authentication refused",
                   secret="not-the-password")


@pytest.fixture(scope="module")
def demo_config(tmp_path_factory) -> Path:
    config = workspace(tmp_path_factory.mktemp("demo") / "ws")
    setup_database(config)
    return config


@pytest.mark.parametrize(
    ("runner", "expected"),
    [
        ({"runner": "PortableRunner", "prism": {"binary": "/nonexistent/prism"}},
         "ratebeam: Prism not found: /nonexistent/prism is not an executable file (install it: go install "
         "github.com/apache/beam/sdks/v2/go/cmd/prism@v2.78.0)"),
        ({"runner": "FlinkRunner", "options": ["--flink_master=[local]", "--flink_job_server_jar=/nonexistent.jar"]},
         "ratebeam: FlinkRunner cannot get Beam's Flink job server jar: Unable to parse jar URL \"/nonexistent.jar\""),
        ({"runner": "PortableRunner", "options": ["--job_endpoint=localhost:1"]},
         "ratebeam: the job server (--job_endpoint) does not answer at localhost:1: Connection refused"),
        ({"runner": "FnApiRunner", "options": ["--direct_num_workerz=2"]},
         "runner.yaml: options[0]: not a Beam pipeline option (Beam would silently ignore it): "
         "'--direct_num_workerz=2'"),
        ({"runner": "FnApiRunner", "options": ["--direct_num_workers=two"]},
         "runner.yaml: options[0]: argument --direct_num_workers: invalid int value: 'two': "
         "'--direct_num_workers=two'"),
        ({"runner": "PortableRunner", "prism": {}, "options": ["--job_endpoint=localhost:8099"]},
         "runner.yaml: options[0]: set by the 'prism' key of this file, not in options: "
         "'--job_endpoint=localhost:8099'"),
        ({"runner": "PortableRunner"},
         "runner.yaml: runner: PortableRunner needs a job server: a 'prism' section or --job_endpoint=host:port"),
        ({"runner": "FnApiRunner", "resource_hints": {"Rates": {"min_ram": "1GB"}}},
         "runner.yaml: resource_hints.Rates: not a stage of the cycle or the event stream (one of FetchScopes, "
         "PlanPeriods, CollectUsage, ConvertUsage, Rate, Write, CommitState, ReadNotifications, Scopes, "
         "Commit): 'Rates'"),
        ({"runner": "FnApiRunner", "resource_hints": {"Rate": {"min_ram": "lots"}}},
         "runner.yaml: resource_hints.Rate: Resource hint min_ram has invalid value lots."),
    ],
    ids=["prism-path", "flink-jar", "endpoint-down", "unknown-option", "bad-value", "twice",
         "no-job-server", "hint-stage", "hint-value"],
)
def test_a_runner_that_cannot_start_exits_2_in_one_line(demo_config, tmp_path, monkeypatch, capsys, runner, expected):
    (tmp_path / "runner.yaml").write_text(yaml.safe_dump(runner))
    monkeypatch.chdir(tmp_path)  # the relative runner.yaml is found in the current directory
    assert main(["run", "-c", str(demo_config), "--now", DEMO_NOW, "--runner-config", "runner.yaml"]) == 2
    stderr = capsys.readouterr().err
    lines = [line for line in stderr.splitlines() if line.startswith("ratebeam: ")]
    assert len(lines) == 1 and expected in lines[0], stderr[-3000:]
    assert "Traceback" not in stderr
    assert stored_rows(demo_config).height == 0


def test_each_sdk_worker_process_numbers_its_metric_short_ids_apart():
    """Two worker processes start their metric short ids at different random offsets, far from 1."""
    code = "from ratebeam.pipelines.runners.sdk_worker import own_short_ids; print(own_short_ids())"
    starts = {int(subprocess.run([*RATEBEAM[:1], "-c", code], capture_output=True, text=True, timeout=120,
                                 check=True).stdout) for _ in range(2)}
    assert len(starts) == 2 and min(starts) > 2**32


def test_the_worker_entry_point_starts_only_the_pools_harness_command():
    """The pool's ``-c`` text is parsed into SdkHarness's values, never run; other code is refused."""
    pool = ('from apache_beam.runners.worker.sdk_worker import SdkHarness; SdkHarness("localhost:4711",'
            'worker_id="worker_3",state_cache_size=0,data_buffer_time_limit_ms=-1).run()')
    assert parse_pool_command(pool) == HarnessRequest("localhost:4711", "worker_3", 0, -1)
    injected = pool.replace(".run()", ".run(); import os; os.remove('x')")
    assert parse_pool_command(injected) is None
    for args in (["-c", injected], ["-c", "print('hello')"], ["script.py"]):
        bad = subprocess.run([*RATEBEAM[:1], "-m", "ratebeam.pipelines.runners.sdk_worker", *args], capture_output=True,
                             text=True, timeout=120, check=False)
        assert bad.returncode == 1 and "usage: python -m ratebeam.pipelines.runners.sdk_worker -c" in bad.stderr
        assert "hello" not in bad.stdout and "Traceback" not in bad.stderr

"""``report`` never creates or changes storage: a missing Parquet root, InfluxDB database or bucket,
Elasticsearch/OpenSearch index is an error naming it (exit 2), and nothing was created; ``--backend``
picks which configured backend to read.  Against the real servers of ``tests/servers``."""

from __future__ import annotations

import json
import uuid

import pytest
import requests
import yaml
from pipeline_support import parquet_workspace, workspace
from servers import influxdb as influx_servers
from servers.search import elasticsearch_url, opensearch_url  # noqa: F401  (session fixtures)
from test_storage_loki_double import LokiDouble

from ratebeam.connectors.registry import make_backend
from ratebeam.connectors.storage.search.config import SearchStorageConfig
from ratebeam.pipelines.cli import build_parser, main

_influx_servers = influx_servers._influx_servers
influx_v1 = influx_servers.influx_v1
influx_v2 = influx_servers.influx_v2

JANUARY = ["--begin", "2026-01-01", "--end", "2026-02-01"]


def _report(config, command: str, *extra: str) -> int:
    return main(["report", command, "-c", str(config), *JANUARY, *extra])


def _with_backends(copy, *backends: dict) -> None:
    """The rated demo workspace ``copy`` with ``backends`` configured after its Delta one."""
    doc = yaml.safe_load(copy.read_text())
    doc["storage"]["backends"] += list(backends)
    copy.write_text(yaml.safe_dump(doc))


def _databases(url: str) -> set[str]:
    answer = requests.post(f"{url}/query", data={"q": "SHOW DATABASES"}, timeout=10).json()
    return {row[0] for series in answer["results"][0].get("series", []) for row in series.get("values", [])}


def _indices(url: str) -> set[str]:
    return {row["index"] for row in requests.get(f"{url}/_cat/indices?format=json", timeout=30).json()}


@pytest.mark.parametrize("command", ["summary", "dataframes"])
def test_missing_delta_table_is_an_error_and_is_not_created(tmp_path, capsys, command):
    config = workspace(tmp_path / "ws")  # the demo's Delta storage, never run: rated/ does not exist
    root = config.parent / "rated"
    assert _report(config, command) == 2
    assert f"ratebeam: delta storage: {str(root)!r} holds no Delta table (no run ever wrote there" in \
        capsys.readouterr().err
    assert not root.exists()


@pytest.mark.parametrize("command", ["summary", "dataframes"])
def test_missing_parquet_root_is_an_error_and_is_not_created(tmp_path, capsys, command):
    config = parquet_workspace(tmp_path / "ws")  # never run: rated/ does not exist
    root = config.parent / "rated"
    assert not root.exists()
    assert _report(config, command) == 2
    assert f"ratebeam: parquet storage: {str(root)!r} does not exist (no run ever wrote there" in capsys.readouterr().err
    assert not root.exists()


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("command", ["summary", "dataframes"])
def test_missing_influxdb_database_is_an_error_and_is_not_created(copy, capsys, request, version, command):
    server = request.getfixturevalue(f"influx_v{version}")
    name = f"nosuch_{uuid.uuid4().hex[:8]}"
    where = {"database": name} if version == 1 else {"bucket": f"{name}/autogen", "token": "x:x"}
    _with_backends(copy, {"backend": "influxdb", "version": version, "url": server.url, "retries": 0, **where})
    before = _databases(server.url)
    assert _report(copy, command, "--backend", "influxdb") == 2
    assert f"influxdb storage: database {name!r} does not exist (existing: " in capsys.readouterr().err
    assert _databases(server.url) == before


def test_missing_retention_policy_is_an_error(copy, capsys, influx_v1):
    name = f"db_{uuid.uuid4().hex[:8]}"
    requests.post(f"{influx_v1.url}/query", data={"q": f'CREATE DATABASE "{name}"'}, timeout=10).raise_for_status()
    _with_backends(copy, {"backend": "influxdb", "url": influx_v1.url, "database": name, "retention_policy": "rp9"})
    assert _report(copy, "dataframes", "--backend", "1") == 2
    assert f"retention policy 'rp9' does not exist on database {name!r}" in capsys.readouterr().err


@pytest.mark.parametrize("engine", ["opensearch", "elasticsearch"])
@pytest.mark.parametrize("command", ["summary", "dataframes"])
def test_missing_search_index_is_an_error_and_is_not_created(copy, capsys, request, engine, command):
    url = request.getfixturevalue(f"{engine}_url")
    name = f"ratebeam-nosuch-{uuid.uuid4().hex[:8]}"
    _with_backends(copy, {"backend": engine, "url": url, "index_name": name, "timeout": 30})
    before = _indices(url)
    assert _report(copy, command, "--backend", engine) == 2
    assert f"index {name!r} does not exist (no run ever wrote there: check index_name)" in capsys.readouterr().err
    assert name not in _indices(url) and _indices(url) == before


def test_an_existing_search_index_is_read_unchanged(copy, capsys, opensearch_url):  # noqa: F811
    name = f"ratebeam-empty-{uuid.uuid4().hex[:8]}"
    section = {"backend": "opensearch", "url": opensearch_url, "index_name": name, "timeout": 30}
    made = make_backend(SearchStorageConfig(**section))
    made.init()  # as a run would: the index with ratebeam's mapping, no document
    made.close()
    before = requests.get(f"{opensearch_url}/{name}/_mapping", timeout=30).json()
    try:
        _with_backends(copy, section)
        assert _report(copy, "dataframes", "--backend", "opensearch", "--format", "json") == 0
        assert json.loads(capsys.readouterr().out)["total"] == 0
        assert requests.get(f"{opensearch_url}/{name}/_mapping", timeout=30).json() == before  # no mapping added
    finally:
        requests.delete(f"{opensearch_url}/{name}", timeout=30)


def test_report_on_loki_pushes_nothing(copy, capsys):
    loki = LokiDouble()
    try:
        _with_backends(copy, {"backend": "loki", "url": loki.url, "timeout": 10, "retries": 0})
        assert _report(copy, "dataframes", "--backend", "loki", "--format", "json") == 0
        assert json.loads(capsys.readouterr().out)["total"] == 0
        assert loki.entries == {}
    finally:
        loki.close()


def test_backend_chooses_which_configured_storage_is_read(copy, capsys, influx_v1):
    name = f"empty_{uuid.uuid4().hex[:8]}"
    requests.post(f"{influx_v1.url}/query", data={"q": f'CREATE DATABASE "{name}"'}, timeout=10).raise_for_status()
    _with_backends(copy, {"backend": "influxdb", "url": influx_v1.url, "database": name})
    totals = {}
    for choice in (None, "delta", "0", "influxdb", "1"):
        extra = [] if choice is None else ["--backend", choice]
        assert _report(copy, "dataframes", "--format", "json", "--limit", "1", *extra) == 0
        totals[choice] = json.loads(capsys.readouterr().out)["total"]
    assert totals[None] == totals["delta"] == totals["0"] > 0  # the first backend by default
    assert totals["influxdb"] == totals["1"] == 0  # the rated demo was never written to InfluxDB


@pytest.mark.parametrize(("choice", "message"), [
    ("nosuch", "--backend: not a configured storage backend (configured: 0: delta): 'nosuch'"),
    ("3", "--backend: no storage backend at that position (configured: 0: delta): '3'"),
])
def test_unknown_backend_is_refused(copy, capsys, choice, message):
    assert _report(copy, "summary", "--backend", choice) == 2
    assert message in capsys.readouterr().err


def test_two_backends_of_one_name_need_the_position(copy, capsys):
    _with_backends(copy, {"backend": "delta", "url": "other"})
    assert _report(copy, "summary", "--backend", "delta") == 2
    assert "several backends have that name: give the position (configured: 0: delta, 1: delta)" in \
        capsys.readouterr().err


def test_help_says_the_default_backend():
    report = next(a for a in build_parser()._subparsers._group_actions[0].choices["report"]._actions
                  if a.dest == "report_command")
    for command in ("summary", "dataframes"):
        text = " ".join(report.choices[command].format_help().split())
        assert "--backend NAME the storage backend to read" in text and "default: the first" in text

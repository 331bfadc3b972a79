"""ratebeam.yaml: validated once into frozen, picklable dataclasses; one clear error per mistake."""

from __future__ import annotations

import pickle
import sys
import textwrap
from pathlib import Path

import pytest

from ratebeam.connectors.collectors.file.config import FileCollectorConfig
from ratebeam.connectors.fetchers.source.config import SourceFetcherConfig
from ratebeam.connectors.storage.parquet.config import ParquetStorageConfig
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.errors import InputError

BASE = """\
metrics: metrics.yml
fetcher: {backend: source, scopes: [p1, p2]}
collector: {backend: file, url: usage/}
storage:
  backends:
    - {backend: parquet, url: rated/}
"""


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("metrics.yml").write_text("metrics: {cpu: {unit: instance, groupby: [id]}}\n")


def write(text: str, name: str = "ratebeam.yaml") -> str:
    Path(name).parent.mkdir(parents=True, exist_ok=True)
    Path(name).write_text(textwrap.dedent(text))
    return name


def error(text: str) -> str:
    with pytest.raises(InputError) as info:
        load_config(write(text))
    return str(info.value)


def test_defaults_and_resolved_paths(tmp_path):
    config = load_config(write(BASE))
    here = tmp_path.resolve()
    assert config.source_path == here / "ratebeam.yaml"
    assert config.database_url == f"sqlite:///{here / 'ratebeam.db'}"
    assert (config.period, config.wait_periods, config.scope_key) == (3600, 2, "project_id")
    assert (config.max_periods_per_run, config.lease_seconds, config.rebatch_rows) == (744, 60, 250_000)
    assert config.metrics_path == here / "metrics.yml"
    assert [m.key for m in config.metrics.metrics] == ["cpu"]
    assert config.metrics.metrics[0].groupby == ("id", "project_id")
    assert config.fetcher == SourceFetcherConfig(backend="source", scopes=("p1", "p2"))
    assert config.collector == FileCollectorConfig(backend="file", url=f"{here}/usage/", format="auto")
    assert config.storage == (ParquetStorageConfig(backend="parquet", url=f"{here}/rated/"),)


def test_every_key_set_and_paths_relative_to_the_yaml_not_the_cwd(tmp_path):
    Path("conf").mkdir()
    Path("conf/m.yml").write_text("metrics: {cpu: {unit: u, metadata: [project_id]}}\n")  # scope key is domain_id
    name = write(
        """\
        database_url: sqlite:///db/state.db
        period: 600
        wait_periods: 0
        scope_key: domain_id
        metrics: m.yml
        max_periods_per_run: 10
        lease_seconds: 60
        rebatch_rows: 1000
        fetcher: {backend: source, scopes: [d1]}
        collector: {backend: file, url: "data/*.parquet", format: parquet}
        storage:
          backends:
            - {backend: parquet, url: "memory://rated"}
            - {backend: parquet, url: /abs/rated}
            - {backend: parquet, url: "simplecache::s3://bucket/rated"}
            - {backend: parquet, url: "file:///abs/rated"}
        """,
        "conf/ratebeam.yaml",
    )
    config = load_config(name)
    conf = tmp_path.resolve() / "conf"
    assert config.database_url == f"sqlite:///{conf / 'db' / 'state.db'}"
    assert (config.period, config.wait_periods, config.scope_key) == (600, 0, "domain_id")
    assert (config.max_periods_per_run, config.lease_seconds, config.rebatch_rows) == (10, 60, 1000)
    assert config.metrics_path == conf / "m.yml"
    assert config.metrics.metrics[0].groupby == ("domain_id",)
    assert config.collector == FileCollectorConfig(backend="file", url=f"{conf}/data/*.parquet", format="parquet")
    assert [s.url for s in config.storage] == [
        "memory://rated", "/abs/rated", "simplecache::s3://bucket/rated", "file:///abs/rated"
    ]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite://", "sqlite://"),
        ("sqlite:///:memory:", "sqlite:///:memory:"),
        ("sqlite:////var/lib/rb.db", "sqlite:////var/lib/rb.db"),
        ("postgresql+psycopg://rb:s3cret@db:5432/ratebeam", "postgresql+psycopg://rb:s3cret@db:5432/ratebeam"),
    ],
)
def test_database_urls_other_than_relative_sqlite_are_kept(url, expected):
    assert load_config(write(f"database_url: '{url}'\n" + BASE)).database_url == expected


def test_config_is_picklable():
    config = load_config(write(BASE))
    assert pickle.loads(pickle.dumps(config)) == config


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "ratebeam.yaml: (top level): expected a mapping: None"),
        ("colour: red\n" + BASE, "ratebeam.yaml: colour: unknown key (expected one of: collector, database_url, "
         "events, fetcher, lease_seconds, max_periods_per_run, metrics, period, rebatch_rows, scope_key, storage, wait_periods)"),
        (BASE.replace("metrics: metrics.yml\n", ""), "ratebeam.yaml: metrics: required key is missing"),
        ("period: 0\n" + BASE, "ratebeam.yaml: period: expected an integer >= 1: 0"),
        ("period: '3600'\n" + BASE, "ratebeam.yaml: period: expected an integer >= 1: '3600'"),
        ("period: true\n" + BASE, "ratebeam.yaml: period: expected an integer >= 1: True"),
        ("wait_periods: -1\n" + BASE, "ratebeam.yaml: wait_periods: expected an integer >= 0: -1"),
        ("rebatch_rows: 1.5\n" + BASE, "ratebeam.yaml: rebatch_rows: expected an integer >= 1: 1.5"),
        ("scope_key: ''\n" + BASE, "ratebeam.yaml: scope_key: expected a non-empty string: ''"),
        ("database_url: 'not a url'\n" + BASE, "ratebeam.yaml: database_url: not a database URL: 'not a url'"),
        ("database_url: 'postgress://u:pw@h/db'\n" + BASE,
         "ratebeam.yaml: database_url: unknown database dialect 'postgress': 'postgress://u:***@h/db'"),
        (BASE.replace("metrics.yml", "absent.yml"), "ratebeam.yaml: metrics: no such file: "),
        (BASE.replace("backend: source,", "backend: ceilometer,"),  # keystone exists now
         "ratebeam.yaml: fetcher.backend: expected one of source, prometheus, gnocchi, keystone: 'ceilometer'"),
        (BASE.replace("{backend: source, scopes: [p1, p2]}", "{scopes: [p1]}"),
         "ratebeam.yaml: fetcher.backend: required key is missing"),
        (BASE.replace("[p1, p2]", "[]"), "ratebeam.yaml: fetcher.scopes: expected a non-empty list of strings: []"),
        (BASE.replace("[p1, p2]", "[p1, p1]"), "ratebeam.yaml: fetcher.scopes[1]: listed twice: 'p1'"),
        (BASE.replace("[p1, p2]", "[p1, '']"), "ratebeam.yaml: fetcher.scopes[1]: expected a non-empty string: ''"),
        (BASE.replace("[p1, p2]", "p1"), "ratebeam.yaml: fetcher.scopes: expected a non-empty list of strings: 'p1'"),
        (BASE.replace("scopes: [p1, p2]}", "scopes: [p1], url: x}"),
         "ratebeam.yaml: fetcher.url: unknown key (expected one of: backend, scopes)"),
        (BASE.replace("fetcher: {backend: source, scopes: [p1, p2]}", "fetcher: source"),
         "ratebeam.yaml: fetcher: expected a mapping with a 'backend' key: 'source'"),
        (BASE.replace("url: usage/}", "url: usage/, format: xml}"),
         "ratebeam.yaml: collector.format: expected one of auto, parquet, csv, jsonl: 'xml'"),
        (BASE.replace("{backend: file, url: usage/}", "{backend: file}"), "ratebeam.yaml: collector.url: required key is missing"),
        (BASE.replace("url: usage/}", "url: ''}"), "ratebeam.yaml: collector.url: expected a non-empty string: ''"),
        (BASE.replace("    - {backend: parquet, url: rated/}", "    []"),
         "ratebeam.yaml: storage.backends: expected a non-empty list of storage backends: []"),
        (BASE.replace("  backends:\n    - {backend: parquet, url: rated/}", "  backend: parquet"),
         "ratebeam.yaml: storage.backend: unknown key (expected one of: backends)"),
        (BASE + "    - {backend: parquet, url: 'htp:/x'}\n", "ratebeam.yaml: storage.backends[1].url: not a URL: 'htp:/x'"),
        (BASE + "    - {backend: parquet, url: 'htp://x'}\n",
         "ratebeam.yaml: storage.backends[1].url: unknown URL scheme 'htp': 'htp://x'"),
        (BASE + "    - {backend: parquet, url: 's3://'}\n", "ratebeam.yaml: storage.backends[1].url: not a URL: 's3://'"),
        (BASE + "    - {backend: parquet, url: 'nocache::s3://b'}\n",
         "ratebeam.yaml: storage.backends[1].url: unknown fsspec protocol 'nocache': 'nocache::s3://b'"),
        (BASE + "    - {backend: nosuch, url: 'http://x'}\n",
         "ratebeam.yaml: storage.backends[1].backend: expected one of parquet"),
        (BASE + "    - {backend: parquet}\n", "ratebeam.yaml: storage.backends[1].url: required key is missing"),
        (BASE + "fetcher: {backend: source, scopes: [x]}\n", "ratebeam.yaml: line 7, column 1: duplicate key (first at line 2): 'fetcher'"),
    ],
)
def test_errors_name_file_key_path_and_value(text, expected):
    assert error(text).startswith(expected)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mysql://u:pw@h/db", "unsupported database 'mysql' (ratebeam uses sqlite:///<file> or "
         "postgresql+psycopg://...): 'mysql://u:***@h/db'"),
        ("oracle+oracledb://h/db", "unsupported database 'oracle' (ratebeam uses sqlite:///<file> or "
         "postgresql+psycopg://...): 'oracle+oracledb://h/db'"),
        ("sqlite+pysqlcipher:///x.db", "unsupported SQLite driver 'pysqlcipher' (ratebeam uses sqlite:///<file>): "
         "'sqlite+pysqlcipher:///x.db'"),
    ],
)
def test_an_unsupported_database_url_is_named_as_every_other_configuration_error(url, expected):
    # Was "database url: unsupported database ..." (no file, not the key as written).
    assert error(f"database_url: '{url}'\n" + BASE) == f"ratebeam.yaml: database_url: {expected}"


def test_a_postgresql_url_without_psycopg_names_the_key_and_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as on an install without the [postgresql] extra
    assert error("database_url: 'postgresql://rb:pw@db/ratebeam'\n" + BASE) == (
        "ratebeam.yaml: database_url: needs psycopg, which is not installed: "
        "pip install 'ratebeam[postgresql]': 'postgresql://rb:***@db/ratebeam'")


def test_a_number_over_the_integer_digit_limit_is_named_by_line_column_and_key():
    # Was "ratebeam.yaml: (file): a number has more than 4300 digits".
    assert error(BASE + "lease_seconds: " + "9" * 5000 + "\n") == (
        f"ratebeam.yaml: line {BASE.count(chr(10)) + 1}, column 16: lease_seconds: a number has more than 4300 digits")
    assert error(BASE.replace("scopes: [p1, p2]", "scopes: [p1, " + "7" * 4301 + "]")) == (
        "ratebeam.yaml: line 2, column 41: fetcher.scopes[1]: a number has more than 4300 digits")


def test_metrics_errors_name_the_metrics_file(tmp_path):
    Path("metrics.yml").write_text("metrics: {cpu: {unit: u, factor: 1/0}}\n")
    message = error(BASE)
    assert message == f"{tmp_path.resolve() / 'metrics.yml'}: metrics.cpu.factor: not a number or fraction: '1/0'"


def test_metrics_extra_args_are_validated_for_the_configured_collector():
    Path("metrics.yml").write_text("metrics: {cpu: {unit: u, extra_args: {resource_type: instance}}}\n")
    assert "metrics.cpu.extra_args.resource_type: unknown key (expected one of: aggregation_method)" in error(BASE)


def test_missing_file():
    with pytest.raises(InputError) as info:
        load_config("nope.yaml")
    assert str(info.value) == "nope.yaml: (file): cannot read: No such file or directory"

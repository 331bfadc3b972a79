"""The typed configuration: every connector's model refuses unknown keys and coercions, the section
unions name the known backends, runner configs are read with the duplicate-key YAML loader, and
long values are shown as a short excerpt."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.runners.config import load_runner_config

BASE = {
    "fetcher": "{backend: source, scopes: [p1]}",
    "collector": "{backend: file, url: usage/}",
    "storage": "{backend: parquet, url: rated/}",
}

#: One valid section of every connector, and where it goes.
SECTIONS = [
    ("fetcher", "fetcher", "{backend: source, scopes: [p1]}"),
    ("fetcher", "fetcher", "{backend: prometheus, url: 'http://p/api/v1', metric: m}"),
    ("collector", "collector", "{backend: file, url: usage/}"),
    ("collector", "collector", "{backend: prometheus, url: 'http://p/api/v1'}"),
    ("storage", "storage.backends[0]", "{backend: parquet, url: rated/}"),
    ("storage", "storage.backends[0]", "{backend: influxdb, url: 'http://h:8086'}"),
    ("storage", "storage.backends[0]", "{backend: elasticsearch, url: 'http://h:9200'}"),
    ("storage", "storage.backends[0]", "{backend: opensearch, url: 'http://h:9200'}"),
]


def write(tmp_path: Path, **sections: str) -> Path:
    (tmp_path / "metrics.yml").write_text("metrics: {cpu: {unit: u, groupby: [id]}}\n")
    chosen = BASE | sections
    (tmp_path / "ratebeam.yaml").write_text(
        f"metrics: metrics.yml\nfetcher: {chosen['fetcher']}\ncollector: {chosen['collector']}\n"
        f"storage:\n  backends:\n    - {chosen['storage']}\n"
    )
    return tmp_path / "ratebeam.yaml"


def refused(path: Path) -> str:
    """The error's text after the file name (which it starts with)."""
    with pytest.raises(InputError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ")
    return str(info.value).removeprefix(f"{path}: ")


@pytest.mark.parametrize(("kind", "at", "section"), SECTIONS)
def test_every_connector_model_accepts_its_section(tmp_path, kind, at, section):
    config = load_config(write(tmp_path, **{kind: section}))
    chosen = config.storage[0] if kind == "storage" else getattr(config, kind)
    assert chosen.backend == section.split(",")[0].removeprefix("{backend: ")


@pytest.mark.parametrize(("kind", "at", "section"), SECTIONS)
def test_every_connector_model_refuses_unknown_keys_with_the_key_path(tmp_path, kind, at, section):
    message = refused(write(tmp_path, **{kind: section.replace("}", ", colour: red}")}))
    assert message.startswith(f"{at}.colour: unknown key (expected one of: backend, ")


@pytest.mark.parametrize(
    ("kind", "section", "expected"),
    [
        ("collector", "{backend: prometheus, url: 'http://p/api/v1', retries: '3'}",
         "collector.retries: expected an integer >= 0: '3'"),
        ("collector", "{backend: prometheus, url: 'http://p/api/v1', timeout: '60'}",
         "collector.timeout: expected a number of seconds in (0, 3600]: '60'"),
        ("collector", "{backend: prometheus, url: 'http://p/api/v1', insecure: 'yes'}",
         "collector.insecure: expected true or false: 'yes'"),
        ("storage", "{backend: influxdb, url: 'http://h', version: '2'}",
         "storage.backends[0].version: expected 1 (InfluxQL API) or 2 (v2 API): '2'"),
        ("storage", "{backend: influxdb, url: 'http://h', batch_lines: 1.5}",
         "storage.backends[0].batch_lines: expected an integer >= 1: 1.5"),
        ("storage", "{backend: opensearch, url: 'http://h', timeout: true}",
         "storage.backends[0].timeout: expected a number of seconds in (0, 3600]: True"),
        ("fetcher", "{backend: source, scopes: [1]}", "fetcher.scopes[0]: expected a non-empty string: 1"),
        ("collector", "{backend: file, url: 5}", "collector.url: expected a non-empty string: 5"),
    ],
)
def test_strict_types_refuse_a_string_or_boolean_for_a_number(tmp_path, kind, section, expected):
    assert refused(write(tmp_path, **{kind: section})) == expected


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("fetcher", "fetcher.backend: expected one of source, prometheus, gnocchi, keystone: 'nosuch'"),
        ("collector", "collector.backend: expected one of file, prometheus, gnocchi, aetos: 'nosuch'"),
        ("storage", "storage.backends[0].backend: expected one of parquet, influxdb, elasticsearch, opensearch, loki, delta: 'nosuch'"),
    ],
)
def test_the_section_union_names_the_known_backends(tmp_path, kind, expected):
    assert refused(write(tmp_path, **{kind: "{backend: nosuch}"})) == expected


def test_one_tls_spelling_for_every_http_connector(tmp_path):
    (tmp_path / "ca.pem").write_text("x")
    for kind, section in [("collector", "{backend: prometheus, url: 'https://p/api/v1', cafile: ca.pem}"),
                          ("storage", "{backend: influxdb, url: 'https://h', cafile: ca.pem}"),
                          ("storage", "{backend: opensearch, url: 'https://h', cafile: ca.pem}")]:
        config = load_config(write(tmp_path, **{kind: section}))
        chosen = config.storage[0] if kind == "storage" else config.collector
        assert chosen.verify == str(tmp_path / "ca.pem")
        both = section.replace("}", ", insecure: true}")
        assert "cafile: cafile with insecure: true makes no sense" in refused(write(tmp_path, **{kind: both}))
    config = load_config(write(tmp_path, storage="{backend: influxdb, url: 'https://h', insecure: true}"))
    assert config.storage[0].connection.verify is False


def test_a_long_value_is_shown_as_a_short_excerpt(tmp_path):
    message = refused(write(tmp_path, fetcher="{backend: source, scopes: '" + "x" * 1000 + "'}"))
    assert message.startswith("fetcher.scopes: expected a non-empty list of strings: 'xxx")
    assert message.endswith("...") and len(message) < 300


def runner(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "runner.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_runner_config_is_read():
    config = load_runner_config(Path(__file__).parents[1] / "runner_configs" / "direct.yaml")
    assert (config.runner, list(config.options)) == ("FnApiRunner", [])


def test_runner_config_refuses_a_duplicate_key(tmp_path):
    path = runner(tmp_path, "runner: FnApiRunner\noptions: []\nrunner: FlinkRunner\n")
    with pytest.raises(InputError) as info:
        load_runner_config(path)
    assert str(info.value) == f"{path}: line 3, column 1: duplicate key (first at line 1): 'runner'"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("runner: Flink\n", "runner: expected one of FnApiRunner, DirectRunner, BundleBasedDirectRunner, "
         "FlinkRunner, PortableRunner, DaskRunner: 'Flink'"),
        ("runner: FlinkRunner\noptions: [-x]\n", "options: must be a list of '--flag=value' strings: ['-x']"),
        ("runner: FlinkRunner\nflags: []\n", "flags: unknown key (expected one of: dask, environment, options, prism, resource_hints, runner, "
                                              "runner_options)"),
        ("options: []\n", "runner: required key is missing"),
        ("[]\n", "(top level): expected a mapping: []"),
    ],
)
def test_runner_config_errors_name_the_key(tmp_path, text, expected):
    path = runner(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_runner_config(path)
    assert str(info.value) == f"{path}: {expected}"


# --- shared exact types (connectors.config_model), through the one adapter ----------------------


def _exact(value: object) -> object:
    from ratebeam.connectors.config_model import ConfigModel, ExactDecimal, Instant
    from ratebeam.pipelines.validation import validate

    class Sample(ConfigModel):
        amount: ExactDecimal | None = None
        at: Instant | None = None

    try:
        return validate(Sample, value, "sample.json")
    except InputError as exc:
        return str(exc)


def test_exact_decimal_keeps_the_written_number() -> None:
    assert str(_exact({"amount": "1.50"}).amount) == "1.50"  # text kept, trailing zero included
    assert _exact({"amount": 0.1}).amount == Decimal("0.1")  # a float as written, not its binary expansion
    assert _exact({"amount": Decimal("2.000")}).amount.as_tuple() == Decimal("2.000").as_tuple()
    assert _exact({"amount": 10**30}).amount == Decimal(10**30)


@pytest.mark.parametrize(("value", "expected"), [
    ("1/2", "sample.json: amount: not a decimal: '1/2'"),
    ("NaN", "sample.json: amount: not a decimal: 'NaN'"),
    (float("inf"), "sample.json: amount: not a finite number: inf"),
    (True, "sample.json: amount: must be a decimal string or a number, not a boolean"),
    ([1], "sample.json: amount: must be a decimal string or a number, not a list"),
    (Decimal("sNaN"), "sample.json: amount: not a finite number: Decimal('sNaN')"),
])
def test_exact_decimal_refuses_what_is_not_a_plain_number(value: object, expected: str) -> None:
    assert _exact({"amount": value}) == expected


def test_instant_is_aware_utc() -> None:
    assert _exact({"at": "2024-06-01T02:00:00+02:00"}).at == datetime(2024, 6, 1, tzinfo=UTC)
    assert _exact({"at": "2024-06-01"}).at == datetime(2024, 6, 1, tzinfo=UTC)  # naive means UTC
    assert _exact({"at": "soon"}) == "sample.json: at: not an ISO-8601 datetime: 'soon'"
    assert _exact({"at": 1717200000}) == "sample.json: at: must be an ISO-8601 datetime string, not a number"

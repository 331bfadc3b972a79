"""Every number of the configuration is bounded to what the code can hold.

``period: 10**21``, ``wait_periods: 10**20`` or ``lease_seconds: 10**20`` used to be accepted and to
fail later with ``OverflowError`` — after the run had taken its leases; ``retries: 1000000`` was
accepted too.  Now each is one ``InputError`` naming the file, the key and the value, and
``ratebeam run`` exits 2 before it opens the database.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ratebeam.pipelines.cli import main
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.errors import InputError

BASE = """\
metrics: metrics.yml
fetcher: {backend: source, scopes: [p1]}
collector: {backend: file, url: usage/}
storage:
  backends:
    - {backend: parquet, url: rated/}
"""
HUGE = 10**21


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("metrics.yml").write_text("metrics: {cpu: {unit: instance, groupby: [id]}}\n")


def write(extra: str) -> str:
    Path("ratebeam.yaml").write_text(textwrap.dedent(BASE) + textwrap.dedent(extra))
    return "ratebeam.yaml"


def error(extra: str) -> str:
    with pytest.raises(InputError) as info:
        load_config(write(extra))
    return str(info.value)


@pytest.mark.parametrize(("key", "bound"), [
    ("period", "<= 31622400"),
    ("wait_periods", "<= 1000"),
    ("lease_seconds", "<= 86400"),
    ("max_periods_per_run", "<= 1000000"),
    ("rebatch_rows", "<= 10000000"),
])
@pytest.mark.parametrize("value", [HUGE, 10**20, "1.0e+21"])
def test_a_number_beyond_the_bound_is_refused_naming_key_and_value(key, bound, value):
    message = error(f"{key}: {value}\n")
    if isinstance(value, int):
        assert message == f"ratebeam.yaml: {key}: expected an integer {bound}: {value}"
    else:  # YAML's float: not an integer at all
        assert message.startswith(f"ratebeam.yaml: {key}: expected an integer >= "), message


@pytest.mark.parametrize(("key", "top"), [
    ("period", 31622400), ("wait_periods", 1000), ("lease_seconds", 86400),
    ("max_periods_per_run", 1000000), ("rebatch_rows", 10000000),
])
def test_the_bound_itself_is_accepted(key, top):
    assert getattr(load_config(write(f"{key}: {top}\n")), key) == top


@pytest.mark.parametrize("section", [
    "collector: {backend: prometheus, url: 'http://127.0.0.1:1/api/v1', retries: 1000000}",
    "fetcher: {backend: prometheus, url: 'http://127.0.0.1:1/api/v1', metric: up, retries: 1000000}",
])
def test_prometheus_retries_are_bounded(section):
    key = section.split(":")[0]
    text = BASE.replace(next(line for line in BASE.splitlines() if line.startswith(key)), section)
    Path("ratebeam.yaml").write_text(text)
    with pytest.raises(InputError) as info:
        load_config("ratebeam.yaml")
    assert str(info.value) == f"ratebeam.yaml: {key}.retries: expected an integer <= 10: 1000000"


@pytest.mark.parametrize("backend", [
    "{backend: influxdb, url: 'http://127.0.0.1:1', retries: 1000000}",
    "{backend: loki, url: 'http://127.0.0.1:1/loki/api/v1', retries: 1000000}",
])
def test_storage_retries_are_bounded(backend):
    Path("ratebeam.yaml").write_text(BASE.replace("{backend: parquet, url: rated/}", backend))
    with pytest.raises(InputError) as info:
        load_config("ratebeam.yaml")
    assert str(info.value) == "ratebeam.yaml: storage.backends[0].retries: expected an integer <= 10: 1000000"


def test_run_refuses_the_configuration_before_opening_the_database(tmp_path, capsys):
    Path("usage").mkdir()
    Path("usage/u.csv").write_text("metric,timestamp,value,project_id,id\ncpu,2026-01-01T00:00:00Z,1,p1,a\n")
    write(f"lease_seconds: {10**20}\n")
    assert main(["run", "-c", "ratebeam.yaml", "--now", "2026-01-02T00:00:00Z"]) == 2
    err = capsys.readouterr().err
    assert f"ratebeam.yaml: lease_seconds: expected an integer <= 86400: {10**20}" in err
    assert "Traceback" not in err
    assert not (tmp_path / "ratebeam.db").exists() and not (tmp_path / "rated").exists()

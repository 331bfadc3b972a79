"""ratebeam.yaml: every key given a value of the wrong kind, YAML the loader must refuse, odd files."""

from __future__ import annotations

import pytest

from bad_input.harness import (
    BOMB,
    DELETE,
    Case,
    both,
    check_refused,
    nested,
    params,
    replace,
    set_yaml,
    write,
)
from ratebeam.pipelines.demo import DEMO_NOW

RUN = ("run", "-c", "{c}", "--now", DEMO_NOW.isoformat())
CONFIG = "{c}"

#: Values no integer key accepts (``period``, ``lease_seconds``, ...).
NOT_INTEGERS = {"negative": -1, "text": "3600", "float": 1.5, "bool": True, "null": None, "list": [3600],
                "mapping": {"a": 1}, "nan": float("nan"), "inf": float("inf"), "exponent": 1e21}
INTEGER_KEYS = ("period", "wait_periods", "max_periods_per_run", "lease_seconds", "rebatch_rows")
NOT_STRINGS = {"empty": "", "int": 1, "list": ["a"], "mapping": {"a": "b"}, "null": None, "bool": False}


def _integer_cases() -> list[Case]:
    cases = []
    for key in INTEGER_KEYS:
        for name, value in NOT_INTEGERS.items():
            if key == "wait_periods" and name == "negative":
                value = -2
            cases.append(Case(f"{key}-{name}", set_yaml("ratebeam.yaml", [key], value), RUN, names=(CONFIG, key)))
        cases.append(Case(f"{key}-zero", set_yaml("ratebeam.yaml", [key], 0 if key != "wait_periods" else -1),
                          RUN, names=(CONFIG, key)))
    return cases


def _string_cases() -> list[Case]:
    cases = []
    for key in ("scope_key", "database_url", "metrics"):
        for name, value in NOT_STRINGS.items():
            cases.append(Case(f"{key}-{name}", set_yaml("ratebeam.yaml", [key], value), RUN, names=(CONFIG, key)))
    return cases


SECTIONS = [
    Case("unknown-top-key", set_yaml("ratebeam.yaml", ["colector"], {}), RUN, names=(CONFIG, "colector")),
    Case("capitalised-key", set_yaml("ratebeam.yaml", ["Period"], 60), RUN, names=(CONFIG, "Period")),
    Case("metrics-missing-file", set_yaml("ratebeam.yaml", ["metrics"], "nope.yml"), RUN,
         names=(CONFIG, "metrics", "nope.yml")),
    Case("database-url-not-url", set_yaml("ratebeam.yaml", ["database_url"], "not a url"), RUN,
         names=(CONFIG, "database_url")),
    Case("database-url-unknown-dialect", set_yaml("ratebeam.yaml", ["database_url"], "nosuchdb://h/x"), RUN,
         names=(CONFIG, "database_url", "nosuchdb")),
    Case("database-url-mysql", set_yaml("ratebeam.yaml", ["database_url"], "mysql://u@127.0.0.1:1/db"),
         ("db", "upgrade", "-c", "{c}"), names=(f"{CONFIG}: database_url: unsupported database 'mysql'",)),
    Case("database-url-sqlite-driver", set_yaml("ratebeam.yaml", ["database_url"], "sqlite+pysqlcipher:///x.db"),
         RUN, names=(f"{CONFIG}: database_url: unsupported SQLite driver 'pysqlcipher'",)),
    Case("fetcher-missing", set_yaml("ratebeam.yaml", ["fetcher"], DELETE), RUN, names=(CONFIG, "fetcher")),
    Case("fetcher-not-mapping", set_yaml("ratebeam.yaml", ["fetcher"], "source"), RUN, names=(CONFIG, "fetcher")),
    Case("fetcher-unknown-backend", set_yaml("ratebeam.yaml", ["fetcher", "backend"], "ceilometer"), RUN,
         names=(CONFIG, "fetcher", "ceilometer")),
    Case("fetcher-no-backend", set_yaml("ratebeam.yaml", ["fetcher", "backend"], DELETE), RUN,
         names=(CONFIG, "fetcher")),
    Case("fetcher-unknown-key", set_yaml("ratebeam.yaml", ["fetcher", "scope"], ["a"]), RUN,
         names=(CONFIG, "fetcher", "scope")),
    Case("collector-missing", set_yaml("ratebeam.yaml", ["collector"], DELETE), RUN, names=(CONFIG, "collector")),
    Case("collector-unknown-backend", set_yaml("ratebeam.yaml", ["collector", "backend"], "monasca"), RUN,
         names=(CONFIG, "collector", "monasca")),
    Case("collector-url-missing", set_yaml("ratebeam.yaml", ["collector", "url"], DELETE), RUN,
         names=(CONFIG, "collector", "url")),
    Case("collector-url-number", set_yaml("ratebeam.yaml", ["collector", "url"], 5), RUN,
         names=(CONFIG, "collector.url")),
    Case("collector-unknown-key", set_yaml("ratebeam.yaml", ["collector", "path"], "x"), RUN,
         names=(CONFIG, "collector", "path")),
    Case("storage-missing", set_yaml("ratebeam.yaml", ["storage"], DELETE), RUN, names=(CONFIG, "storage")),
    Case("storage-no-backends", set_yaml("ratebeam.yaml", ["storage", "backends"], []), RUN,
         names=(CONFIG, "storage")),
    Case("storage-backends-mapping", set_yaml("ratebeam.yaml", ["storage", "backends"], {"backend": "parquet"}),
         RUN, names=(CONFIG, "storage")),
    Case("storage-unknown-key", set_yaml("ratebeam.yaml", ["storage", "backend"], "parquet"), RUN,
         names=(CONFIG, "storage", "backend")),
    Case("storage-unknown-backend", set_yaml("ratebeam.yaml", ["storage", "backends", 0, "backend"], "gnocchi"),
         RUN, names=(CONFIG, "storage.backends[0]", "gnocchi")),
    Case("storage-url-not-url", set_yaml("ratebeam.yaml", ["storage", "backends", 0, "url"], "htp:/x"), RUN,
         names=(CONFIG, "storage.backends[0].url")),
    Case("storage-url-number", set_yaml("ratebeam.yaml", ["storage", "backends", 0, "url"], 7), RUN,
         names=(CONFIG, "storage.backends[0].url")),
    Case("storage-second-bad", set_yaml("ratebeam.yaml", ["storage", "backends", 1], {"backend": "influxdb"}), RUN,
         names=(CONFIG, "storage.backends[1]")),
    Case("scopes-empty", set_yaml("ratebeam.yaml", ["fetcher", "scopes"], []), RUN,
         names=(CONFIG, "fetcher.scopes")),
    Case("scopes-string", set_yaml("ratebeam.yaml", ["fetcher", "scopes"], "acme"), RUN,
         names=(CONFIG, "fetcher.scopes")),
    Case("scopes-number", set_yaml("ratebeam.yaml", ["fetcher", "scopes", 0], 12), RUN,
         names=(CONFIG, "fetcher.scopes[0]")),
    Case("scopes-empty-name", set_yaml("ratebeam.yaml", ["fetcher", "scopes", 1], ""), RUN,
         names=(CONFIG, "fetcher.scopes[1]")),
    Case("scopes-null", set_yaml("ratebeam.yaml", ["fetcher", "scopes", 2], None), RUN,
         names=(CONFIG, "fetcher.scopes[2]")),
]

#: Text the YAML loader itself refuses, each named by line or as the file.
YAML_TEXT = [
    Case("yaml-tab-indent", replace("ratebeam.yaml", "  backend: source", "\tbackend: source"), RUN,
         names=(CONFIG, "line")),
    Case("yaml-unclosed-list", replace("ratebeam.yaml", "scopes: [", "scopes: [[", 1), RUN, names=(CONFIG, "line")),
    Case("yaml-duplicate-key", replace("ratebeam.yaml", "period: 3600", "period: 3600\nperiod: 60"), RUN,
         names=(CONFIG, "duplicate key", "period")),
    Case("yaml-duplicate-section", replace("ratebeam.yaml", "fetcher:", "fetcher: {backend: source}\nfetcher:"),
         RUN, names=(CONFIG, "duplicate key", "fetcher")),
    Case("yaml-deep-lists", replace("ratebeam.yaml", "period: 3600", "period: " + nested(3000)), RUN,
         names=(CONFIG, "nested too deeply")),
    Case("yaml-deep-mappings", replace("ratebeam.yaml", "period: 3600", "period: " + "{a: " * 3000 + "}" * 3000),
         RUN, names=(CONFIG, "nested too deeply")),
    Case("yaml-long-integer", replace("ratebeam.yaml", "period: 3600", "period: " + "9" * 5000), RUN,
         names=(f"{CONFIG}: line 3, column 9: period: a number has more than 4300 digits",)),
    Case("yaml-bomb-value", replace("ratebeam.yaml", "period: 3600", "period: " + BOMB), RUN,
         names=(CONFIG, "period", "...")),
    Case("yaml-bomb-scopes", replace("ratebeam.yaml", "scopes: [", "scopes: [" + BOMB + ", "), RUN,
         names=(CONFIG, "fetcher.scopes[0]", "...")),
    Case("yaml-unhashable-key", write("ratebeam.yaml", "? [a, b]\n: 1\n"), RUN, names=(CONFIG, "line")),
    Case("yaml-python-tag", replace("ratebeam.yaml", "period: 3600", "period: !!python/object/apply:os.getcwd []"),
         RUN, names=(CONFIG, "line")),
    Case("yaml-custom-tag", replace("ratebeam.yaml", "period: 3600", "period: !hours 1"), RUN,
         names=(CONFIG, "line")),
    Case("yaml-two-documents", replace("ratebeam.yaml", "period: 3600", "period: 3600\n---\nperiod: 60"), RUN,
         names=(CONFIG,)),
    Case("yaml-empty-file", write("ratebeam.yaml", ""), RUN, names=(CONFIG,)),
    Case("yaml-only-comment", write("ratebeam.yaml", "# nothing\n"), RUN, names=(CONFIG,)),
    Case("yaml-top-list", write("ratebeam.yaml", "- period: 3600\n"), RUN, names=(CONFIG,)),
    Case("yaml-top-scalar", write("ratebeam.yaml", "ratebeam\n"), RUN, names=(CONFIG,)),
    Case("yaml-not-utf8", write("ratebeam.yaml", b"period: \xff\xfe\n"), RUN, names=(CONFIG, "UTF-8")),
    Case("yaml-nul-byte", write("ratebeam.yaml", "period: 3600\x00\n"), RUN, names=(CONFIG,)),
    Case("yaml-bad-escape", replace("ratebeam.yaml", "period: 3600", 'period: "\\q"'), RUN, names=(CONFIG, "line")),
    Case("yaml-anchor-unknown", replace("ratebeam.yaml", "period: 3600", "period: *nowhere"), RUN,
         names=(CONFIG, "line")),
    Case("yaml-period-string-unit", replace("ratebeam.yaml", "period: 3600", "period: 1h"), RUN,
         names=(CONFIG, "period", "'1h'")),
    Case("metrics-yaml-broken", both(write("metrics.yml", "metrics: [\n")), RUN, names=("metrics.yml", "line")),
]


def _no_config_file(ws):
    ws.unlink()


def _config_is_directory(ws):
    ws.unlink()
    ws.mkdir()


def _symlink_loop(ws):
    ws.unlink()
    ws.symlink_to(ws)


def _unreadable(ws):
    ws.chmod(0)


FILES = [
    Case("config-missing", _no_config_file, RUN, names=(CONFIG, "cannot read")),
    Case("config-directory", _config_is_directory, RUN, names=(CONFIG, "cannot read")),
    Case("config-symlink-loop", _symlink_loop, RUN, names=(CONFIG, "cannot read")),
]

CASES = _integer_cases() + _string_cases() + SECTIONS + YAML_TEXT + FILES


@pytest.mark.parametrize("case", params(CASES))
def test_refused(case, workspace_for):
    check_refused(case, workspace_for(case))

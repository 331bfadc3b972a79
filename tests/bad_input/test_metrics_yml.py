"""metrics.yml: each key of a metric given a wrong value, and skip expressions outside the language."""

from __future__ import annotations

import pytest

from bad_input.harness import DELETE, Case, both, check_refused, params, replace, set_yaml, write
from ratebeam.pipelines.demo import DEMO_NOW

RUN = ("run", "-c", "{c}", "--now", DEMO_NOW.isoformat())
METRIC = ["metrics", "openstack_nova_server_status"]
WHERE = "metrics.openstack_nova_server_status"


def _metric(key: str, value: object) -> object:
    return set_yaml("metrics.yml", [*METRIC, key], value)


VALUES = {
    "unit": {"list": ["instance"], "number": 3, "empty": "", "null": None, "mapping": {"a": 1}},
    "alt_name": {"list": ["x"], "number": 3, "empty": "", "mapping": {"a": 1}},
    "factor": {"zero-division": "1/0", "letters": "a/b", "empty": "", "list": [1], "three-parts": "1/2/3",
               "nan": "nan", "bool": True, "mapping": {"a": 1}},
    "offset": {"letters": "abc", "list": [1], "mapping": {"a": 1}, "bool": True, "nan": "NaN"},
    "mutate": {"unknown": "ROUND", "lowercase": "numbool", "number": 1, "list": ["NUMBOOL"]},
    "groupby": {"string": "id", "number-item": [1], "mapping": {"id": 1}, "empty-item": [""]},
    "metadata": {"string": "flavor_name", "number-item": [2], "mapping": {"a": 1}},
    "extra_args": {"unknown-key": {"colour": "red"}, "list": [1], "string": "x",
                   "bad-aggregation": {"aggregation_method": "median"}},
    "skip_datapoints_expression": {"number": 1, "list": ["qty"], "empty": ""},
}

#: Texts outside the skip-expression language: Python that CloudKitty would ``eval``, and worse.
SKIP_TEXTS = {
    "import": "__import__('os').system('id')",
    "dunder": "datapoint.__class__",
    "call": "len(qty) > 1",
    "arithmetic": "qty + 1 > 2",
    "lambda": "(lambda: True)()",
    "attribute": "qty.real > 0",
    "subscript-int": "datapoint[0] == 1",
    "unterminated": "unit == 'instance",
    "bad-escape": "unit == '\\n'",
    "number-vs-string": "qty == 'one'",
    "string-vs-number": "unit > 3",
    "dangling-and": "qty > 0 and",
    "dangling-not": "not",
    "lone-operand": "qty",
    "unknown-name": "volume > 3",
    "unknown-section": "datapoint['secrets']['x'] == 1",
    "semicolon": "qty > 0; True",
    "unclosed-paren": "(qty > 0",
    "extra-paren": "qty > 0)",
    "deep-parens": "(" * 80 + "qty > 0" + ")" * 80,
    "deep-not": "not " * 80 + "qty > 0",
    "huge-nesting": "(" * 20000 + "qty > 0" + ")" * 20000,
    "too-long": " or ".join(["qty == 1"] * 600),
    "number-too-wide": "qty == 1" + "0" * 60,
    "walrus": "(x := 1) == 1",
    "fstring": "f'{qty}' == '1'",
    "in-not-list": "unit in 'instance'",
    "in-variable": "unit in groupby",
    "get-bad-default": "datapoint.get('groupby', []).get('id') == 'x'",
    "control-char": "qty == 1\x07",
}


def _cases() -> list[Case]:
    cases = [Case(f"{key}-{name}", _metric(key, value), RUN, names=("metrics.yml", f"{WHERE}.{key}"))
             for key, values in VALUES.items() for name, value in values.items()]
    cases += [Case(f"skip-{name}", _metric("skip_datapoints_expression", text), RUN,
                   names=("metrics.yml", f"{WHERE}.skip_datapoints_expression"))
              for name, text in SKIP_TEXTS.items()]
    cases += [
        Case("mutate-map-word-key", both(_metric("mutate", "MAP"), _metric("mutate_map", {"a": 2, 1: 1})), RUN,
             names=("metrics.yml", f"{WHERE}.mutate_map.a: not a number")),
        Case("factor-underflows", _metric("factor", "1e-400"), RUN,
             names=("metrics.yml", f"{WHERE}.factor: not 0, but its float is 0.0", "'1e-400'")),
        Case("factor-float-underflows", replace("metrics.yml", "factor: 1/1073741824", "factor: 1.0e-400"), RUN,
             names=("metrics.yml", "metrics.openstack_cinder_volume_size_bytes.factor: not 0", "'1.0e-400'")),
        Case("unknown-metric-key", _metric("colour", "red"), RUN, names=("metrics.yml", "colour")),
        Case("metric-not-mapping", set_yaml("metrics.yml", METRIC, "instance"), RUN, names=("metrics.yml", WHERE)),
        Case("metric-null", set_yaml("metrics.yml", METRIC, None), RUN, names=("metrics.yml", WHERE)),
        Case("no-metrics-key", write("metrics.yml", "metric: {}\n"), RUN, names=("metrics.yml",)),
        Case("metrics-list", write("metrics.yml", "metrics: [a, b]\n"), RUN, names=("metrics.yml", "metrics")),
        Case("metrics-empty", write("metrics.yml", "metrics: {}\n"), RUN, names=("metrics.yml", "metrics")),
        Case("unit-missing", _metric("unit", DELETE), RUN, names=("metrics.yml", f"{WHERE}.unit")),
        Case("top-unknown-key", set_yaml("metrics.yml", ["fetcher"], {}), RUN, names=("metrics.yml", "fetcher")),
        Case("same-alt-name", set_yaml("metrics.yml", ["metrics", "openstack_neutron_floating_ip", "alt_name"],
                                       "instance"), RUN, names=("metrics.yml", "instance")),
        Case("not-utf8", write("metrics.yml", b"metrics:\n  \xff: {}\n"), RUN, names=("metrics.yml", "UTF-8")),
        Case("deep", write("metrics.yml", "metrics: " + "[" * 3000 + "]" * 3000 + "\n"), RUN,
             names=("metrics.yml", "nested too deeply")),
    ]
    return cases


@pytest.mark.parametrize("case", params(_cases()))
def test_refused(case, workspace_for):
    check_refused(case, workspace_for(case))

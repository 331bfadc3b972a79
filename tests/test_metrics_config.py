"""metrics.yml: CloudKitty's schema and semantics (`cloudkitty/collector/__init__.py:64-119`), and one clear error per bad input."""

from __future__ import annotations

import json
import pickle
import subprocess
import textwrap
from decimal import Decimal
from pathlib import Path

import pytest
from servers import cloudkitty_python

from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.metrics_config import load_metrics
from ratebeam.transforms.metric_defs import (
    FileExtraArgs,
    GnocchiExtraArgs,
    MetricsConfig,
    Mutate,
    PrometheusExtraArgs,
)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # errors then name the file as written: "metrics.yml"


def load(text: str, scope_key: str = "project_id", collector: str = "file") -> MetricsConfig:
    Path("metrics.yml").write_text(textwrap.dedent(text))
    return load_metrics("metrics.yml", scope_key, collector)


def error(text: str, scope_key: str = "project_id", collector: str = "file") -> str:
    with pytest.raises(InputError) as info:
        load(text, scope_key, collector)
    return str(info.value)


# ---- defaults and naming (cloudkitty/collector/__init__.py:81-227) ----


def test_minimal_metric_gets_cloudkitty_defaults():
    (m,) = load("metrics: {cpu: {unit: instance}}").metrics
    assert (m.key, m.name, m.rating_type, m.unit) == ("cpu", "cpu", "cpu", "instance")
    assert m.factor == 1 and m.offset == 0 and m.mutate is Mutate.NONE and m.mutate_map is None
    assert m.groupby == ("project_id",) and m.metadata == ()
    assert m.description is None and m.skip_datapoints_expression is None
    assert m.extra_args == FileExtraArgs(aggregation_method="max")


def test_scope_key_is_appended_to_groupby_in_order_once():
    config = load(
        """
        metrics:
          a: {unit: u, groupby: [id, flavor_name]}
          b: {unit: u, groupby: [project_id, id]}
          c: {unit: u, groupby: [id], metadata: [os_distro, vcpus]}
        """
    )
    assert [m.groupby for m in config.metrics] == [
        ("id", "flavor_name", "project_id"),
        ("project_id", "id"),
        ("id", "project_id"),
    ]
    assert config.metrics[2].metadata == ("os_distro", "vcpus")
    assert load("metrics: {a: {unit: u}}", scope_key="domain_id").metrics[0].groupby == ("domain_id",)


def test_list_of_definitions_becomes_name_at_alt_name_keys():
    config = load(
        """
        metrics:
          cpu:
            - {unit: instance, alt_name: instance}
            - {unit: gpu, alt_name: instance_gpu, description: GPU instances}
          ram: {unit: MiB}
        """
    )
    assert [(m.key, m.name, m.rating_type) for m in config.metrics] == [
        ("cpu@#instance", "cpu", "instance"),
        ("cpu@#instance_gpu", "cpu", "instance_gpu"),
        ("ram", "ram", "ram"),
    ]
    assert config.rating_types == ("instance", "instance_gpu", "ram")
    assert config.by_rating_type("instance_gpu").description == "GPU instances"
    with pytest.raises(KeyError):
        config.by_rating_type("cpu")


# ---- numbers: num2decimal (cloudkitty/utils/__init__.py:250-292) ----


def test_factor_and_offset_follow_num2decimal():
    config = load(
        """
        metrics:
          int: {unit: u, factor: 3600, offset: -2}
          big: {unit: u, factor: 123456789012345678901234567890}
          float: {unit: u, factor: 0.001, offset: 0.5}
          fraction: {unit: u, factor: 1/1048576, offset: "1/3"}
          text: {unit: u, factor: "0.1"}
        """
    )
    m = {x.name: x for x in config.metrics}
    assert (m["int"].factor, m["int"].offset) == (Decimal(3600), Decimal(-2))
    assert m["big"].factor == Decimal("123456789012345678901234567890")  # ints are exact
    # floats are their exact binary expansion, not the decimal the user typed
    assert str(m["float"].factor) == "0.001000000000000000020816681711721685132943093776702880859375"
    assert m["float"].offset == Decimal("0.5")
    assert m["fraction"].factor == Decimal(2) ** -20  # exactly representable
    assert str(m["fraction"].offset) == "0.333333333333333314829616256247390992939472198486328125"
    assert str(m["text"].factor) == "0.1000000000000000055511151231257827021181583404541015625"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("'1/0'", "not a number or fraction: '1/0'"),
        ("a/b", "not a number or fraction: 'a/b'"),
        ("true", "not a number or fraction: True"),
        ("null", "not a number or fraction: None"),
        ("[1]", "not a number or fraction: [1]"),
        (".inf", "not a finite number: inf"),
        ("'1e400'", "number too large: '1e400'"),
    ],
)
def test_bad_factor_is_one_error_with_file_path_and_value(value, message):
    text = f"metrics: {{cpu: [{{unit: u, alt_name: a}}, {{unit: u, alt_name: b, factor: {value}}}]}}"
    assert error(text) == f"metrics.yml: metrics.cpu[1].factor: {message}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # a fraction's text: CloudKitty's Fraction -> float underflows (or overflows)
        ("factor: '1e-400'", "metrics.cpu.factor: not 0, but its float is 0.0 (CloudKitty computes with the "
         "float of a fraction): '1e-400'"),
        ("factor: '-1/1" + "0" * 400 + "'", "metrics.cpu.factor: not 0, but its float is 0.0 (CloudKitty "
         "computes with the float of a fraction): '-1/1000"),
        ("offset: '1e-330'", "metrics.cpu.offset: not 0, but its float is 0.0"),
        # a YAML float: the loader's float is 0.0 or inf already, the text says what was meant
        ("factor: 1.0e-400", "line 1, column 34: metrics.cpu.factor: not 0, but a float cannot hold it "
         "(it would be 0.0): '1.0e-400'"),
        ("offset: -2.5e+400", "line 1, column 34: metrics.cpu.offset: too large for a float (it would be "
         "-inf): '-2.5e+400'"),
        ("mutate: MAP, mutate_map: {1.0e-999: 1}", "metrics.cpu.mutate_map: not 0, but a float cannot hold it"),
        ("mutate: MAP, mutate_map: {1: 5.0e-324, 2: 1.0e-400}", "metrics.cpu.mutate_map.2: not 0, but a float "
         "cannot hold it (it would be 0.0): '1.0e-400'"),
    ],
)
def test_a_non_zero_number_whose_float_is_zero_or_infinite_is_refused(text, expected):
    # Factor: 1e-400 became 0.0 and every quantity of the metric 0, exit 0.
    message = error(f"metrics: {{cpu: {{unit: u, {text}}}}}")
    assert message.startswith("metrics.yml: ") and expected in message, message


def test_a_literal_zero_factor_and_the_smallest_floats_are_taken():
    config = load("metrics: {a: {unit: u, factor: 0}, b: {unit: u, factor: '0/5', offset: 5.0e-324}, "
                  "c: {unit: u, factor: '1e-300'}}")
    factors = {m.name: m.factor for m in config.metrics}
    assert factors["a"] == factors["b"] == 0 and factors["c"] == Decimal(1e-300)
    assert config.metrics[1].offset == Decimal(5e-324)


def test_a_number_over_the_integer_digit_limit_is_named_by_line_column_and_key():
    # Was "metrics.yml: (file): a number has more than 4300 digits".
    text = "metrics:\n  cpu:\n    unit: u\n    mutate: MAP\n    mutate_map: {1: 2, 3: " + "9" * 4400 + "}\n"
    assert error(text) == "metrics.yml: line 5, column 27: metrics.cpu.mutate_map.3: a number has more than 4300 digits"


def test_bad_offset():
    assert error("metrics: {cpu: {unit: u, offset: x}}") == "metrics.yml: metrics.cpu.offset: not a number or fraction: 'x'"


# ---- mutate (cloudkitty/collector/__init__.py:81-119) ----


def test_mutate_values_and_map():
    config = load(
        """
        metrics:
          a: {unit: u, mutate: NUMBOOL}
          b: {unit: u, mutate: CEIL}
          c:
            unit: u
            mutate: MAP
            mutate_map: {0: 0, 1: 0.1, 2.5: 7, 0.1: "1.50"}
        """
    )
    assert [m.mutate for m in config.metrics] == [Mutate.NUMBOOL, Mutate.CEIL, Mutate.MAP]
    mapping = config.metrics[2].mutate_map
    assert mapping is not None
    # values as CloudKitty's DataPoint makes them: a float through str()
    assert mapping[Decimal(1)] == Decimal("0.1") and mapping[Decimal("2.5")] == 7
    # keys as CloudKitty's dict.get(Decimal) matches them: the float's exact value
    assert mapping[Decimal(0.1)] == Decimal("1.50")
    assert Decimal("0.1") not in mapping


def test_unknown_mutate():
    assert error("metrics: {cpu: {unit: u, mutate: ROUND}}") == (
        "metrics.yml: metrics.cpu.mutate: unknown mutate 'ROUND' (expected NONE, NUMBOOL, NOTNUMBOOL, FLOOR, CEIL, MAP)"
    )
    assert "unknown mutate ['MAP']" in error("metrics: {cpu: {unit: u, mutate: [MAP]}}")


def test_map_requires_mutate_map_and_back():
    assert error("metrics: {cpu: {unit: u, mutate: MAP}}") == (
        "metrics.yml: metrics.cpu.mutate_map: required when mutate is MAP"
    )
    assert error("metrics: {cpu: {unit: u, mutate_map: {1: 2}}}") == (
        "metrics.yml: metrics.cpu.mutate_map: only allowed with mutate: MAP (mutate is NONE)"
    )
    assert load("metrics: {cpu: {unit: u, mutate: MAP, mutate_map: {}}}").metrics[0].mutate_map == {}


@pytest.mark.parametrize(
    ("mapping", "expected"),
    [
        ("{true: 2}", "metrics.yml: metrics.cpu.mutate_map.True: mutate_map keys must be numbers"),
        ("{1: abc}", "metrics.yml: metrics.cpu.mutate_map.1: expected a number: 'abc'"),
        ("{1: '1/2'}", "metrics.yml: metrics.cpu.mutate_map.1: expected a number: '1/2'"),
        ("{1: null}", "metrics.yml: metrics.cpu.mutate_map.1: expected a number: None"),
        ("{1: .nan}", "metrics.yml: metrics.cpu.mutate_map.1: not a finite number: nan"),
        ("[1, 2]", "metrics.yml: metrics.cpu.mutate_map: expected a mapping of numbers to numbers: [1, 2]"),
    ],
)
def test_bad_mutate_map(mapping, expected):
    assert error(f"metrics: {{cpu: {{unit: u, mutate: MAP, mutate_map: {mapping}}}}}").startswith(expected)


def test_a_string_mutate_map_key_is_accepted_as_cloudkitty_does_and_never_matches(caplog):
    # Was refused ("mutate_map keys must be numbers"); CloudKitty accepts it, and it never matches.
    [metric] = load("metrics: {cpu: {unit: u, mutate: MAP, mutate_map: {'1': 2, 3: 4}}}").metrics
    assert metric.mutate_map == {Decimal(3): Decimal(4)}
    assert ("metrics.cpu.mutate_map.1: a string key never matches a quantity (CloudKitty looks the quantity up "
            "as a number): ignored, as CloudKitty does; write it unquoted") in caplog.text


@pytest.mark.parametrize("key", ["a", "'2 GB'", "''", "'1/2'"])
def test_a_mutate_map_key_that_is_no_number_is_refused(key):
    # Was accepted (dropped with a warning); no quantity can match it, so MAP
    # mapped every quantity to 0 without a word.
    message = error(f"metrics: {{cpu: {{unit: u, mutate: MAP, mutate_map: {{{key}: 2, 3: 4}}}}}}")
    shown = key.strip("'")
    assert message == (f"metrics.yml: metrics.cpu.mutate_map.{shown}: not a number: a mutate_map key is the "
                       f"quantity it maps, so this one never matches: {shown!r}")


# ---- validate_conf checks and duplicates (cloudkitty/collector/__init__.py:81-227) ----


def test_key_in_groupby_and_metadata_is_refused():
    assert error("metrics: {cpu: {unit: u, groupby: [id], metadata: [flavor, id]}}") == (
        "metrics.yml: metrics.cpu.metadata[1]: also in groupby: a key may not be in both: 'id'"
    )
    assert error("metrics: {cpu: {unit: u, metadata: [project_id]}}") == (
        "metrics.yml: metrics.cpu.metadata[0]: also in groupby: a key may not be in both "
        "(it is always added to groupby): 'project_id'"
    )


def test_duplicate_metric_key_is_refused():
    message = error("metrics: {cpu: [{unit: u, alt_name: inst}, {unit: v, alt_name: inst}]}")
    assert message.startswith("metrics.yml: metrics.cpu[1]: metric key 'cpu@#inst' is already defined by metrics.cpu[0]")
    message = error("metrics: {cpu: [{unit: u}, {unit: v}]}")
    assert message.startswith("metrics.yml: metrics.cpu[1]: metric key 'cpu' is already defined by metrics.cpu[0]")


def test_same_rating_type_twice_is_refused_with_cloudkittys_behaviour_named():
    message = error("metrics: {cpu: {unit: u}, vcpu: {unit: u, alt_name: cpu}}")
    assert message.startswith("metrics.yml: metrics.vcpu: rating type 'cpu' is already produced by metrics.cpu")
    assert "CloudKitty would silently keep only one" in message


def test_duplicate_yaml_key_is_refused_with_its_line():
    message = error(
        """\
        metrics:
          cpu: {unit: u}
          cpu: {unit: v}
        """
    )
    assert message == "metrics.yml: line 3, column 3: duplicate key (first at line 2): 'cpu'"
    assert "duplicate key" in error("metrics: {cpu: {unit: u, unit: v}}")


# ---- wrong shapes and types ----


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "metrics.yml: (top level): expected a mapping: None"),
        ("[1]", "metrics.yml: (top level): expected a mapping: [1]"),
        ("{}", "metrics.yml: metrics: required key is missing"),
        ("{metrics: {}, other: 1}", "metrics.yml: other: unknown key (expected one of: metrics)"),
        ("metrics: {}", "metrics.yml: metrics: expected a non-empty mapping of metric names to definitions: {}"),
        ("metrics: [cpu]", "metrics.yml: metrics: expected a non-empty mapping of metric names to definitions: ['cpu']"),
        ("metrics: {cpu: []}", "metrics.yml: metrics.cpu: expected a metric definition or a non-empty list of them: []"),
        ("metrics: {cpu: x}", "metrics.yml: metrics.cpu: expected a mapping: 'x'"),
        ("metrics: {cpu: [{unit: u}, 3]}", "metrics.yml: metrics.cpu[1]: expected a mapping: 3"),
        ("metrics: {cpu: {}}", "metrics.yml: metrics.cpu.unit: required key is missing"),
        ("metrics: {cpu: {unit: ''}}", "metrics.yml: metrics.cpu.unit: expected a non-empty string: ''"),
        ("metrics: {cpu: {unit: 5}}", "metrics.yml: metrics.cpu.unit: expected a non-empty string: 5"),
        ("metrics: {1: {unit: u}}", "metrics.yml: metrics: metric names must be non-empty strings without '@#': 1"),
        ("metrics: {a@#b: {unit: u}}", "metrics.yml: metrics: metric names must be non-empty strings without '@#': 'a@#b'"),
        ("metrics: {cpu: {unit: u, alt_name: ''}}", "metrics.yml: metrics.cpu.alt_name: expected a non-empty string: ''"),
        ("metrics: {cpu: {unit: u, groupby: id}}", "metrics.yml: metrics.cpu.groupby: expected a list of strings: 'id'"),
        ("metrics: {cpu: {unit: u, groupby: [id, 3]}}", "metrics.yml: metrics.cpu.groupby[1]: expected a non-empty string: 3"),
        ("metrics: {cpu: {unit: u, metadata: ['']}}", "metrics.yml: metrics.cpu.metadata[0]: expected a non-empty string: ''"),
        ("metrics: {cpu: {unit: u, groupby: [id, id]}}", "metrics.yml: metrics.cpu.groupby[1]: listed twice: 'id'"),
        ("metrics: {cpu: {unit: u, description: ''}}", "metrics.yml: metrics.cpu.description: expected a non-empty string: ''"),
        ("metrics: {cpu: {unit: u, colour: red}}", "metrics.yml: metrics.cpu.colour: unknown key (expected one of: "
         "alt_name, description, extra_args, factor, groupby, metadata, mutate, mutate_map, offset, "
         "skip_datapoints_expression, unit)"),
        ("metrics: {cpu: {unit: u, extra_args: []}}", "metrics.yml: metrics.cpu.extra_args: expected a mapping: []"),
        ("metrics: {cpu: {unit: u, extra_args: {step: 1}}}",
         "metrics.yml: metrics.cpu.extra_args.step: unknown key (expected one of: aggregation_method)"),
        ("metrics: {cpu: {unit: u, extra_args: {aggregation_method: median}}}",
         "metrics.yml: metrics.cpu.extra_args.aggregation_method: expected one of avg, count, last, max, min, sum: 'median'"),
    ],
)
def test_wrong_types_and_unknown_keys(text, expected):
    assert error(text) == expected


def test_yaml_syntax_error_and_missing_file(tmp_path):
    assert error("metrics: {cpu: [unit: u}").startswith("metrics.yml: line 1, column ")
    with pytest.raises(InputError) as info:
        load_metrics("absent.yml")
    assert str(info.value) == "absent.yml: (file): cannot read: No such file or directory"


# ---- extra_args per collector (cloudkitty/collector/prometheus_base.py:37-60, gnocchi.py:105-133) ----


def test_file_collector_extra_args():
    m = load("metrics: {cpu: {unit: u, extra_args: {aggregation_method: last}}}").metrics[0]
    assert m.extra_args == FileExtraArgs("last")


def test_prometheus_extra_args_defaults_and_values():
    config = load(
        """
        metrics:
          a: {unit: u}
          b:
            unit: u
            extra_args: {aggregation_method: sum, query_function: ceil, range_function: rate,
                         query_prefix: "", query_suffix: "> 0"}
        """,
        collector="prometheus",
    )
    assert config.metrics[0].extra_args == PrometheusExtraArgs("max", None, None, "", "")
    assert config.metrics[1].extra_args == PrometheusExtraArgs("sum", "ceil", "rate", "", "> 0")
    assert error("metrics: {a: {unit: u, extra_args: {query_function: round2}}}", collector="prometheus") == (
        "metrics.yml: metrics.a.extra_args.query_function: expected one of "
        "abs, ceil, exp, floor, ln, log10, log2, round, sqrt: 'round2'"
    )
    assert "unknown key" in error("metrics: {a: {unit: u, extra_args: {resource_type: x}}}", collector="prometheus")


def test_gnocchi_extra_args_required_defaults_and_resource_key():
    config = load(
        """
        metrics:
          cpu: {unit: u, groupby: [host], extra_args: {resource_type: instance}}
          vol:
            unit: GiB
            groupby: [volume_id]
            extra_args: {resource_type: volume, resource_key: volume_id, aggregation_method: rate:95pct,
                         re_aggregation_method: rate:mean, force_granularity: 0,
                         use_all_resource_revisions: false, custom_query: "(aggregate RE_AGGREGATION_METHOD x)"}
        """,
        collector="gnocchi",
    )
    cpu, vol = config.metrics
    assert cpu.extra_args == GnocchiExtraArgs("instance", "id", "max", "max", 3600, True, "")
    assert cpu.groupby == ("host", "project_id", "id")  # scope key, then resource_key
    assert vol.extra_args == GnocchiExtraArgs(
        "volume", "volume_id", "rate:95pct", "rate:mean", 0, False, "(aggregate RE_AGGREGATION_METHOD x)"
    )
    assert vol.groupby == ("volume_id", "project_id")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (None, "metrics.yml: metrics.cpu.extra_args: required key is missing (the gnocchi collector needs it)"),
        ("{}", "metrics.yml: metrics.cpu.extra_args.resource_type: required key is missing"),
        ("{resource_type: ''}", "metrics.yml: metrics.cpu.extra_args.resource_type: expected a non-empty string: ''"),
        ("{resource_type: i, re_aggregation_method: 95pct}",
         "metrics.yml: metrics.cpu.extra_args.re_aggregation_method: expected one of "
         "mean, sum, last, max, min, std, median, first, count, or rate:<one of them>: '95pct'"),
        ("{resource_type: i, aggregation_method: 100pct}", "metrics.yml: metrics.cpu.extra_args.aggregation_method"),
        ("{resource_type: i, force_granularity: -1}",
         "metrics.yml: metrics.cpu.extra_args.force_granularity: expected an integer >= 0: -1"),
        ("{resource_type: i, force_granularity: true}",
         "metrics.yml: metrics.cpu.extra_args.force_granularity: expected an integer >= 0: True"),
        ("{resource_type: i, use_all_resource_revisions: 'yes'}",
         "metrics.yml: metrics.cpu.extra_args.use_all_resource_revisions: expected true or false: 'yes'"),
    ],
)
def test_bad_gnocchi_extra_args(extra, expected):
    text = "metrics: {cpu: {unit: u}}" if extra is None else f"metrics: {{cpu: {{unit: u, extra_args: {extra}}}}}"
    assert error(text, collector="gnocchi").startswith(expected)


# ---- skip_datapoints_expression ----


def test_skip_expression_is_compiled_at_load_time():
    m = load(
        """
        metrics:
          cpu:
            unit: u
            groupby: [flavor]
            metadata: [os]
            skip_datapoints_expression: "qty == 0 or groupby.flavor == 'x' or metadata.os == 'y' or groupby.month == '1'"
        """
    ).metrics[0]
    assert m.skip_datapoints_expression is not None
    assert m.skip_datapoints_expression.labels() == {
        ("groupby", "flavor"), ("metadata", "os"), ("groupby", "month")
    }


def test_bad_skip_expressions_are_configuration_errors():
    assert error("metrics: {cpu: {unit: u, skip_datapoints_expression: \"__import__('os')\"}}") == (
        "metrics.yml: metrics.cpu.skip_datapoints_expression: unknown name '__import__' at column 1 "
        "(expected qty, price, unit, type, groupby.<key>, metadata.<key>, datapoint[...], a number, a string, "
        "True, False, not or '('): \"__import__('os')\""
    )
    assert error("metrics: {cpu: {unit: u, skip_datapoints_expression: \"groupby.host == 'a'\"}}") == (
        "metrics.yml: metrics.cpu.skip_datapoints_expression: reads groupby.host, which this metric does not "
        "collect (it would always be missing): \"groupby.host == 'a'\""
    )
    assert error("metrics: {cpu: {unit: u, skip_datapoints_expression: ''}}") == (
        "metrics.yml: metrics.cpu.skip_datapoints_expression: expected a non-empty string: ''"
    )


def test_metrics_config_is_picklable_and_hashable():
    config = load(
        """
        metrics:
          cpu: {unit: u, mutate: MAP, mutate_map: {1: 2}, skip_datapoints_expression: "qty > 1"}
        """
    )
    copy = pickle.loads(pickle.dumps(config))
    assert copy == config and hash(copy) == hash(config)
    assert copy.by_rating_type("cpu") == config.metrics[0]


# ---- differential: CloudKitty's own check_configuration (needs its venv) ----

_CK_SCRIPT = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
import yaml
from oslo_config import cfg
import cloudkitty.config  # noqa
cfg.CONF([], project="cloudkitty", default_config_files=[])
from cloudkitty import utils
from cloudkitty.collector import gnocchi, prometheus_base
collector = {"prometheus": prometheus_base.PrometheusCollectorBase, "gnocchi": gnocchi.GnocchiCollector}[sys.argv[2]]
out = {}
for key, m in collector.check_configuration(yaml.safe_load(open(sys.argv[1]))).items():
    out[key] = {
        "groupby": m["groupby"], "metadata": m["metadata"], "unit": m["unit"], "mutate": m["mutate"],
        "factor": str(utils.num2decimal(m["factor"])), "offset": str(utils.num2decimal(m["offset"])),
        "alt_name": m.get("alt_name"), "extra_args": m["extra_args"],
        "mutate_map": {str(k): str(v) for k, v in (m.get("mutate_map") or {}).items()},
    }
print(json.dumps(out))
"""


@pytest.mark.cloudkitty
@pytest.mark.parametrize("collector", ["prometheus", "gnocchi"])
def test_same_result_as_cloudkittys_check_configuration(collector):
    extra = "{resource_type: instance}" if collector == "gnocchi" else "{aggregation_method: sum}"
    text = f"""
        metrics:
          cpu:
            - {{unit: instance, alt_name: instance, groupby: [id, flavor_name], metadata: [os_distro],
               factor: 1/3600, offset: 0.1, extra_args: {extra}}}
            - {{unit: gpu, alt_name: gpu, mutate: MAP, mutate_map: {{1: 0.5, 0.1: 3}}, factor: "0.001",
               extra_args: {extra}}}
          ram: {{unit: MiB, factor: 7, offset: -3, mutate: CEIL, groupby: [project_id, id], extra_args: {extra}}}
        """
    ours = load(text, collector=collector)
    result = subprocess.run(
        [str(cloudkitty_python()), "-c", _CK_SCRIPT, "metrics.yml", collector],
        capture_output=True, text=True, check=True, timeout=120,
    )
    theirs = json.loads(result.stdout)
    assert [m.key for m in ours.metrics] == list(theirs)
    for m in ours.metrics:
        ck = theirs[m.key]
        assert list(m.groupby) == ck["groupby"] and list(m.metadata) == ck["metadata"]
        assert (m.unit, m.mutate.value, m.rating_type) == (ck["unit"], ck["mutate"], ck["alt_name"] or m.key)
        assert (str(m.factor), str(m.offset)) == (ck["factor"], ck["offset"])
        assert {str(k): str(v) for k, v in (m.mutate_map or {}).items()} == {
            str(Decimal(float(k)) if "." in k else Decimal(k)): v for k, v in ck["mutate_map"].items()
        }
        assert {k: v for k, v in vars(m.extra_args).items()} == ck["extra_args"] | (
            {} if collector == "gnocchi" else {"query_function": None, "range_function": None}
        )

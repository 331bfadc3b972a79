"""Rules JSON, usage JSONL and rated JSONL (interchange.md): validations of `cloudkitty/rating/hash/db/sqlalchemy/api.py:311-405` with the path of
the offending value, exact round-trip of rules, usage parsing, and the ``ratebeam rate`` exit codes."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.interchange import (
    parse_rules,
    parse_usage,
    plain_decimal,
    read_rules,
    read_usage,
    rules_to_json,
    write_rules,
)
from ratebeam.pipelines.rate_command import run_rate
from ratebeam.transforms.rules import MappingRule, RuleSet, ThresholdRule
from ratebeam.transforms.schema import PRICE_POLARS, QTY_POLARS, TIME_POLARS

DATA = Path(__file__).parent / "data"


def refused(document: Any) -> str:
    """The one-line error for a rules document given as a Python object."""
    text = document if isinstance(document, str) else json.dumps(document)
    with pytest.raises(InputError) as info:
        parse_rules(text, "rules.json")
    return str(info.value)


def service(**extra: Any) -> dict[str, Any]:
    return {"name": "instance", **extra}


def field(name: str = "flavor", **extra: Any) -> dict[str, Any]:
    return {"name": name, **extra}


# --- rules: validations -------------------------------------------------------------------------


def test_bad_decimal_names_file_path_and_value() -> None:
    doc = {"services": [service(fields=[field("a"), field("b", mappings=[
        {"value": "x", "cost": "1"}, {"value": "y", "cost": "2"}, {"value": "z", "cost": "abc"}])])]}
    assert refused(doc) == "rules.json: services[0].fields[1].mappings[2].cost: not a decimal: 'abc'"


@pytest.mark.parametrize("cost", ["NaN", "Infinity", "1_000", " 1", "1/2", ""])
def test_only_plain_finite_decimals_are_costs(cost: str) -> None:
    assert refused({"services": [service(mappings=[{"cost": cost}])]}) == \
        f"rules.json: services[0].mappings[0].cost: not a decimal: {cost!r}"


def test_costs_and_levels_must_fit_cloudkittys_numeric_columns() -> None:
    assert "NUMERIC(40,28)" in refused({"services": [service(mappings=[{"cost": "0." + "1" * 29}])]})
    assert "NUMERIC(40,28)" in refused({"services": [service(mappings=[{"cost": "1" * 13}])]})
    assert "NUMERIC(20,8)" in refused({"services": [service(thresholds=[{"level": "0.123456789", "cost": "1"}])]})
    assert "NUMERIC(40,28)" in refused({"services": [service(mappings=[{"cost": "1e999999999"}])]})
    assert "NUMERIC(40,28)" in refused({"services": [service(mappings=[{"cost": "1e-999999999"}])]})
    ok = parse_rules(json.dumps({"services": [service(mappings=[{"cost": "0." + "1" * 27 + "10"}])]}), "r")
    assert ok.mappings[0].cost == Decimal("0." + "1" * 27 + "10")


def test_service_mapping_has_no_value_and_field_mapping_needs_one() -> None:
    assert refused({"services": [service(mappings=[{"value": "x", "cost": "1"}])]}) == \
        "rules.json: services[0].mappings[0].value: a service mapping has no value: 'x'"
    assert refused({"services": [service(fields=[field(mappings=[{"cost": "1"}])])]}) == \
        "rules.json: services[0].fields[0].mappings[0].value: a field mapping needs a non-empty value"
    assert refused({"services": [service(fields=[field(mappings=[{"value": "", "cost": "1"}])])]}) == \
        "rules.json: services[0].fields[0].mappings[0].value: a field mapping needs a non-empty value"
    assert "must be a non-empty string" in refused(
        {"services": [service(fields=[field(mappings=[{"value": 5, "cost": "1"}])])]})


def _windows(*windows: dict[str, Any]) -> dict[str, Any]:
    return {"services": [service(fields=[field(mappings=[{"value": "m1", "cost": "1", **w} for w in windows])])]}


def test_mapping_windows_cloudkittys_duplicate_check_finds_overlapping_are_refused() -> None:
    message = refused(_windows({}, {"start": "2024-06-01T00:00:00Z"}))
    assert message.startswith("rules.json: services[0].fields[0].mappings[1]: clashes with "
                              "services[0].fields[0].mappings[0]")
    assert "clashes" in refused(_windows({"start": "2024-05-31T23:00:00Z"}, {"end": "2024-06-01T00:00:00Z"}))
    assert "clashes" in refused(_windows({"tenant_id": "t", "group": "g"}, {"tenant_id": "t", "group": "g"}))


def test_cloudkittys_check_is_by_order_as_its_api_makes_it() -> None:
    """CloudKitty checks a new mapping against those stored before it, with a filter that is not
    symmetric: an open-ended mapping starting inside an earlier closed window is let in (its
    ``create_mapping``), so a rules file holding what CloudKitty stored must be taken."""
    rs = parse_rules(json.dumps(_windows({"end": "2024-06-01T00:00:00Z"}, {"start": "2024-05-31T23:00:00Z"})),
                     "rules.json")
    assert len(rs.mappings) == 2


def test_adjacent_windows_and_other_groups_or_tenants_are_accepted() -> None:
    rs = parse_rules(json.dumps(_windows(
        {"end": "2024-06-01T00:00:00Z"}, {"start": "2024-06-01T00:00:00Z"},
        {"group": "other"}, {"tenant_id": "t"})), "rules.json")
    assert len(rs.mappings) == 4


def test_end_must_not_be_before_start() -> None:
    assert refused(_windows({"start": "2024-06-01T00:00:00Z", "end": "2024-05-01T00:00:00Z"})) == \
        "rules.json: services[0].fields[0].mappings[0].end: must not be before start: '2024-05-01T00:00:00Z'"
    # CloudKitty refuses end < start only (its API's validate_resource): an empty window is stored
    assert len(parse_rules(json.dumps(_windows({"start": "2024-06-01T00:00:00Z", "end": "2024-06-01T00:00:00Z"})),
                           "rules.json").mappings) == 1


def test_one_threshold_level_per_parent_and_tenant_whatever_the_group() -> None:
    doc = {"services": [service(thresholds=[{"level": "8", "cost": "1", "group": "a", "tenant_id": "t"},
                                            {"level": "8.0", "cost": "2", "group": "b", "tenant_id": "t"}])]}
    assert refused(doc) == ("rules.json: services[0].thresholds[1].level: same level as services[0].thresholds[0] "
                            "(same parent and tenant): '8.0'")
    other_tenant = {"services": [service(thresholds=[{"level": "8", "cost": "1"},
                                                     {"level": "8", "cost": "2", "tenant_id": "t"}],
                                         fields=[field(thresholds=[{"level": "8", "cost": "3"}])])]}
    assert len(parse_rules(json.dumps(other_tenant), "rules.json").thresholds) == 3
    # global thresholds may repeat a level: CloudKitty's unique constraints never match NULL tenants
    globals_ = {"services": [service(thresholds=[{"level": "8", "cost": "1"}, {"level": "8", "cost": "2"}])]}
    assert len(parse_rules(json.dumps(globals_), "rules.json").thresholds) == 2


@pytest.mark.parametrize(("doc", "location"), [
    ({"services": [], "version": 1}, "version"),
    ({"services": [service(cost="1")]}, "services[0].cost"),
    ({"services": [service(fields=[field(value="x")])]}, "services[0].fields[0].value"),
    ({"services": [service(mappings=[{"cost": "1", "name": "m"}])]}, "services[0].mappings[0].name"),
    ({"services": [service(thresholds=[{"cost": "1", "start": None}])]}, "services[0].thresholds[0].start"),
])
def test_unknown_keys_are_refused(doc: dict[str, Any], location: str) -> None:
    assert refused(doc).startswith(f"rules.json: {location}: unknown key")


@pytest.mark.parametrize(("doc", "expected"), [
    ({"services": {}}, "rules.json: services: must be a list, not an object"),
    ({"services": [5]}, "rules.json: services[0]: must be an object, not a number"),
    ({"services": [{"name": 3}]}, "rules.json: services[0].name: must be a non-empty string: 3"),
    ({"services": [service(mappings=[{"cost": True}])]},
     "rules.json: services[0].mappings[0].cost: must be a decimal string or a number, not a boolean"),
    ({"services": [service(mappings=[{"cost": "1", "type": "percent"}])]},
     "rules.json: services[0].mappings[0].type: must be 'flat' or 'rate': 'percent'"),
    ({"services": [service(mappings=[{"cost": "1", "group": 5}])]},
     "rules.json: services[0].mappings[0].group: must be a non-empty string: 5"),
    ({"services": [service(mappings=[{"cost": "1", "start": "yesterday"}])]},
     "rules.json: services[0].mappings[0].start: not an ISO-8601 datetime: 'yesterday'"),
    ({"services": [service(mappings=[{"type": "flat"}])]}, "rules.json: services[0].mappings[0].cost: missing"),
    ({"services": [service(), service()]}, "rules.json: services[1].name: duplicate service: 'instance'"),
    ({"services": [service(fields=[field(), field()])]},
     "rules.json: services[0].fields[1].name: duplicate field of this service: 'flavor'"),
    ({"groups": ["a", "a"]}, "rules.json: groups[1]: duplicate group: 'a'"),
    ([], "rules.json: must be an object, not a list"),
])
def test_wrong_types_and_duplicates(doc: Any, expected: str) -> None:
    assert refused(doc) == expected


def test_malformed_json_is_one_clear_line() -> None:
    assert refused('{"services": [}') == "rules.json: line 1 column 15: invalid JSON: Expecting value"
    assert refused('{"services": [], "services": []}') == "rules.json: invalid JSON: duplicate key 'services'"
    assert refused('{"services": [{"name": "s", "mappings": [{"cost": NaN}]}]}') == \
        "rules.json: line 1 column 51: services[0].mappings[0].cost: invalid JSON: NaN is not allowed"


def test_defaults_of_the_format() -> None:
    rs = parse_rules(json.dumps({"groups": ["declared"], "services": [service(
        mappings=[{"cost": 0.1, "group": "used"}], thresholds=[{"cost": "1"}])]}), "rules.json")
    [mapping] = rs.mappings
    assert (mapping.type, mapping.cost, mapping.start, mapping.end) == ("flat", Decimal("0.1"), None, None)
    assert (rs.thresholds[0].type, rs.thresholds[0].level) == ("flat", Decimal(0))
    assert rs.groups == ("declared", "used")


def test_naive_times_are_utc_and_offsets_are_converted() -> None:
    rs = parse_rules(json.dumps(_windows({"start": "2024-06-01T00:00:00", "end": "2024-06-01T05:00:00+02:00"})), "r")
    assert rs.mappings[0].start == datetime(2024, 6, 1, tzinfo=UTC)
    assert rs.mappings[0].end == datetime(2024, 6, 1, 3, tzinfo=UTC)


# --- rules: round trip ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rules_basic.json", "rules_groups.json"])
def test_examples_round_trip_exactly(name: str) -> None:
    rs = read_rules(DATA / name)
    out = io.StringIO()
    write_rules(rs, out)
    again = parse_rules(out.getvalue(), "exported.json")
    assert again == rs
    second = io.StringIO()
    write_rules(again, second)
    assert second.getvalue() == out.getvalue()


def test_round_trip_keeps_decimal_text_tenants_windows_and_order() -> None:
    """Rules are nested per service in the file, so a rule set in that order comes back identical."""
    rs = RuleSet(
        services=("b", "a"),
        fields=(("b", "y"), ("a", "z"), ("a", "x")),
        mappings=(MappingRule("b", None, None, "flat", Decimal("0.0000000000000000000000000001"), None, None,
                              datetime(2024, 2, 29, 12, 30, 1, 5, tzinfo=UTC), None),
                  MappingRule("a", "z", "w", "flat", Decimal("2"), None, None, None, None),
                  MappingRule("a", "x", "v", "rate", Decimal("1.50"), "g", "t", None,
                              datetime(2030, 1, 1, tzinfo=UTC))),
        thresholds=(ThresholdRule("b", None, Decimal("-0.5"), "rate", Decimal("3"), "h", None),
                    ThresholdRule("a", "z", Decimal("8.00000000"), "flat", Decimal("-2"), None, "t")),
        groups=("g", "h", "unused"),
    )
    again = parse_rules(json.dumps(rules_to_json(rs)), "r")
    assert again == rs
    assert str(again.mappings[2].cost) == "1.50" and str(again.thresholds[1].level) == "8.00000000"


def test_export_refuses_rules_of_undeclared_services() -> None:
    with pytest.raises(ValueError, match="undeclared"):
        rules_to_json(RuleSet(services=("a",), mappings=(MappingRule("b", None, None, "flat", Decimal(1)),)))


# --- usage ---------------------------------------------------------------------------------------

POINTS = [
    {"type": "vm", "qty": "2", "begin": "2024-01-01T00:00:00Z", "end": "2024-01-01T01:00:00Z",
     "groupby": {"project_id": "p1", "flavor": "m1"}, "metadata": {"vcpus": 8, "ratio": 1.50, "gpu": True}},
    {"type": "vm", "qty": 0.1, "unit": "", "price": "1.5", "scope": None, "begin": "2024-01-01T00:00:00",
     "end": "2024-01-01T01:00:00Z", "groupby": {"project_id": "p2"}, "metadata": {"os": "linux"}},
    {"type": "vol", "qty": 3, "scope": "explicit", "begin": "2024-01-01T00:00:00Z", "end": "2024-01-01T01:00:00Z"},
]


@pytest.mark.parametrize("text", [
    "\n".join(json.dumps(p) for p in POINTS) + "\n",
    json.dumps(POINTS),
    json.dumps({"points": POINTS}, indent=2),
])
def test_usage_forms_read_to_the_same_frame(text: str) -> None:
    frame = parse_usage(text, "usage.jsonl")
    assert frame.columns == ["scope_id", "type", "begin", "end", "qty", "price", "unit", "groupby.project_id",
                             "groupby.flavor", "metadata.vcpus", "metadata.ratio", "metadata.gpu", "metadata.os",
                             "decimal:metadata.gpu", "i"]
    assert frame.schema["qty"] == QTY_POLARS and frame.schema["price"] == PRICE_POLARS
    assert frame.schema["begin"] == TIME_POLARS
    assert frame["scope_id"].to_list() == ["p1", "p2", "explicit"]  # default (absent or null), explicit
    assert frame["qty"].to_list() == [Decimal(2), Decimal("0.1"), Decimal(3)]
    assert frame["price"].to_list() == [Decimal(0), Decimal("1.5"), Decimal(0)]
    assert frame["unit"].to_list() == ["undefined", "undefined", "undefined"]
    assert frame.row(0, named=True)["metadata.vcpus"] == "8"
    assert (frame["metadata.ratio"][0], frame["metadata.gpu"][0]) == ("1.5", "True")
    assert frame["decimal:metadata.gpu"].to_list() == ["1", None, None]  # Decimal(True) is 1
    assert frame["groupby.flavor"].to_list() == ["m1", None, None]
    assert frame["begin"][1] == datetime(2024, 1, 1, tzinfo=UTC)
    assert frame["i"].to_list() == [0, 1, 2]


def test_a_single_pretty_printed_point_is_accepted() -> None:
    frame = parse_usage(json.dumps(POINTS[2], indent=2), "u")
    assert frame["scope_id"].to_list() == ["explicit"] and frame["qty"].to_list() == [Decimal(3)]


def test_qty_is_rounded_half_even_at_18_decimals() -> None:
    frame = parse_usage(json.dumps([{"type": "t", "qty": "0.0000000000000000025", "begin": "2024-01-01T00:00:00Z",
                                     "end": "2024-01-01T01:00:00Z"}]), "u")
    assert frame["qty"][0] == Decimal("0.000000000000000002")


def test_empty_usage_is_an_empty_frame() -> None:
    frame = parse_usage("\n\n", "u")
    assert frame.height == 0 and frame.schema["qty"] == QTY_POLARS


@pytest.mark.parametrize(("text", "expected"), [
    ('{"type": "t", "begin": "2024-01-01T00:00:00Z", "end": "2024-01-01T01:00:00Z"}',
     "usage.jsonl: line 1.qty: missing"),
    ('\n{"type": "t", "qty": "x", "begin": "2024-01-01T00:00:00Z", "end": "2024-01-01T01:00:00Z"}',
     "usage.jsonl: line 2.qty: not a decimal: 'x'"),
    ('{"type": "t", "qty": 1, "begin": "2024-01-01T00:00:00Z", "end": "2024-01-01T01:00:00Z", "tags": {}}',
     "usage.jsonl: line 1.tags: unknown key (expected one of begin, end, groupby, metadata, price, qty, scope, "
     "type, unit)"),
    ('{"type": "t", "qty": 1, "begin": "2024-01-01T00:00:00Z", "end": "2024-01-01T01:00:00Z"}\n{"type": ',
     "usage.jsonl: line 2 column 10: invalid JSON: Expecting value"),
    ('[{"type": "t", "qty": 1, "begin": "soon", "end": "2024-01-01T01:00:00Z"}]',
     "usage.jsonl: [0].begin: not an ISO-8601 datetime: 'soon'"),
    ('{"points": [{"type": "t", "qty": 1, "begin": "2024-01-01T00:00:00Z", "end": "2024-01-01T01:00:00Z", '
     '"groupby": []}]}', "usage.jsonl: points[0].groupby: must be an object, not a list"),
    ('{"type": "t", "qty": "1e30", "begin": "2024-01-01T00:00:00Z", "end": "2024-01-01T01:00:00Z"}',
     "usage.jsonl: line 1.qty: does not fit decimal(38, 18): '1e30'"),
    ('{"type": "t", "qty": "1e999999999", "begin": "2024-01-01T00:00:00Z", "end": "2024-01-01T01:00:00Z"}',
     "usage.jsonl: line 1.qty: does not fit decimal(38, 18): '1e999999999'"),
])
def test_usage_errors_name_the_point_and_key(text: str, expected: str) -> None:
    with pytest.raises(InputError) as info:
        parse_usage(text, "usage.jsonl")
    assert str(info.value) == expected


# --- rated output and the command ---------------------------------------------------------------


@pytest.mark.parametrize(("value", "text"), [
    (Decimal("10.20"), "10.2"), (Decimal("100"), "100"), (Decimal("1E+2"), "100"), (Decimal("0E-20"), "0"),
    (Decimal("0.00000010"), "0.0000001"), (Decimal("-3.50"), "-3.5"),
])
def test_plain_decimal_text(value: Decimal, text: str) -> None:
    assert plain_decimal(value) == text


def test_rate_command_reports_bad_input_on_one_line_and_exits_2(tmp_path: Path) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"services": [{"name": "s", "mappings": [{"cost": "abc"}]}]}))
    out, err = io.StringIO(), io.StringIO()
    assert run_rate(rules, DATA / "usage_basic.jsonl", out, err) == 2
    assert err.getvalue() == f"ratebeam rate: {rules}: services[0].mappings[0].cost: not a decimal: 'abc'\n"
    assert out.getvalue() == ""
    err = io.StringIO()
    assert run_rate(tmp_path / "missing.json", DATA / "usage_basic.jsonl", out, err) == 2
    assert err.getvalue().count("\n") == 1 and "missing.json: cannot read" in err.getvalue()


def test_rate_command_keeps_input_order_and_prices_exactly(tmp_path: Path) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"services": [{"name": "s", "mappings": [{"cost": "0.3333333333333333333333333333"}]}]}))
    usage = tmp_path / "usage.jsonl"
    begins = ["2024-01-01T02:00:00Z", "2024-01-01T00:00:00Z", "2024-01-01T01:00:00Z"]
    usage.write_text("".join(json.dumps({"type": "s", "qty": "3", "scope": f"p{n}", "begin": b,
                                         "end": "2024-01-01T03:00:00Z"}) + "\n" for n, b in enumerate(begins)))
    out = io.StringIO()
    assert run_rate(rules, usage, out) == 0
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["i"] for line in lines[:-1]] == [0, 1, 2]
    assert [line["begin"] for line in lines[:-1]] == [datetime.fromisoformat(b).isoformat() for b in begins]
    # exact 0.9999999999999999999999999999 has 28 decimals: rounded half-even at 20 it is 1
    assert [line["price"] for line in lines[:-1]] == ["1", "1", "1"]
    assert lines[-1]["summary"] == {"count": 3, "frames": 3, "errors": 0, "total": "3"}


def test_read_usage_from_a_file_matches_parse() -> None:
    frame = read_usage(DATA / "usage_basic.jsonl")
    assert frame.equals(parse_usage((DATA / "usage_basic.jsonl").read_text(), "x"))
    assert frame.filter(pl.col("scope_id") == "t-special").height == 1


# --- validated by pydantic models through pipelines.validation ----------------------------------


def test_a_missing_name_is_missing_and_the_scope_default_is_checked_too() -> None:
    assert refused({"services": [{"mappings": []}]}) == "rules.json: services[0].name: missing"
    assert refused({"services": [service(fields=[{}])]}) == "rules.json: services[0].fields[0].name: missing"
    with pytest.raises(InputError) as info:
        parse_usage('{"type": "t", "qty": 1, "begin": "2024-01-01T00:00:00Z", "end": "2024-01-01T01:00:00Z", '
                    '"groupby": {"project_id": ""}}', "usage.jsonl")
    assert str(info.value) == "usage.jsonl: line 1.scope: must be a non-empty string: ''"


def test_json_floats_of_usage_are_read_as_written_and_big_json_numbers_of_rules_exactly() -> None:
    frame = parse_usage('{"type": "t", "qty": 0.3, "price": 1e-3, "begin": "2024-01-01T00:00:00Z", '
                        '"end": "2024-01-01T01:00:00Z", "unit": null}', "u")
    assert (frame["qty"][0], frame["price"][0], frame["unit"][0]) == (Decimal("0.3"), Decimal("0.001"), "undefined")
    rs = parse_rules('{"services": [{"name": "s", "mappings": [{"cost": 0.1000000000000000000000000001}]}]}', "r")
    assert str(rs.mappings[0].cost) == "0.1000000000000000000000000001"  # parse_float=Decimal: no float on the way


def test_usage_errors_of_later_lines_name_their_line() -> None:
    good = '{"type": "t", "qty": 1, "begin": "2024-01-01T00:00:00Z", "end": "2024-01-01T01:00:00Z"}'
    with pytest.raises(InputError) as info:
        parse_usage(f"{good}\n\n{good}\n" + good.replace('"qty": 1', '"qty": true'), "usage.jsonl")
    assert str(info.value) == "usage.jsonl: line 4.qty: must be a decimal string or a number, not a boolean"


@pytest.mark.parametrize(("text", "expected"), [
    ('{"a": "' + "9" * 5000 + '", "b": [1, ' + "8" * 4301 + "]}", (1, 5020, "b[1]")),
    ('{"a": 1.' + "9" * 5000 + ', "b": 1e' + "7" * 10 + ',\n "c": {"d": -' + "6" * 4400 + "}}", (2, 13, "c.d")),
    ("9" * 4301, (1, 1, "")),
    ('{"a": 1}', None),
    ('{"a": ' + "9" * 5000, None),  # not JSON for another reason: its reader says that
])
def test_the_first_integer_over_the_digit_limit_is_found_by_line_column_and_key(text, expected):
    """Digits in a string, a fraction or an exponent are no integer."""
    from ratebeam.transforms.long_integers import find_long_integer

    assert find_long_integer(text) == expected

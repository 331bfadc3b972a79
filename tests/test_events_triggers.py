"""Trigger definitions (seed 002, *Event Triggers*): the file, the criteria and the closed grammar."""

from __future__ import annotations

import pickle
from datetime import timedelta

import pytest
from events_support import at, default_triggers_data, event

from ratebeam.transforms.events.conditions import MAX_LENGTH, ConditionError, literal, parse, parse_time
from ratebeam.transforms.events.triggers import TriggerDefinitionError, TriggerSet


def triggers(data, **kw) -> TriggerSet:
    return TriggerSet.from_yaml_data(data, "triggers.yaml", **kw)


def one(**over):
    base = {"name": "t", "distinguished_by": "instance_id", "match_criteria": [{"event_type": "compute.*"}],
            "fire_criteria": [{"event_type": "compute.instance.delete.end"}], "fire_pipeline": "lifecycle"}
    return triggers([base | over]).triggers[0]


# ---- the grammar ----

def cond(text, value, first="10:00", last="12:00"):
    return parse(text)(value, at(first), at(last))


@pytest.mark.parametrize(("text", "value", "expected"), [
    ("> 10", 11, True), ("> 10", 10, False), (">= 10", 10, True), ("< 1", 0.5, True), ("<= -2.5", -2.5, True),
    ("== 2", 2, True), ("= 2", 2.0, True), ("!= 2", 3, True), ("!= 2", 2, False),
    ("> 0.1", 0.1, False), ("== 0.1", 0.1, True),              # floats compare as the decimal they print as
    ("> 10", "11", False), ("!= 2", "x", False),               # text against a number: false, != too
    ("== 'a b'", "a b", True), ('> "b"', "c", True), ("== 'x'", 1, False),
    ("is NULL", None, True), ("is null", "x", False), ("IS NOT NULL", "x", True), ("is not NULL", None, False),
    ("> 10", None, False), ("!= 10", None, False),             # an absent trait only meets `is NULL`
    ("> '2026-03-02T11:00:00Z'", at("11:30"), True), ("< '2026-03-02T11:00:00+01:00'", at("10:30"), False),
    ("> 'not a date'", at("11:30"), False),
])
def test_comparisons(text, value, expected):
    assert cond(text, value) is expected


@pytest.mark.parametrize(("text", "value", "expected"), [
    ("last+2h", "14:00", True), ("last+2h", "14:00:01", False),
    ("first@00:00 to last+2h", "00:00", True), ("first@00:00 to last+2h", "13:59", True),
    ("first@00:00 to last+2h", "14:00", False),                # ranges are [begin, end)
    ("first@06:30 to first@06:30+1d", "06:29", False), ("first@06:30 to first@06:30+1d", "06:30", True),
    ("> last-1h30m", "10:31", True), ("> last-1h30m", "10:30", False),
    ("<= first + 90s", "10:01:30", True), ("<= first+1w", "2026-03-09T10:00:00", True),
    ("last - 1d to last", "2026-03-01T12:00:00", True),
])
def test_time_expressions_and_ranges(text, value, expected):
    assert cond(text, at(value)) is expected


def test_time_expression_on_a_non_datetime_is_false():
    assert cond("last+2h", 5) is False and cond("first to last", "x") is False


def test_parse_time_for_expiration():
    expr = parse_time("first@00:00+4h")
    assert expr.at(at("10:20"), at("12:00")) == at("04:00")
    assert parse_time("last+2h").at(at("10:20"), at("12:00")) == at("14:00")


@pytest.mark.parametrize("value", ["active", "island", "lastly", "m1.small"])
def test_plain_text_is_an_equality(value):
    condition = literal(value)
    assert condition.op == "==" and condition(value, at("10:00"), at("10:00"))
    assert not condition(value + "x", at("10:00"), at("10:00"))


def test_text_that_starts_like_an_expression_must_be_quoted():
    with pytest.raises(ConditionError, match=r"found 'class' at column 7 \(a text that starts like an expression is "
                       r"written == 'text'\)"):
        literal("first-class")
    assert literal("== 'first-class'")("first-class", at("10:00"), at("10:00"))


def test_yaml_numbers_are_exact_equalities():
    assert literal(2)(2, at("10:00"), at("10:00")) and literal(2)(2.0, at("10:00"), at("10:00"))
    assert not literal(0.3)(0.1 + 0.2, at("10:00"), at("10:00"))


@pytest.mark.parametrize(("text", "reason"), [
    ("> x", "expected a number, a quoted text or a time (first, last), found 'x' at column 3"),
    ("is", "expected NULL, found the end"),
    ("is not nul", "expected NULL, found 'nul' at column 8"),
    (">", "found the end"),
    ("> 10 20", "expected the end, found '20' at column 6"),
    ("last+", "expected a duration (90s, 30m, 2h, 1d, 1w), found the end"),
    ("last+2x", "unexpected '2' at column 6"), ("last +2 hours", "found '2' at column 7"),
    ("first@25:00", "not a time of day: '25:00'"),
    ("first@", "expected a time of day HH:MM after @"),
    ("first to", "expected a number, a quoted text or a time (first, last), found the end"),
    ("last+99999d", "duration longer than 3660 days"),
    ("== 'unterminated", "unexpected \"'\" at column 4"),
    ("== __import__('os')", "unexpected '_' at column 4"),
    ("> 1; drop table", "unexpected ';' at column 4"),
    ("== ١٢", "unexpected '١' at column 4"),                       # only ASCII digits are numbers
    ("> 1e308", "unexpected '1' at column 3"),
    ("> -x", "expected a number, found 'x' at column 4"),
    ("is NULL or 1", "expected the end, found 'or' at column 9"),
])
def test_hostile_or_wrong_expressions_are_refused(text, reason):
    with pytest.raises(ConditionError) as exc:
        parse(text)
    assert reason in exc.value.reason


def test_too_long_expression_is_refused_before_tokenizing():
    with pytest.raises(ConditionError, match=f"longer than {MAX_LENGTH}"):
        parse("> " + "9" * 100_000)


@pytest.mark.parametrize("value", [True, None, [1], {"a": 1}, float("nan"), float("inf")])
def test_values_of_no_usable_kind_are_refused(value):
    with pytest.raises(ConditionError):
        literal(value)


# ---- the file ----

def test_default_triggers_file():
    ts = triggers(default_triggers_data(), pipelines={"instance", "volume", "floatingip"})
    lifecycle = ts.by_name("instance_lifecycle")
    assert lifecycle.distinguished_by == ("instance_id",) and lifecycle.fire_delay == timedelta(minutes=5)
    assert lifecycle.expiration is None and lifecycle.expire_pipeline is None
    create = event("compute.instance.create.end", "10:20", instance_id="i-1")
    assert [(t.name, key) for t, key in ts.matches(create)] == [("instance_lifecycle", ("i-1",))]
    assert ts.matches(event("compute.instance.update", "10:21", instance_id="i-1")) == []
    assert ts.matches(event("compute.instance.create.end", "10:21")) == []           # no distinguishing trait
    volume = event("volume.delete.end", "11:00", volume_id="v-1")
    assert [(t.name, key) for t, key in ts.matches(volume)] == [("volume_lifecycle", ("v-1",))]
    assert pickle.loads(pickle.dumps(ts)) == ts


def test_criteria_traits_timestamp_and_several_distinguishing_traits():
    t = one(distinguished_by=["instance_id", "tenant_id"],
            match_criteria=[{"event_type": ["compute.*", "!compute.instance.update"],
                             "traits": {"memory_mb": "> 256", "state": "active", "deleted_at": "is NULL"}},
                            {"event_type": "compute.instance.exists", "timestamp": "first@00:00 to first@12:00"}])
    ok = event("compute.instance.create.end", "10:00", instance_id="i", tenant_id="t", memory_mb=512, state="active")
    assert [key for _, key in TriggerSet((t,)).matches(ok)] == [("i", "t")]
    for bad in ({"memory_mb": 128}, {"state": "error"}, {"deleted_at": at("10:00")}):
        e = event("compute.instance.create.end", "10:00", **({"instance_id": "i", "tenant_id": "t", "memory_mb": 512,
                                                             "state": "active"} | bad))
        assert TriggerSet((t,)).matches(e) == [], bad
    assert TriggerSet((t,)).matches(event("compute.instance.update", "10:00", instance_id="i", tenant_id="t",
                                          memory_mb=512, state="active")) == []
    exists = event("compute.instance.exists", "11:59", instance_id="i", tenant_id="t")
    assert t.collects(exists, at("00:30"), at("11:00"))
    assert not t.collects(event("compute.instance.exists", "12:00", instance_id="i", tenant_id="t"),
                          at("00:30"), at("11:00"))


def test_fire_criteria_with_number():
    t = one(fire_criteria=[{"event_type": "compute.instance.exists", "number": 2},
                           {"event_type": "compute.instance.delete.end"}])
    evs = [event("compute.instance.exists", "10:00", instance_id="i"),
           event("compute.instance.delete.end", "11:00", instance_id="i")]
    assert not t.fire_criteria_met(evs)
    assert t.fire_criteria_met([*evs, event("compute.instance.exists", "12:00", instance_id="i")])


def test_load_criteria():
    t = one(load_criteria=[{"event_type": "compute.instance.exists", "timestamp": "first-1d to first"}])
    old = event("compute.instance.exists", "2026-03-01T12:00:00", instance_id="i")
    assert t.loads(old, at("10:00"), at("12:00"))
    assert not t.loads(event("compute.instance.exists", "2026-03-01T09:00:00", instance_id="i"), at("10:00"), at("12:00"))
    assert not t.loads(event("compute.instance.exists", "2026-03-01T12:00:00"), at("10:00"), at("12:00"))
    assert not one().loads(old, at("10:00"), at("12:00"))                        # none: nothing to load


@pytest.mark.parametrize(("fire_delay", "seconds"), [(0, 0), (300, 300), ("5m", 300), ("1h30m", 5400), ("90", 90)])
def test_fire_delay(fire_delay, seconds):
    assert one(fire_delay=fire_delay).fire_delay == timedelta(seconds=seconds)


@pytest.mark.parametrize(("over", "message"), [
    ({"name": ""}, "triggers.yaml: [0].name: expected a non-empty string: ''"),
    ({"distinguished_by": []}, "triggers.yaml: [0].distinguished_by: expected a string or a non-empty list"),
    ({"match_criteria": []}, "triggers.yaml: [0].match_criteria: expected a criterion or a non-empty list of "
     "criteria: []"),
    ({"match_criteria": [{"event_type": "a", "number": 2}]}, "triggers.yaml: [0].match_criteria[0].number: "
     "unknown key (expected one of: event_type, timestamp, traits)"),
    ({"fire_criteria": [{"number": 0}]}, "triggers.yaml: [0].fire_criteria[0].number: expected an integer >= 1: 0"),
    ({"fire_criteria": [{"number": True}]}, "triggers.yaml: [0].fire_criteria[0].number: expected an integer >= 1"),
    ({"match_criteria": [{"traits": {"size": "> ten"}}]},
     "triggers.yaml: [0].match_criteria[0].traits.size: expected a number, a quoted text or a time (first, last), "
     "found 'ten' at column 3: '> ten'"),
    ({"match_criteria": [{"traits": {"size": None}}]}, "triggers.yaml: [0].match_criteria[0].traits.size: expected "
     "text, a number or an expression"),
    ({"match_criteria": [{"traits": ["size"]}]}, "triggers.yaml: [0].match_criteria[0].traits: expected a mapping"),
    ({"match_criteria": [{"timestamp": "yesterday"}]}, "triggers.yaml: [0].match_criteria[0].timestamp: expected "
     "a number, a quoted text or a time (first, last), found 'yesterday' at column 1: 'yesterday'"),
    ({"expiration": "last+2 hours"}, "triggers.yaml: [0].expiration: expected a duration (90s, 30m, 2h, 1d, 1w), found '2' at column 6: 'last+2 hours'"),
    ({"expiration": "> last"}, "triggers.yaml: [0].expiration: expected a number, a quoted text or a time"),
    ({"expiration": 3600}, "triggers.yaml: [0].expiration: expected a non-empty string: 3600"),
    ({"fire_delay": -1}, "triggers.yaml: [0].fire_delay: expected seconds >= 0: -1"),
    ({"fire_delay": "soon"}, "triggers.yaml: [0].fire_delay: expected a duration (90s, 30m, 2h, 1d, 1w), found "
     "'soon' at column 1: 'soon'"),
    ({"fire_delay": 1.5}, "triggers.yaml: [0].fire_delay: expected seconds or a duration"),
    ({"fire_pipeline": "billing"}, "triggers.yaml: [0].fire_pipeline: unknown pipeline (expected one of: lifecycle): "
     "'billing'"),
    ({"expire_pipeline": "x"}, "triggers.yaml: [0].expire_pipeline: unknown pipeline (expected one of: lifecycle)"),
    ({"fire_when": "now"}, "triggers.yaml: [0].fire_when: unknown key (expected one of: distinguished_by, "),
])
def test_bad_trigger_files_are_refused_naming_file_key_and_value(over, message):
    base = {"name": "t", "distinguished_by": "instance_id", "match_criteria": [{"event_type": "compute.*"}],
            "fire_criteria": [{"event_type": "compute.instance.delete.end"}], "fire_pipeline": "lifecycle"}
    with pytest.raises(TriggerDefinitionError) as exc:
        triggers([base | over], pipelines={"lifecycle"})
    assert str(exc.value).startswith(message), str(exc.value)


def test_structure_errors():
    with pytest.raises(TriggerDefinitionError, match=r"^triggers.yaml: \(top level\): expected a list"):
        triggers({"name": "t"})
    with pytest.raises(TriggerDefinitionError, match=r"^triggers.yaml: \[0\].fire_pipeline: required key is missing"):
        triggers([{"name": "t", "distinguished_by": "a", "match_criteria": {}, "fire_criteria": {}}])
    t = {"name": "t", "distinguished_by": "a", "match_criteria": {}, "fire_criteria": {}, "fire_pipeline": "p"}
    with pytest.raises(TriggerDefinitionError, match=r"^triggers.yaml: \[1\].name: a second trigger of that name: 't'"):
        triggers([t, t])

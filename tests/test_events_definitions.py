"""Event definitions in Ceilometer's format (seed 002, *Definitions file format*): conversion and refusals."""

from __future__ import annotations

import pickle
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from events_support import at, cinder, default_definitions_data, neutron, nova
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonpath_ng.ext import parse as parse_path

from ratebeam.transforms.events.definitions import (
    EventConversionError,
    EventDefinitionError,
    EventDefinitions,
    _first_plain,
    _get,
    _plain_keys,
)
from ratebeam.transforms.events.model import Notification


def defs(data, **kw) -> EventDefinitions:
    return EventDefinitions.from_yaml_data(data, "defs.yaml", **kw)


def note(event_type="compute.instance.create.end", payload=None, ctxt=None, publisher="compute.host-1"):
    return Notification("m-1", event_type, publisher, at("10:00"), "INFO", payload or {}, ctxt or {})


# ---- conversion ----

def test_seed_create_end_with_the_default_file():
    event = defs(default_definitions_data()).convert(nova("compute.instance.create.end", "10:20"))
    assert event is not None
    assert event.message_id == "compute.instance.create.end-i-1-10:20"
    assert event.generated == at("10:20")
    t = event.traits
    assert t["instance_id"] == "i-1" and t["tenant_id"] == "t-1" and t["flavor_name"] == "m1.small"
    assert t["host"] == "compute-1-5-6-7"                      # split plugin, segment 1, max_split 1
    assert t["service"] == "compute.compute-1-5-6-7"            # default trait: the publisher
    assert t["request_id"] == "req-1"                           # default trait: the context
    assert t["memory_mb"] == 512 and isinstance(t["memory_mb"], int)
    assert t["launched_at"] == datetime(2026, 3, 2, 10, 20, tzinfo=UTC)
    assert "deleted_at" not in t                                # '' is null for a datetime
    assert "audit_period_beginning" not in t                    # only the exists definition reads it


def test_definitions_scanned_last_to_first():
    exists = nova("compute.instance.exists", "12:00", audit_period_beginning="2026-03-02 11:00:00",
                  audit_period_ending="2026-03-02 12:00:00")
    event = defs(default_definitions_data()).convert(exists)
    assert event.traits["audit_period_beginning"] == at("11:00")
    assert event.traits["flavor_name"] == "m1.small"          # merged from the general definition
    data = [{"event_type": "a.*", "traits": {"x": {"fields": "payload.a"}}},
            {"event_type": "a.b", "traits": {"x": {"fields": "payload.b"}}}]
    assert defs(data).convert(note("a.b", {"a": 1, "b": 2})).traits["x"] == "2"
    assert defs(data).convert(note("a.c", {"a": 1, "b": 2})).traits["x"] == "1"
    assert defs(list(reversed(data))).convert(note("a.b", {"a": 1, "b": 2})).traits["x"] == "1"


@pytest.mark.parametrize(("patterns", "taken", "left"), [
    (["*.start", "*.end", "!scheduler.*"], ["compute.instance.create.start", "image.delete.end"],
     ["compute.instance.exists", "scheduler.run_instance.start"]),
    ("!image.*", ["compute.instance.exists"], ["image.upload"]),
    (["image.create", "image.delete"], ["image.create"], ["image.create.end", "Image.create"]),
])
def test_event_type_globs_and_exclusions(patterns, taken, left):
    d = defs([{"event_type": patterns, "traits": {"mark": {"fields": "payload.m"}}}])
    for event_type in taken:
        assert d.convert(note(event_type, {"m": "yes"})).traits.get("mark") == "yes", event_type
    for event_type in left:
        assert "mark" not in d.convert(note(event_type, {"m": "yes"})).traits, event_type


def test_no_definition_default_traits_or_dropped():
    n = note("image.upload", {"tenant_id": "t-9", "other": 1}, {"request_id": "r-2"}, "image.host")
    event = defs([]).convert(n)
    assert dict(event.traits) == {"service": "image.host", "tenant_id": "t-9", "request_id": "r-2"}
    assert defs([], allow_dropping=True).convert(n) is None
    assert defs(None).convert(n).traits["tenant_id"] == "t-9"   # an empty file: no definition


def test_tenant_from_context_when_the_payload_has_none():
    event = defs(default_definitions_data()).convert(neutron("floatingip.delete.end", "11:00"))
    assert event.traits["tenant_id"] == "t-1" and event.traits["floatingip_id"] == "f-1"
    created = defs(default_definitions_data()).convert(neutron("floatingip.create.end", "10:00"))
    assert created.traits["floating_ip_address"] == "172.24.4.3" and "port_id" not in created.traits


def test_cinder_volume_traits():
    event = defs(default_definitions_data()).convert(cinder("volume.resize.end", "11:00", size=20))
    assert event.traits["size"] == 20 and event.traits["volume_type"] == "ssd"
    assert event.traits["created_at"] == at("10:00")


def test_multiple_fields_first_non_null_wins():
    d = defs([{"event_type": "*", "traits": {"f": {"fields": ["payload.a", "payload.b", "payload.c"]}}}])
    assert d.convert(note(payload={"a": None, "b": "B", "c": "C"})).traits["f"] == "B"
    assert d.convert(note(payload={"a": "A", "b": "B"})).traits["f"] == "A"
    assert d.convert(note(payload={"c": "C"})).traits["f"] == "C"
    assert "f" not in d.convert(note(payload={"a": None})).traits


def test_empty_string_is_null_except_for_text():
    traits = {k: {"type": k, "fields": "payload.v"} for k in ("int", "float", "datetime")}
    traits["text"] = {"fields": "payload.v"}
    event = defs([{"event_type": "*", "traits": traits}]).convert(note(payload={"v": ""}))
    assert event.traits["text"] == "" and not {"int", "float", "datetime"} & set(event.traits)


@pytest.mark.parametrize(("kind", "raw", "expected"), [
    ("int", "12", 12), ("int", 7, 7), ("int", 2.0, 2), ("float", "1.5", 1.5), ("float", 3, 3.0),
    ("text", 5, "5"), ("text", {"b": 1, "a": [2]}, '{"a": [2], "b": 1}'),
    ("datetime", "2026-03-02 10:20:00.5", datetime(2026, 3, 2, 10, 20, 0, 500000, tzinfo=UTC)),
    ("datetime", "2026-03-02T12:20:00+02:00", datetime(2026, 3, 2, 10, 20, tzinfo=UTC)),
    ("datetime", "2026-03-02T10:20:00Z", datetime(2026, 3, 2, 10, 20, tzinfo=UTC)),
])
def test_trait_types(kind, raw, expected):
    event = defs([{"event_type": "*", "traits": {"v": {"type": kind, "fields": "payload.v"}}}]).convert(
        note(payload={"v": raw}))
    assert event.traits["v"] == expected and type(event.traits["v"]) is type(expected)


@pytest.mark.parametrize(("kind", "raw"), [("int", "abc"), ("int", 2.5), ("float", "x"), ("datetime", "yesterday"),
                                           ("datetime", 12), ("int", [1])])
def test_a_value_that_is_not_of_its_type_is_a_conversion_error(kind, raw):
    d = defs([{"event_type": "*", "traits": {"v": {"type": kind, "fields": "payload.v"}}}])
    with pytest.raises(EventConversionError) as exc:
        d.convert(note(payload={"v": raw}))
    assert "trait v" in str(exc.value) and "m-1" in str(exc.value) and repr(raw) in str(exc.value)


def test_default_traits_can_be_redefined_and_simple_string_form():
    d = defs([{"event_type": "*", "traits": {"service": "payload.svc", "tenant_id": {"fields": "payload.owner"}}}])
    event = d.convert(note(payload={"svc": "nova", "owner": "o-1", "tenant_id": "t-1"}))
    assert event.traits["service"] == "nova" and event.traits["tenant_id"] == "o-1"


def test_jsonpath_quoted_keys_brackets_filters_and_envelope_fields():
    d = defs([{"event_type": "*", "traits": {
        "arch": "payload.image_meta.'org.openstack__1__architecture'",
        "host": "payload[host]",
        "image": "payload.glance_metadata[?key='image_id'].value",
        "priority": "priority", "mid": "metadata.message_id",
    }}])
    event = d.convert(note(payload={"image_meta": {"org.openstack__1__architecture": "x86_64"}, "host": "h",
                                    "glance_metadata": [{"key": "other", "value": "o"},
                                                        {"key": "image_id", "value": "img-1"}]}))
    assert event.traits["arch"] == "x86_64" and event.traits["host"] == "h" and event.traits["image"] == "img-1"
    assert event.traits["priority"] == "INFO" and event.traits["mid"] == "m-1"


def test_split_plugin():
    def trait(params):
        return {"fields": "publisher_id", "plugin": {"name": "split", "parameters": params}}
    d = defs([{"event_type": "*", "traits": {
        "first": {"fields": "publisher_id", "plugin": "split"},
        "second": trait({"segment": 1, "max_split": 1}),
        "last": trait({"segment": -1}),
        "missing": trait({"segment": 5}),
        "dash": trait({"separator": "-", "segment": 1}),
    }}])
    t = d.convert(note(publisher="compute.host.a-b")).traits
    assert (t["first"], t["second"], t["last"], t["dash"]) == ("compute", "host.a-b", "a-b", "b")
    assert "missing" not in t


def test_bitfield_plugin():
    d = defs([{"event_type": "*", "traits": {"bits": {
        "type": "int", "fields": ["payload.a", "payload[b]", "payload.c"],
        "plugin": {"name": "bitfield", "parameters": {"initial_bitfield": 16, "flags": [
            {"path": "payload.a", "bit": 0}, {"path": "payload.b", "bit": 1, "value": "on"},
            {"path": "payload.c", "bit": 2, "value": 3}]}}}}}])
    assert d.convert(note(payload={"a": "x", "b": "on", "c": 4})).traits["bits"] == 16 | 1 | 2
    assert d.convert(note(payload={"b": "off", "c": 3})).traits["bits"] == 16 | 4
    assert d.convert(note(payload={})).traits["bits"] == 16     # called even without matches


def test_timedelta_plugin():
    d = defs([{"event_type": "*", "traits": {"boot": {
        "type": "float", "fields": ["payload.created_at", "payload.launched_at"], "plugin": "timedelta"}}}])
    both = d.convert(note(payload={"created_at": "2026-03-02 10:19:00", "launched_at": "2026-03-02 10:20:30"}))
    assert both.traits["boot"] == 90.0
    assert "boot" not in d.convert(note(payload={"created_at": "2026-03-02 10:19:00"})).traits
    assert "boot" not in d.convert(note(payload={"created_at": "x", "launched_at": "y"})).traits


def test_definitions_are_picklable_for_beam_workers():
    d = pickle.loads(pickle.dumps(defs(default_definitions_data())))
    n = nova("compute.instance.delete.end", "12:40", deleted_at="2026-03-02T12:40:00")
    assert d.convert(n) == defs(default_definitions_data()).convert(n)
    assert d.convert(n).traits["deleted_at"] == at("12:40")


def test_naive_timestamp_is_refused():
    with pytest.raises(EventConversionError, match="naive"):
        defs([]).convert(replace(note(), timestamp=datetime(2026, 3, 2)))  # noqa: DTZ001


# ---- refusals at load: file, key path, value ----

@pytest.mark.parametrize(("data", "message"), [
    ({"event_type": "*"}, "defs.yaml: (top level): expected a list of event definitions: {'event_type': '*'}"),
    ([{"event_type": "*"}], "defs.yaml: [0].traits: required key is missing"),
    ([{"traits": {}}], "defs.yaml: [0].event_type: required key is missing"),
    ([{"event_type": "*", "traits": {}, "extra": 1}], "defs.yaml: [0].extra: unknown key (expected one of: "
     "event_type, traits)"),
    ([{"event_type": [], "traits": {}}], "defs.yaml: [0].event_type: expected a string or a non-empty list of "
     "strings: []"),
    ([{"event_type": ["a", 3], "traits": {}}], "defs.yaml: [0].event_type[1]: expected a non-empty string: 3"),
    ([{"event_type": "*", "traits": {"x": {"type": "bool", "fields": "payload.x"}}}],
     "defs.yaml: [0].traits.x.type: unknown trait type (expected one of: text, int, float, datetime): 'bool'"),
    ([{"event_type": "*", "traits": {"x": {"type": "int"}}}], "defs.yaml: [0].traits.x.fields: required key "
     "is missing"),
    ([{"event_type": "*", "traits": {"x": {"fields": 5}}}],
     "defs.yaml: [0].traits.x.fields: expected a string or a non-empty list of strings: 5"),
    ([{"event_type": "*", "traits": {"x": {"fields": "payload.x", "plugin": "upper"}}}],
     "defs.yaml: [0].traits.x.plugin: unknown plugin (expected one of: bitfield, split, timedelta): 'upper'"),
    ([{"event_type": "*", "traits": {"x": {"fields": "payload.x", "plugin": {"name": "lower"}}}}],
     "defs.yaml: [0].traits.x.plugin.name: unknown plugin (expected one of: bitfield, split, timedelta): 'lower'"),
    ([{"event_type": "*", "traits": {"x": {"fields": "payload.x", "plugin": {"parameters": {}}}}}],
     "defs.yaml: [0].traits.x.plugin.name: required key is missing"),
    ([{"event_type": "*", "traits": {"x": {"fields": "x", "plugin": {"name": "split", "parameters": {"seg": 1}}}}}],
     "defs.yaml: [0].traits.x.plugin.parameters.seg: unknown key (expected one of: max_split, segment, separator)"),
    ([{"event_type": "*", "traits": {"x": {"fields": "x", "plugin": {"name": "split",
                                                                    "parameters": {"segment": "1"}}}}}],
     "defs.yaml: [0].traits.x.plugin.parameters.segment: expected an integer: '1'"),
    ([{"event_type": "*", "traits": {"x": {"fields": "x", "plugin": {"name": "bitfield", "parameters": {
        "flags": [{"path": "payload.[", "bit": 1}]}}}}}],
     "defs.yaml: [0].traits.x.plugin.parameters.flags[0].path: not a JSONPath"),
    ([{"event_type": "*", "traits": {"x": {"fields": "x", "plugin": {"name": "bitfield", "parameters": {
        "flags": [{"path": "a", "bit": -1}]}}}}}],
     "defs.yaml: [0].traits.x.plugin.parameters.flags[0].bit: expected an integer >= 0: -1"),
    ([{"event_type": "*", "traits": {"x": {"fields": "x", "plugin": {"name": "timedelta", "parameters": {"a": 1}}}}}],
     "defs.yaml: [0].traits.x.plugin.parameters.a: unknown key (no key is allowed here)"),
])
def test_bad_files_are_refused_naming_file_key_and_value(data, message):
    with pytest.raises(EventDefinitionError) as exc:
        defs(data)
    assert str(exc.value).startswith(message)


@pytest.mark.parametrize("path", ["payload..[", "payload.`nosuch`", "a b", "payload.x)"])
def test_bad_jsonpath_is_refused(path):
    with pytest.raises(EventDefinitionError) as exc:
        defs([{"event_type": "*", "traits": {"x": {"fields": ["payload.ok", path]}}}])
    error = exc.value
    assert (error.source, error.location, error.value) == ("defs.yaml", "[0].traits.x.fields[1]", path)
    assert "not a JSONPath" in error.message


def test_hostile_payloads_convert_or_fail_cleanly():
    d = defs([{"event_type": "*", "traits": {"x": "payload..a", "y": {"type": "int", "fields": "payload.n"}}}])
    assert dict(d.convert(note(payload=[1, 2])).traits) == {"service": "compute.host-1"}   # not a mapping
    deep: dict = {}
    cursor = deep
    for _ in range(20_000):
        cursor["a"] = {}
        cursor = cursor["a"]
    with pytest.raises(EventConversionError, match="trait x"):
        d.convert(note(payload=deep))
    with pytest.raises(EventConversionError, match="trait y"):
        d.convert(note(payload={"n": "9" * 5000}))                    # past Python's int-from-text limit


_KEY = st.sampled_from(["a", "b", "c.d"])
_DOC = st.recursive(st.none() | st.integers() | st.text(max_size=3),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEY, inner, max_size=3), max_leaves=12)


@settings(max_examples=100, deadline=None)
@given(doc=_DOC, path=st.lists(_KEY, min_size=1, max_size=4))
def test_plain_paths_read_by_walking_give_what_jsonpath_finds(doc, path):
    text = ".".join(f"'{k}'" if "." in k else k for k in path)
    compiled = parse_path(text)
    keys = _plain_keys(compiled)
    assert keys == tuple(path)
    full = parse_path(f"payload.{text}")
    found = full.find({"payload": doc})
    assert len(found) <= 1
    assert _get({"payload": doc}, ("payload", *keys)) == (found[0].value if found else None)
    assert _first_plain({"payload": doc}, (("payload", *keys),)) == (found[0].value if found else None)
    # what a plugin is handed for a plain path: the path's own text, as jsonpath-ng names the match
    assert all(str(m.full_path) == str(full) for m in found)

"""ratebeam.yaml's ``events:`` section: the definitions, triggers and pipelines files, checked at load."""

from __future__ import annotations

import pickle
import textwrap
from pathlib import Path

import pytest
from events_support import at, nova
from pipeline_support import ratebeam
from test_config import BASE, _in_tmp  # noqa: F401  (_in_tmp: the autouse fixture of a ratebeam.yaml's directory)

from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.errors import InputError


def load(events: str, **files: str):
    for name, text in files.items():
        Path(name.replace("_", ".")).write_text(textwrap.dedent(text))
    Path("ratebeam.yaml").write_text(BASE + textwrap.dedent(events))
    return load_config("ratebeam.yaml")


def error(events: str, **files: str) -> str:
    with pytest.raises(InputError) as info:
        load(events, **files)
    return str(info.value)


def test_no_events_section():
    assert load("").events is None


def test_defaults_are_the_package_files():
    config = load("events: {}\n")
    events = config.events
    assert set(events.pipelines) == {"instance", "volume", "floatingip"}
    assert [t.fire_pipeline for t in events.trigger_set.triggers] == ["instance", "volume", "floatingip"]
    lifecycles = events.lifecycles(config.scope_key)
    assert lifecycles["instance"].type == "instance" and lifecycles["instance"].scope_key == "project_id"
    assert lifecycles["volume"].qty_trait == "size" and lifecycles["floatingip"].launched_trait is None
    converted = events.definition_set.convert(nova("compute.instance.create.end", "10:20"))
    assert converted.generated == at("10:20") and converted.traits["flavor_name"] == "m1.small"
    assert pickle.loads(pickle.dumps(config)).events == events


def test_own_files_relative_to_the_yaml_and_dropping():
    config = load("""\
        events:
          definitions: defs.yaml
          triggers: trig.yaml
          allow_dropping_of_notifications: true
          pipelines:
            vm: {type: instance, start_events: [compute.instance.create.end], end_events: ['*.delete.end'],
                 resource_trait: instance_id, groupby: [instance_id]}
        """,
        defs_yaml="- {event_type: 'compute.*', traits: {instance_id: payload.instance_id}}\n",
        trig_yaml="""\
            - name: vm
              distinguished_by: instance_id
              match_criteria: {event_type: 'compute.*'}
              fire_criteria: {event_type: '*.delete.end'}
              fire_pipeline: vm
            """)
    events = config.events
    assert events.definition_set.allow_dropping
    assert events.definition_set.convert(nova("image.upload", "10:00")) is None
    assert events.trigger_set.by_name("vm").fire_pipeline == "vm"
    assert events.lifecycles("tenant")["vm"].groupby == ("instance_id",)


def test_errors_name_the_definitions_file():
    assert error("events: {definitions: defs.yaml}\n",
                 defs_yaml="- {event_type: '*', traits: {x: {fields: payload.x, plugin: upper}}}\n") == (
        "defs.yaml: [0].traits.x.plugin: unknown plugin (expected one of: bitfield, split, timedelta): 'upper'")
    assert error("events: {definitions: defs.yaml}\n",
                 defs_yaml="- {event_type: '*', traits: {x: {fields: 'payload.[', type: int}}}\n").startswith(
        "defs.yaml: [0].traits.x.fields: not a JSONPath")
    assert error("events: {definitions: nothere.yaml}\n").startswith("nothere.yaml: (file): cannot read")


def test_errors_name_the_triggers_file_and_unknown_pipelines():
    trig = """\
        - name: vm
          distinguished_by: instance_id
          match_criteria: {event_type: 'compute.*', traits: {memory_mb: '> lots'}}
          fire_criteria: {event_type: '*.delete.end'}
          fire_pipeline: instance
        """
    assert error("events: {triggers: trig.yaml}\n", trig_yaml=trig) == (
        "trig.yaml: [0].match_criteria[0].traits.memory_mb: expected a number, a quoted text or a time (first, last), "
        "found 'lots' at column 3: '> lots'")
    assert error("events: {triggers: trig.yaml}\n", trig_yaml=trig.replace("> lots", "> 1").replace(
        "fire_pipeline: instance", "fire_pipeline: billing")) == (
        "trig.yaml: [0].fire_pipeline: unknown pipeline (expected one of: floatingip, instance, volume): 'billing'")


@pytest.mark.parametrize(("events", "expected"), [
    ("events: {definition: x.yaml}\n", "ratebeam.yaml: events.definition: unknown key"),
    ("events: {definition_set: x}\n", "ratebeam.yaml: events.definition_set: unknown key"),
    ("events: {allow_dropping_of_notifications: 'yes'}\n",
     "ratebeam.yaml: events.allow_dropping_of_notifications: expected true or false: 'yes'"),
    ("events: {definitions: 5}\n", "ratebeam.yaml: events.definitions: expected a non-empty string: 5"),
    ("events: {pipelines: {vm: {type: instance, end_events: [a], resource_trait: i}}}\n",
     "ratebeam.yaml: events.pipelines.vm.start_events: required key is missing"),
    ("events: {pipelines: {vm: {type: instance, start_events: [a], end_events: [a], resource_trait: i, "
     "seconds_per_unit: 0}}}\n", "ratebeam.yaml: events.pipelines.vm.seconds_per_unit: expected an integer"),
    ("events: {pipelines: {vm: {type: instance, start_events: [a], end_events: [a], resource_trait: i, "
     "kind: polling}}}\n", "ratebeam.yaml: events.pipelines.vm.kind: "),
])
def test_section_errors_name_ratebeam_yaml(events, expected):
    message = error(events)
    assert message.startswith(expected), message


def test_own_pipelines_with_the_default_triggers_must_keep_their_names():
    message = error("events: {pipelines: {vm: {type: instance, start_events: [a], end_events: [b], "
                    "resource_trait: i}}}\n")
    assert message.endswith("triggers.yaml: [0].fire_pipeline: unknown pipeline (expected one of: vm): 'instance'")


def test_a_prefetch_beyond_what_amqp_allows_is_refused_at_load_in_one_line():
    source = "events: {source: {transport_url: 'rabbit://guest:guest@127.0.0.1:5672/', prefetch: %d}}\n"
    Path("ratebeam.yaml").write_text(BASE + source % 65535)  # basic.qos prefetch_count: an AMQP short
    assert load_config("ratebeam.yaml").events.source.prefetch == 65535
    Path("ratebeam.yaml").write_text(BASE + source % 65536)
    done = ratebeam("events", "serve", "-c", "ratebeam.yaml")
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "ratebeam.yaml: events.source.prefetch: " in line and "65535" in line and line.endswith("65536"), line


def test_the_stream_converts_only_the_traits_its_triggers_and_pipelines_read():
    """``event_job``'s definitions keep the traits a trigger or a lifecycle reads, with the full file's values;
    a bad value in a trait nothing reads (``root_gb`` here) no longer makes the notification a dead letter,
    while one in a trait that is read (``launched_at``) still does."""
    from ratebeam.pipelines.commands.events import event_job
    from ratebeam.transforms.events.definitions import EventConversionError

    config = load("events: {source: {transport_url: 'rabbit://guest:guest@127.0.0.1:5672/'}}\n")
    job = event_job(config)
    note = nova("compute.instance.create.end", "10:20")
    full, read = config.events.definition_set.convert(note), job.definitions.convert(note)
    needed = job.triggers.trait_names().union(*(p.trait_names for p in job.pipelines.values()))
    assert {"instance_id", "tenant_id", "flavor_name", "launched_at"} <= set(read.traits)
    assert dict(read.traits) == {k: v for k, v in full.traits.items() if k in needed}
    assert len(read.traits) < len(full.traits)
    bad_unread = nova("compute.instance.create.end", "10:20", root_gb="lots")
    with pytest.raises(EventConversionError, match="root_gb"):
        config.events.definition_set.convert(bad_unread)
    assert job.definitions.convert(bad_unread).traits == read.traits
    with pytest.raises(EventConversionError, match="launched_at"):
        job.definitions.convert(nova("compute.instance.create.end", "10:20", launched_at="not a time"))


def test_an_events_only_configuration_needs_no_metrics_file():
    Path("metrics.yml").unlink()
    events_only = (BASE.replace("metrics: metrics.yml\n", "")
                   + "events: {source: {transport_url: 'rabbit://guest:guest@127.0.0.1:5672/'}}\n")
    Path("ratebeam.yaml").write_text(events_only)
    assert load_config("ratebeam.yaml", metrics=None).metrics is None
    for args in (("db", "upgrade"), ("events", "reprocess", "--from", "2026-03-02T00:00", "--to", "2026-03-02T01:00")):
        done = ratebeam(*args, "-c", "ratebeam.yaml")
        assert done.returncode == 0, done.stderr
    done = ratebeam("run", "-c", "ratebeam.yaml")  # the polling cycle still needs one, and says so
    assert done.returncode == 2
    assert "ratebeam.yaml: metrics: required key is missing (the metrics file of the polling cycle)" in done.stderr


def test_the_writers_stage_has_an_output_consumed_past_a_fusion_break():
    """The commit step's output goes through a Reshuffle (a fusion break, elided by Prism) to a step of its own.

    Why (``events.graph._LastStageOutput``): Prism 2.78 spins a core while it waits for the response of
    a bundle whose stage has no output left open, and a stage without an output has none from its start —
    the writers' stage spun for as long as it wrote.  Measured with a counting Prism, not checked here.
    """
    import apache_beam as beam
    from apache_beam.portability import common_urns

    from ratebeam.pipelines.commands.events import event_job
    from ratebeam.pipelines.events.graph import build_events
    from ratebeam.transforms.chain_rater import ChainRaterFactory
    from ratebeam.transforms.rules import RuleSet

    config = load("events: {source: {transport_url: 'rabbit://guest:guest@127.0.0.1:5672/'}}\n")
    pipeline = beam.Pipeline(runner="FnApiRunner")
    build_events(pipeline, event_job(config), ChainRaterFactory(RuleSet(), (), (), config.metrics))
    transforms = pipeline.to_runner_api().components.transforms
    [commit] = [t for t in transforms.values() if t.unique_name == "Commit"]
    [committed] = commit.outputs.values()
    consumers = {t.spec.urn for t in transforms.values() if committed in t.inputs.values()}
    assert common_urns.composites.RESHUFFLE.urn in consumers, consumers

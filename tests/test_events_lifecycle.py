"""The lifecycle pipeline: active seconds between start and end events, cut at the rating periods.

The worked example of docs/events.md (created 10:20 m1.small, resized 11:05 to m1.large, deleted
12:40, hourly periods) is computed from Nova-shaped notifications through the shipped event
definitions, and checked against the hand computation, exactly; then rated by the cycle's rating
chain, and compared with the same lifecycle polled once a minute and read by the file collector.
"""

from __future__ import annotations

from decimal import Decimal

import polars as pl
import pytest
from events_support import (
    DATA,
    INSTANCE,
    at,
    cinder,
    default_definitions_data,
    event,
    rated,
    rows,
    worked_example_events,
)

from ratebeam.connectors.collectors.file.collector import FileCollector
from ratebeam.pipelines.metrics_config import parse_metrics
from ratebeam.transforms.convert_usage import convert_samples
from ratebeam.transforms.events.definitions import EventDefinitions
from ratebeam.transforms.events.lifecycle import (
    LifecycleSettings,
    UsageRequest,
    lifecycle_usage,
    lifecycle_usages,
    period_begin,
    period_end,
)
from ratebeam.transforms.frames import Frame, manifest, to_frame

HOUR = 3600


def test_worked_example_usage_per_period_and_flavor():
    batch, found = lifecycle_usage(worked_example_events(), INSTANCE, HOUR, closed_until=at("13:00"))
    assert found == []
    # By hand: 10:20-11:00 small 40 min; 11:00-11:05 small 5 min, 11:05-12:00 large 55 min; 12:00-12:40 large 40 min.
    assert rows(batch) == [("10:00", "m1.small", Decimal(2400)), ("11:00", "m1.large", Decimal(3300)),
                           ("11:00", "m1.small", Decimal(300)), ("12:00", "m1.large", Decimal(2400))]
    frame = to_frame(batch)
    assert set(frame["scope_id"]) == {"t-1"} and set(frame["type"]) == {"instance"} and set(frame["unit"]) == {"second"}
    assert set(frame["groupby.project_id"]) == {"t-1"} and set(frame["groupby.instance_id"]) == {"i-1"}
    assert set(frame["metadata.host"]) == {"compute-1-5-6-7"} and set(frame["price"]) == {Decimal(0)}
    assert frame["end"].to_list() == [b + (at("11:00") - at("10:00")) for b in frame["begin"]]
    assert {"groupby.week_of_the_year", "groupby.day_of_the_year", "groupby.month", "groupby.year"} <= set(frame.columns)
    assert frame["groupby.day_of_the_year"].to_list() == ["61"] * 4
    assert manifest(batch) == [Frame("t-1", at("10:00")), Frame("t-1", at("11:00")), Frame("t-1", at("12:00"))]


def test_worked_example_price_equals_hand_computation():
    frame = rated(lifecycle_usage(worked_example_events(), INSTANCE, HOUR, at("13:00"))[0])
    prices = {(b.strftime("%H:%M"), f): p for b, f, p in frame.select("begin", "groupby.flavor_name", "price").iter_rows()}
    assert prices == {("10:00", "m1.small"): Decimal("0.24"), ("11:00", "m1.small"): Decimal("0.03"),
                      ("11:00", "m1.large"): Decimal("1.32"), ("12:00", "m1.large"): Decimal("0.96")}
    # m1.small 0.36/h for 45 min + m1.large 1.44/h for 95 min, in exact fractions of an hour.
    hand = Decimal("0.36") * 45 / 60 + Decimal("1.44") * 95 / 60
    assert sum(frame["price"]) == hand == Decimal("2.55")


def test_polling_the_same_lifecycle_through_the_file_collector_gives_the_same_rated_totals():
    """tests/data/lifecycle_worked_example.csv: one sample a minute (60 active seconds, `sum`), as polling sees it."""
    metrics = parse_metrics({"metrics": {"instance": {
        "unit": "second", "groupby": ["instance_id", "flavor_name"], "extra_args": {"aggregation_method": "sum"}}}},
        "metrics.yml")
    metric = metrics.metrics[0]
    collector = FileCollector(str(DATA / "lifecycle_worked_example.csv"))
    polled = convert_samples(collector.collect_periods("t-1", [at("10:00"), at("11:00"), at("12:00")], HOUR, metric),
                             [metric], collector.numeric_context)
    streamed = lifecycle_usage(worked_example_events(), INSTANCE, HOUR, at("13:00"))[0]
    assert rows(polled) == rows(streamed)
    by_polling, by_events = rated(polled), rated(streamed)
    keys = ["begin", "groupby.flavor_name", "groupby.instance_id", "groupby.project_id"]
    assert (by_polling.select(*keys, "qty", "price").sort(keys).to_dicts()
            == by_events.select(*keys, "qty", "price").sort(keys).to_dicts())
    assert sum(by_polling["price"]) == sum(by_events["price"]) == Decimal("2.55")


def test_order_and_duplicates_do_not_matter():
    events = worked_example_events()
    shuffled = [events[3], events[1], events[0], events[3], events[2], events[0]]
    assert rows(lifecycle_usage(shuffled, INSTANCE, HOUR, at("13:00"))[0]) == rows(
        lifecycle_usage(events, INSTANCE, HOUR, at("13:00"))[0])


def test_an_event_that_changes_no_price_adds_missing_labels_and_changes_none():
    """A confirm, or the other copy of a change sent in both of Nova's formats, cuts nothing."""
    def ev(kind, when, **traits):
        return event(f"compute.instance.{kind}", when, instance_id="i-1", tenant_id="t-1", flavor_name="m1.small",
                     **traits)
    events = [ev("create.end", "10:20"), ev("create.end", "10:20:00.250000", host="h-1"),
              ev("resize.confirm.end", "10:30", host="h-2"), ev("delete.end", "10:40"), ev("delete.end", "10:41")]
    frame = to_frame(lifecycle_usage(events, INSTANCE, HOUR, at("11:00"))[0])
    assert frame.select("qty", "metadata.host").rows() == [(Decimal(1200), "h-1")]


def test_an_instance_alive_is_billed_up_to_the_closed_periods_and_rows_are_final():
    events = worked_example_events()
    alive = events[:3]
    assert lifecycle_usage(alive, INSTANCE, HOUR, at("10:59:59"))[0] is None
    assert rows(lifecycle_usage(alive, INSTANCE, HOUR, at("11:00"))[0]) == [("10:00", "m1.small", Decimal(2400))]
    early = rows(lifecycle_usage(alive, INSTANCE, HOUR, at("12:30"))[0])
    assert early == [("10:00", "m1.small", Decimal(2400)), ("11:00", "m1.large", Decimal(3300)),
                     ("11:00", "m1.small", Decimal(300))]
    assert rows(lifecycle_usage(alive, INSTANCE, HOUR, at("14:00"))[0])[-2:] == [
        ("12:00", "m1.large", Decimal(3600)), ("13:00", "m1.large", Decimal(3600))]
    # Deleted afterwards: the rows of the periods already closed are the same rows (same point ids).
    final = rows(lifecycle_usage(events, INSTANCE, HOUR, period_end(events[-1].generated, HOUR))[0])
    assert final[:3] == early


def test_a_bill_from_a_later_period_has_exactly_the_full_bills_rows_of_those_periods():
    """``billed_from`` (the scope step's bill at each period end) starts the walk at that period instead of the
    segment's start, so a long-lived instance costs its new periods only; the rows are the full bill's, filtered."""
    month_old = [event("compute.instance.create.end", "2026-02-01T09:30", instance_id="i-1", tenant_id="t-1",
                       flavor_name="m1.small"),
                 event("compute.instance.finish_resize.end", "11:05", instance_id="i-1", tenant_id="t-1",
                       flavor_name="m1.large")]

    def dated_rows(batch):
        return [] if batch is None else sorted(to_frame(batch).select("begin", "groupby.flavor_name", "qty").iter_rows())

    for events, closed in ((worked_example_events(), at("13:00")), (month_old, at("14:00"))):
        full_batch, [full] = lifecycle_usages([UsageRequest(events, closed)], INSTANCE, HOUR)
        everything = dated_rows(full_batch)
        assert len(everything) > 3
        for billed_from in (at("2026-02-01T10:00"), at("10:00"), at("11:00"), at("11:30"), at("12:00"), at("13:00")):
            batch, [usage] = lifecycle_usages([UsageRequest(events, closed, billed_from)], INSTANCE, HOUR)
            assert dated_rows(batch) == [r for r in everything if r[0] >= billed_from], billed_from
            assert usage.begins == tuple(b for b in full.begins if b >= billed_from), billed_from


def test_hours_as_the_unit_round_at_the_quantity_scale():
    hourly = LifecycleSettings(
        type="instance", start_events=INSTANCE.start_events, resize_events=INSTANCE.resize_events,
        end_events=INSTANCE.end_events, price_traits=("flavor_name",), groupby=("flavor_name",), unit="hour",
        seconds_per_unit=3600)
    qty = dict(((b, f), q) for b, f, q in rows(lifecycle_usage(worked_example_events(), hourly, HOUR, at("13:00"))[0]))
    assert qty[("10:00", "m1.small")] == Decimal("0.666666666666666667")
    assert qty[("11:00", "m1.small")] == Decimal("0.083333333333333333")
    assert qty[("11:00", "m1.large")] == Decimal("0.916666666666666667")


def test_volume_gb_seconds_and_a_size_change_cuts_the_segment():
    definitions = EventDefinitions.from_yaml_data(default_definitions_data(), "event_definitions.yaml")
    events = [definitions.convert(n) for n in (cinder("volume.create.end", "10:00", size=10),
                                               cinder("volume.resize.end", "10:30", size=20),
                                               cinder("volume.delete.end", "11:15", size=20))]
    volume = LifecycleSettings(type="volume.size", start_events=("volume.create.end",),
                               resize_events=("volume.resize.end",), end_events=("volume.delete.end",),
                               price_traits=("volume_type",), qty_trait="size", groupby=("volume_id",),
                               resource_trait="volume_id", unit="GiB-second")
    frame = to_frame(lifecycle_usage(events, volume, HOUR, at("12:00"))[0]).sort("begin")
    assert frame["qty"].to_list() == [Decimal(10 * 1800 + 20 * 1800), Decimal(20 * 900)]


def test_start_after_end_opens_a_new_segment_and_microseconds_are_exact():
    settings = LifecycleSettings(type="instance", start_events=("*.unshelve.end", "*.create.end"),
                                 end_events=("*.shelve_offload.end", "*.delete.end"), groupby=("instance_id",))
    events = [event("compute.instance.create.end", "10:00:00.250000", instance_id="i", tenant_id="t"),
              event("compute.instance.shelve_offload.end", "10:10", instance_id="i", tenant_id="t"),
              event("compute.instance.unshelve.end", "10:50", instance_id="i", tenant_id="t"),
              event("compute.instance.delete.end", "11:00:00.000001", instance_id="i", tenant_id="t")]
    hourly = to_frame(lifecycle_usage(events, settings, HOUR, at("12:00"))[0]).sort("begin")
    assert hourly["qty"].to_list() == [Decimal("599.75") + Decimal(600), Decimal("0.000001")]
    daily = lifecycle_usage(events, settings, 86400, at("2026-03-03T00:00:00"))[0]
    assert to_frame(daily)["qty"].to_list() == [Decimal("1199.750001")]
    assert to_frame(daily)["begin"].to_list() == [at("00:00")]


# ---- reconciliation with compute.instance.exists ----

def exists(when, begin, end, flavor="m1.small", **extra):
    return event("compute.instance.exists", when, instance_id="i-1", tenant_id="t-1", flavor_name=flavor,
                 audit_period_beginning=at(begin), audit_period_ending=at(end), **extra)


def test_a_start_never_seen_is_billed_from_the_audit_period_and_reported():
    events = [exists("10:01", "09:00", "10:00"),
              event("compute.instance.delete.end", "10:30", instance_id="i-1", tenant_id="t-1", flavor_name="m1.small")]
    batch, found = lifecycle_usage(events, INSTANCE, HOUR, at("11:00"))
    assert rows(batch) == [("09:00", "m1.small", Decimal(3600)), ("10:00", "m1.small", Decimal(1800))]
    assert [(d.kind, d.resource_id, d.scope_id, d.message_id) for d in found] == [
        ("start_not_seen", "i-1", "t-1", events[0].message_id)]
    assert "billed from 2026-03-02T09:00:00+00:00" in found[0].detail


def test_launched_at_inside_the_audit_period_is_the_better_start():
    events = [exists("10:01", "09:00", "10:00", launched_at=at("09:20"))]
    batch, found = lifecycle_usage(events, INSTANCE, HOUR, at("11:00"))      # still running: billed to 11:00
    assert rows(batch) == [("09:00", "m1.small", Decimal(2400)), ("10:00", "m1.small", Decimal(3600))]
    assert [d.kind for d in found] == ["start_not_seen"]


def test_an_audit_heard_after_the_first_event_still_dates_the_start():
    events = [event("compute.instance.resize.confirm.end", "10:30", instance_id="i-1", tenant_id="t-1",
                    flavor_name="m1.large"), exists("11:01", "10:00", "11:00", flavor="m1.small")]
    batch, found = lifecycle_usage(events, INSTANCE, HOUR, at("11:00"))
    assert rows(batch) == [("10:00", "m1.large", Decimal(1800)), ("10:00", "m1.small", Decimal(1800))]
    assert [d.kind for d in found] == ["start_not_seen", "price_traits_differ"]


def test_first_event_a_resize_without_any_audit_is_billed_from_it_and_reported():
    events = [event("compute.instance.resize.confirm.end", "10:30", instance_id="i-1", tenant_id="t-1",
                    flavor_name="m1.large")]
    batch, found = lifecycle_usage(events, INSTANCE, HOUR, at("11:00"))
    assert rows(batch) == [("10:00", "m1.large", Decimal(1800))]
    assert [d.kind for d in found] == ["start_not_seen"]


def test_audit_disagreements_are_reported_not_hidden():
    events = [*worked_example_events(), exists("12:01", "11:00", "12:00", flavor="m1.tiny"),
              exists("14:01", "13:00", "14:00", flavor="m1.large"),
              event("compute.instance.exists", "15:01", instance_id="i-1", tenant_id="t-1",
                    audit_period_beginning=at("15:00"), audit_period_ending=at("14:00"))]
    batch, found = lifecycle_usage(events, INSTANCE, HOUR, at("13:00"))
    assert rows(batch) == rows(lifecycle_usage(worked_example_events(), INSTANCE, HOUR, at("13:00"))[0])
    assert [d.kind for d in found] == ["price_traits_differ", "exists_outside_activity", "bad_audit_period"]
    assert "m1.tiny" in found[0].detail and "m1.large" in found[0].detail


def test_an_end_without_start_or_audit_bills_nothing_and_is_reported():
    events = [event("compute.instance.delete.end", "12:40", instance_id="i-1", tenant_id="t-1")]
    batch, found = lifecycle_usage(events, INSTANCE, HOUR, at("13:00"))
    assert batch is None and [d.kind for d in found] == ["end_without_start"]


def test_without_a_scope_nothing_is_billed_and_it_is_reported():
    events = [event("compute.instance.create.end", "10:20", instance_id="i-1", flavor_name="m1.small")]
    batch, found = lifecycle_usage(events, INSTANCE, HOUR, at("13:00"))
    assert batch is None and [(d.kind, d.scope_id) for d in found] == [("no_scope", None)]


def test_a_segment_without_its_quantity_trait_is_reported():
    volume = LifecycleSettings(type="volume.size", start_events=("volume.create.end",), end_events=("volume.delete.end",),
                               qty_trait="size", resource_trait="volume_id")
    events = [event("volume.create.end", "10:00", volume_id="v", tenant_id="t"),
              event("volume.delete.end", "10:30", volume_id="v", tenant_id="t")]
    batch, found = lifecycle_usage(events, volume, HOUR, at("11:00"))
    assert batch is None and [d.kind for d in found] == ["no_quantity"]


def test_naive_closed_until_is_refused():
    with pytest.raises(ValueError, match="closed_until must be timezone-aware"):
        lifecycle_usage(worked_example_events(), INSTANCE, HOUR, at("13:00").replace(tzinfo=None))


def test_periods_are_aligned_on_the_epoch():
    assert period_begin(at("10:20:30.5"), HOUR) == at("10:00") and period_end(at("10:00"), HOUR) == at("11:00")
    assert period_begin(at("10:20"), 86400) == at("00:00")


@pytest.mark.parametrize("bad", [{"type": ""}, {"end_events": ()}, {"seconds_per_unit": 0}])
def test_settings_are_checked(bad):
    with pytest.raises(ValueError):
        LifecycleSettings(**({"type": "instance", "start_events": ("a",), "end_events": ("b",)} | bad))


def test_rows_have_the_usage_schema():
    batch = lifecycle_usage(worked_example_events(), INSTANCE, HOUR, at("13:00"))[0]
    assert to_frame(batch).schema["qty"] == pl.Decimal(38, 18)
    assert to_frame(batch).schema["begin"] == pl.Datetime("us", "UTC")

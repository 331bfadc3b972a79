"""The event stream's discrepancies, stored and listed ("reported, not hidden"), on SQLite
and PostgreSQL: what ``lifecycle_usage`` finds when it is run again at each period close is one row
whose ``last_seen_at`` moves, only new findings are counted, and ``ratebeam events discrepancies``
lists them by scope, kind and time as a table, JSON or CSV, refusing a bad option in one line."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import pytest
from events_support import INSTANCE, at, event
from pipeline_support import workspace

from ratebeam.connectors.notifications.discrepancies import DiscrepancyStore
from ratebeam.pipelines.cli import main
from ratebeam.transforms.events.lifecycle import LifecycleSettings, lifecycle_usage
from ratebeam.transforms.events.reconcile import Discrepancy

HOUR = 3600
VOLUME = LifecycleSettings(type="volume.size", start_events=("volume.create.end",), end_events=("volume.delete.end",),
                           qty_trait="size", resource_trait="volume_id")


def _exists(message_id: str, when: str, begin: str, end: str, flavor: str = "m1.small"):
    """Nova's periodic audit of i-1 (tenant t-1) for ``[begin, end)``."""
    return event("compute.instance.exists", when, message_id, instance_id="i-1", tenant_id="t-1", flavor_name=flavor,
                 audit_period_beginning=at(begin), audit_period_ending=at(end))


#: i-1 as the stream hears it: an audit with no start (start_not_seen), then a resize to m1.large
#: and an audit that still says m1.small (price_traits_differ).
AUDITED = _exists("exists-1", "10:01", "09:00", "10:00")
LATER = [event("compute.instance.resize.confirm.end", "10:30", "resize-1", instance_id="i-1", tenant_id="t-1",
               flavor_name="m1.large"), _exists("exists-2", "11:01", "10:00", "11:00")]


def _found(events, closed_until: str, settings: LifecycleSettings = INSTANCE) -> list[Discrepancy]:
    return lifecycle_usage(events, settings, HOUR, at(closed_until))[1]


@pytest.fixture
def store(engine):
    store = DiscrepancyStore(engine.url.render_as_string(hide_password=False))
    yield store
    store.engine.dispose()


def test_the_same_finding_at_every_period_close_is_one_row_whose_last_seen_moves(store):
    first, second = at("11:00"), at("12:00")
    assert len(store.record("instance", "i-1", _found([AUDITED], "11:00"), run_id="job-1", now=first)) == 1
    again = _found([AUDITED, *LATER], "12:00")
    assert [d.kind for d in again] == ["start_not_seen", "price_traits_differ"]
    assert len(store.record("instance", "i-1", again, run_id="job-2", now=second)) == 1  # only the price is new
    assert len(store.record("instance", "i-1", again, run_id="job-2", now=second + timedelta(hours=1))) == 0
    rows = {r.kind: r for r in store.listing()}
    assert set(rows) == {"start_not_seen", "price_traits_differ"}
    start = rows["start_not_seen"]
    assert (start.trigger, start.instance_key, start.message_id, start.resource_id, start.scope) == (
        "instance", "i-1", "exists-1", "i-1", "t-1")
    assert (start.first_seen_at, start.last_seen_at, start.run_id) == (first, second + timedelta(hours=1), "job-2")
    assert "billed from 2026-03-02T09:00:00+00:00" in start.detail
    price = rows["price_traits_differ"]
    assert (price.message_id, price.first_seen_at) == ("exists-2", second)
    assert "m1.small" in price.detail and "m1.large" in price.detail


def test_findings_of_one_computation_with_the_same_key_are_one_row_with_both_details(store):
    volume = [event("volume.create.end", "10:00", "create-1", volume_id="v", tenant_id="t"),
              event("volume.delete.end", "10:30", "delete-1", volume_id="v", tenant_id="t"),
              event("volume.create.end", "11:00", "create-2", volume_id="v", tenant_id="t"),
              event("volume.delete.end", "11:30", "delete-2", volume_id="v", tenant_id="t")]
    found = _found(volume, "12:00", VOLUME)
    assert [(d.kind, d.message_id) for d in found] == [("no_quantity", "create-1")] * 2  # one per segment
    assert len(store.record("volume", "v", found, now=at("12:00"))) == 1
    (row,) = store.listing()
    assert row.detail == ("no numeric size from 2026-03-02T10:00:00+00:00: that segment is not billed; "
                          "no numeric size from 2026-03-02T11:00:00+00:00: that segment is not billed")
    assert len(store.record("volume", "v", [], now=at("13:00"))) == 0
    assert store.listing()[0].last_seen_at == at("12:00")


def test_the_same_finding_of_another_instance_or_trigger_is_another_row(store):
    found = _found([AUDITED], "11:00")
    assert len(store.record("instance", "i-1", found, now=at("11:00"))) == 1
    assert len(store.record("instance", "i-1\x1fother", found, now=at("11:00"))) == 1
    assert len(store.record("instance-audit", "i-1", found, now=at("11:00"))) == 1
    assert len(store.listing()) == 3


def _fill(store) -> None:
    """Three findings: t-1's at 11:00 and 12:00, a scope-less one (i-2) at 12:00."""
    store.record("instance", "i-1", _found([AUDITED], "11:00"), run_id="job-1", now=at("11:00"))
    store.record("instance", "i-1", _found([AUDITED, *LATER], "12:00"), run_id="job-2", now=at("12:00"))
    no_scope = _found([event("compute.instance.create.end", "10:20", "create-i2", instance_id="i-2",
                             flavor_name="m1.small")], "11:00")
    store.record("instance", "i-2", no_scope, run_id="job-2", now=at("12:00"))


def test_listing_filters_by_scope_kind_and_since(store):
    _fill(store)
    assert [(r.kind, r.scope) for r in store.listing()] == [
        ("start_not_seen", "t-1"), ("price_traits_differ", "t-1"), ("no_scope", None)]  # oldest first
    assert [r.kind for r in store.listing(scope="t-1")] == ["start_not_seen", "price_traits_differ"]
    assert store.listing(scope="t-2") == []
    assert [r.instance_key for r in store.listing(kind="no_scope")] == ["i-2"]
    assert [r.kind for r in store.listing(since=at("11:30"))] == ["start_not_seen", "price_traits_differ", "no_scope"]
    assert [r.kind for r in store.listing(scope="t-1", kind="price_traits_differ", since=at("12:00"))] == [
        "price_traits_differ"]
    assert store.listing(since=at("12:00:01")) == []


# ---- ratebeam events discrepancies ----

@pytest.fixture
def config(db_url, store, tmp_path):
    """A workspace on the test database (upgraded by ``engine``) holding ``_fill``'s findings."""
    _fill(store)
    return str(workspace(tmp_path / "ws", database_url=db_url))


def _listing(capsys, config: str, *options: str) -> list[dict]:
    assert main(["events", "discrepancies", "-c", config, "--format", "json", *options]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_command_lists_them_as_json_csv_and_a_table(config, capsys):
    rows = _listing(capsys, config)
    assert [(r["scope"], r["kind"], r["instance"], r["message_id"]) for r in rows] == [
        ("t-1", "start_not_seen", "i-1", "exists-1"), ("t-1", "price_traits_differ", "i-1", "exists-2"),
        (None, "no_scope", "i-2", "create-i2")]
    assert rows[0]["first_seen"] == "2026-03-02T11:00:00+00:00" and rows[0]["last_seen"] == "2026-03-02T12:00:00+00:00"
    assert (rows[0]["trigger"], rows[0]["resource"], rows[0]["run_id"]) == ("instance", "i-1", "job-2")
    assert rows[2]["detail"] == "no tenant_id trait in any event: nothing billed"
    assert main(["events", "discrepancies", "-c", config, "--format", "csv"]) == 0
    assert list(csv.DictReader(io.StringIO(capsys.readouterr().out))) == [
        {k: "" if v is None else str(v) for k, v in row.items()} for row in rows]
    assert main(["events", "discrepancies", "-c", config]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["first_seen", "last_seen", "scope", "trigger", "instance", "resource", "kind",
                                "message_id", "run_id", "detail"]
    assert len(table) == 2 + 3 + 1 and table[-1] == "(3 discrepancy(ies))"
    assert "price_traits_differ" in table[3] and table[4].split()[2:5] == ["instance", "i-2", "i-2"]


def test_the_command_filters_by_scope_kind_and_since(config, capsys):
    assert [r["kind"] for r in _listing(capsys, config, "--scope", "t-1")] == ["start_not_seen", "price_traits_differ"]
    assert [r["instance"] for r in _listing(capsys, config, "--kind", "no_scope")] == ["i-2"]
    assert _listing(capsys, config, "--since", "2026-03-02T12:00:01Z") == []
    assert len(_listing(capsys, config, "--since", "2026-03-02T11:30")) == 3  # naive: UTC
    assert _listing(capsys, config, "--scope", "t-1", "--kind", "no_scope") == []


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--kind", "start-not-seen", "command line: --kind: not a discrepancy kind (one of start_not_seen, "),
    ("--since", "yesterday", "command line: --since: not an ISO-8601 date or time: 'yesterday'"),
])
def test_a_bad_option_is_one_line_naming_it_and_exit_2(config, capsys, option, value, message):
    assert main(["events", "discrepancies", "-c", config, option, value]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err and value in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_a_database_not_upgraded_says_how_to_fix_it(db_url, tmp_path, capsys):
    config = str(workspace(tmp_path / "ws", database_url=db_url))
    assert main(["events", "discrepancies", "-c", config]) == 2
    assert "ratebeam db upgrade" in capsys.readouterr().err

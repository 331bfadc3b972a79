"""Reprocessing schedules with CloudKitty's validations (spec §6.7), on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from ratebeam.connectors.sql.schedule import ScheduleError, ScheduleRepository
from ratebeam.connectors.sql.state_store import StateStore

KEY = ("project_id", "keystone", "gnocchi")
P = 3600
H = timedelta(seconds=P)
LAST = datetime(2026, 1, 10, 0, 0, tzinfo=UTC)
START = LAST - 48 * H
END = LAST - 24 * H
NOW = datetime(2026, 1, 15, tzinfo=UTC)


@pytest.fixture
def states(engine) -> StateStore:
    store = StateStore(engine, *KEY)
    for scope in ("p1", "p2", "p3"):
        store.reset(scope, LAST, now=NOW)
    return store


@pytest.fixture
def schedules(engine, states) -> ScheduleRepository:
    return ScheduleRepository(engine, *KEY)


def test_add_and_list(schedules):
    created = schedules.add(["p2", "p1"], START, END, "price fix", P)
    assert sorted(s.scope for s in created) == ["p1", "p2"]
    assert all((s.start, s.end, s.current, s.reason) == (START, END, None, "price fix") for s in created)
    listed = schedules.list_unfinished()
    assert listed == sorted(created, key=lambda s: s.id)
    assert [s.scope for s in schedules.list_unfinished(["p2"])] == ["p2"]


def test_all_means_every_active_scope(schedules, states):
    states.set_active("p3", False, now=NOW)
    StateStore(schedules.engine, "project_id", "keystone", "prometheus").reset("other-key", LAST, now=NOW)
    created = schedules.add("ALL", START, END, "r", P)
    assert sorted(s.scope for s in created) == ["p1", "p2"]


def test_end_bound_is_inclusive_and_may_equal_start_and_last(schedules):
    [one] = schedules.add(["p1"], LAST, LAST, "just the last period", P)
    assert one.start == one.end == LAST


@pytest.mark.parametrize(("scopes", "start", "end", "reason", "message"), [
    (["ALL", "p1"], START, END, "r", "Cannot use 'ALL' with scope ID"),
    (["p1"], START, END, "  ", "Empty or blank reason"),
    (["p1"], END, START, "r", "cannot be less than start"),
    (["p1"], START + timedelta(minutes=30), END, "r", "does not comply with the configured collector period"),
    (["p1"], START, END + timedelta(seconds=1), "r", "does not comply"),
    (["p1", "nope"], START, END, "r", r"Scopes \['nope'\] .* do not exist"),
    (["p1"], LAST + H, LAST + H, "r", "starting after the last possible timestamp"),
    (["p1"], START, LAST + H, "r", "ending after the last possible timestamp"),
])
def test_cloudkitty_validations(schedules, scopes, start, end, reason, message):
    with pytest.raises(ScheduleError, match=message):
        schedules.add(scopes, start, end, reason, P)
    assert schedules.list_unfinished() == []


def test_misaligned_window_suggests_an_aligned_one(schedules):
    with pytest.raises(ScheduleError) as info:
        schedules.add(["p1"], START + timedelta(minutes=10), START + timedelta(minutes=20), "r", P)
    assert f"['{START}', '{START + H}']" in str(info.value)


def test_inactive_or_never_rated_scopes_cannot_be_scheduled(schedules, states, engine):
    states.set_active("p3", False, now=NOW)
    with pytest.raises(ScheduleError, match="do not exist"):
        schedules.add(["p3"], START, END, "r", P)
    assert states.acquire("fresh", "a", 60, NOW).last_processed is None  # a row without timestamp
    with pytest.raises(ScheduleError, match="starting after the last possible timestamp"):
        schedules.add(["fresh"], START, END, "r", P)


def test_overlapping_windows_of_one_scope_are_refused_bounds_included(schedules):
    schedules.add(["p1"], START, END, "first", P)
    with pytest.raises(ScheduleError, match=r"Cannot schedule a reprocessing for scope \[p1\]"):
        schedules.add(["p1"], END, END + H, "touching", P)
    with pytest.raises(ScheduleError, match="similar time range"):
        schedules.add(["p1", "p2"], START - H, START, "touching the start", P)
    assert [s.scope for s in schedules.add(["p2"], START, END, "other scope", P)] == ["p2"]
    assert [s.scope for s in schedules.add(["p1"], END + H, LAST, "after", P)] == ["p1"]


def test_progress_and_finish(schedules):
    [s] = schedules.add(["p1"], START, END, "r", P)
    assert schedules.set_current(s.id, START)
    [listed] = schedules.list_unfinished()
    assert listed.current == START and not listed.finished
    assert schedules.set_current(s.id, END)
    assert schedules.list_unfinished() == []
    # a finished schedule no longer blocks the same window
    assert len(schedules.add(["p1"], START, END, "again", P)) == 1


def test_set_current_outside_the_window_or_unknown(schedules):
    [s] = schedules.add(["p1"], START, END, "r", P)
    with pytest.raises(ScheduleError, match="outside"):
        schedules.set_current(s.id, END + H)
    assert not schedules.set_current(s.id + 1000, START)


def test_naive_datetimes_are_refused(schedules):
    with pytest.raises(ValueError, match="timezone-aware"):
        schedules.add(["p1"], START.replace(tzinfo=None), END, "r", P)


def test_concurrent_overlapping_requests_create_one_schedule(schedules):
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            schedules.add(["p1"], START, END, f"request {i}", P)
            outcomes.append("created")
        except ScheduleError:
            outcomes.append("refused")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["created", "refused", "refused", "refused"]
    assert len(schedules.list_unfinished()) == 1

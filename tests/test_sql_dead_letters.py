"""The dead-letter store on SQLite and PostgreSQL: one row per frame however often it fails, resolved
once its scope is committed past it, listed and cleared by filter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ratebeam.connectors.sql.dead_letters import DeadLetterFilter, DeadLetterStore
from ratebeam.transforms.frames import FrameOutcome

T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


def _failure(scope: str, hour: int, reason: str = "bad rule") -> FrameOutcome:
    return FrameOutcome(scope, T0 + hour * HOUR, False, "rate", reason)


def _store(engine) -> DeadLetterStore:
    return DeadLetterStore(engine.url.render_as_string(hide_password=False))


def test_a_frame_failing_at_every_run_is_one_row_with_a_count(engine):
    store = _store(engine)
    store.add("run1", [_failure("p1", 0), _failure("p1", 1)], now=T0 + 10 * HOUR)
    store.add("run2", [_failure("p1", 0, "still bad")], now=T0 + 11 * HOUR)
    store.add("run3", [_failure("p1", 0, "still bad"), _failure("p1", 0, "twice in one run")], now=T0 + 12 * HOUR)
    rows = {r.period_begin: r for r in store.find(DeadLetterFilter())}
    assert len(rows) == 2
    first = rows[T0]
    assert (first.failures, first.run_id, first.reason) == (3, "run3", "twice in one run")
    assert (first.created_at, first.last_seen_at) == (T0 + 10 * HOUR, T0 + 12 * HOUR)
    assert rows[T0 + HOUR].failures == 1
    assert [f.begin for f in store.for_run("run3")] == [T0]


def test_a_frame_committed_later_is_resolved_and_reopened_if_it_fails_again(engine):
    store = _store(engine)
    store.add("run1", [_failure("p1", 0), _failure("p1", 5), _failure("p2", 0)])
    assert store.resolve("p1", T0 + 2 * HOUR, now=T0 + 20 * HOUR) == 1  # p1's hour 5 is not committed yet
    open_ = store.find(DeadLetterFilter(unresolved=True))
    assert sorted((r.scope, r.period_begin.hour) for r in open_) == [("p1", 5), ("p2", 0)]
    (done,) = store.find(DeadLetterFilter(resolved=True))
    assert (done.scope, done.period_begin, done.resolved_at) == ("p1", T0, T0 + 20 * HOUR)
    store.add("run2", [_failure("p1", 0)])  # a state reset re-rated it, and it failed again
    assert len(store.find(DeadLetterFilter(unresolved=True))) == 3


def test_filters_select_and_clear_by_scope_since_and_id(engine):
    store = _store(engine)
    store.add("run1", [_failure("p1", 0), _failure("p2", 0)], now=T0)
    store.add("run2", [_failure("p3", 0)], now=T0 + 5 * HOUR)
    assert [r.scope for r in store.find(DeadLetterFilter(since=T0 + HOUR))] == ["p3"]
    assert [r.scope for r in store.find(DeadLetterFilter(scopes=("p1", "p3")))] == ["p1", "p3"]
    p2 = store.find(DeadLetterFilter(scopes=("p2",)))[0].id
    assert store.clear(DeadLetterFilter(ids=(p2,))) == 1
    assert store.clear(DeadLetterFilter(scopes=("p1",))) == 1
    assert [r.scope for r in store.find(DeadLetterFilter())] == ["p3"]
    assert store.clear(DeadLetterFilter()) == 1 and store.find(DeadLetterFilter()) == []

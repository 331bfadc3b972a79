"""The ranges of reprocessing and backfill jobs: what is left, what is next, CloudKitty's overlap rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ratebeam.connectors.sql.job_transforms import _continues_state
from ratebeam.connectors.sql.jobs import BACKFILL, REPROCESS, JobRange, JobStore, overlaps
from ratebeam.connectors.sql.state_store import ScopeState

H = 3600
T0 = datetime(2026, 1, 2, tzinfo=UTC)


def at(hours: int) -> datetime:
    return T0 + timedelta(hours=hours)


def test_the_end_period_is_included_and_progress_continues_after_current():
    fresh = JobRange(REPROCESS, 1, "p", at(0), at(5), None)
    assert fresh.remaining(H) == 6
    assert fresh.next_begins(H, 4) == (at(0), at(1), at(2), at(3))
    half = JobRange(REPROCESS, 1, "p", at(0), at(5), at(3))
    assert half.remaining(H) == 2 and half.next_begins(H, 4) == (at(4), at(5)) and not half.finished
    done = JobRange(REPROCESS, 1, "p", at(0), at(5), at(5))
    assert done.finished and done.remaining(H) == 0 and done.next_begins(H, 4) == ()
    backwards = JobRange(REPROCESS, 1, "p", at(5), at(0), None)
    assert backwards.remaining(H) == 0 and backwards.next_begins(H, 4) == ()


def test_closed_ranges_overlap_when_they_share_an_instant_as_cloudkittys_datetimerange():
    assert overlaps(at(0), at(2), at(2), at(4))
    assert not overlaps(at(0), at(2), at(3), at(4))
    assert overlaps(at(1), at(1), at(0), at(4))


def _state(last: datetime | None) -> ScopeState:
    return ScopeState("p", "project_id", "source", "file", last, True, T0, None, None)


def test_a_backfill_carries_the_state_only_over_what_it_completed_without_a_gap():
    job = JobRange(BACKFILL, 1, "p", at(0), at(23), None)
    now = datetime(2026, 1, 20, tzinfo=UTC)  # a never-rated scope starts at the month start (Jan 1)
    assert not _continues_state(job, at(7), None, now, H)  # Jan 1 is not backfilled: keep the state
    early = JobRange(BACKFILL, 1, "p", datetime(2026, 1, 1, tzinfo=UTC), at(23), None)
    assert _continues_state(early, at(7), None, now, H)
    assert _continues_state(job, at(7), _state(at(-1)), now, H)  # follows the state
    assert _continues_state(job, at(7), _state(at(3)), now, H)  # overlaps it, moves it forward
    assert not _continues_state(job, at(7), _state(at(-3)), now, H)  # a gap at -2
    assert not _continues_state(job, at(7), _state(at(9)), now, H)  # ahead already: never back


def test_a_backfill_row_is_found_again_by_scope_and_range(engine):
    store = JobStore(engine, "project_id", "source", "file")
    first = store.backfill("p", at(0), at(24), H, T0)
    assert store.backfill("p", at(0), at(24), H, T0).id == first.id
    assert store.backfill("p", at(0), at(12), H, T0).id != first.id
    assert first.last == at(23) and first.current is None
    with engine.begin() as conn:
        assert store.advance(conn, first, at(5))
        assert not store.advance(conn, first, at(4))  # never back
    assert [j.current for j in store.backfills([first.id], H)] == [at(5)]

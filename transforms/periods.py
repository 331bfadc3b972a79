"""Which collection periods are due, with CloudKitty's alignment and waiting rules (`cloudkitty/utils/__init__.py:200-223`).

Pure functions over aware UTC datetimes, so the planner, the backfill job and the tests agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta


def require_aware(value: datetime, what: str) -> datetime:
    """Refuse naive datetimes: every timestamp in ratebeam is aware UTC."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got naive {value.isoformat()}")
    return value.astimezone(UTC)


def month_start(now: datetime) -> datetime:
    """Start of ``now``'s month in UTC: where a scope without state starts (`cloudkitty/utils/__init__.py:200-223`)."""
    now = require_aware(now, "now")
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def is_due(begin: datetime, now: datetime, period: int, wait_periods: int) -> bool:
    """CloudKitty's test for a period after the first: ``begin + wait·period < now`` (strict)."""
    return begin + timedelta(seconds=period * wait_periods) < now


def due_periods(
    last_processed: datetime | None,
    now: datetime,
    period: int,
    wait_periods: int,
    cap: int | None = None,
) -> Iterator[datetime]:
    """Begins of the periods to rate now, oldest first, at most ``cap`` of them.

    ``last_processed`` is the begin of the last committed period.  Without state the first period
    is the month start and is due at once, as in CloudKitty (no wait check on first sight); each
    later period ``p`` is due when ``p + wait_periods·period < now``.
    """
    now = require_aware(now, "now")
    step = timedelta(seconds=period)
    if last_processed is None:
        begin = month_start(now)
        first_needs_wait = False
    else:
        begin = require_aware(last_processed, "last_processed") + step
        first_needs_wait = True
    emitted = 0
    while cap is None or emitted < cap:
        if (first_needs_wait or emitted > 0) and not is_due(begin, now, period, wait_periods):
            return
        yield begin
        emitted += 1
        begin += step


def periods_left(after: datetime, now: datetime, period: int, wait_periods: int) -> int:
    """How many periods after the one beginning at ``after`` are due at ``now`` (what a cap left).

    The same test as ``due_periods`` (``begin + wait·period < now``), counted without iterating:
    a long outage can leave thousands.
    """
    step = timedelta(seconds=period)
    room = require_aware(now, "now") - timedelta(seconds=period * wait_periods) - (require_aware(after, "after") + step)
    return -(-room // step) if room > timedelta(0) else 0


def period_range(start: datetime, end: datetime, period: int) -> list[datetime]:
    """Begins of the periods in ``[start, end)``: the periods a backfill of that window rates."""
    start = require_aware(start, "start")
    end = require_aware(end, "end")
    if (end - start).total_seconds() % period or start.timestamp() % period:
        raise ValueError(f"window {start.isoformat()}..{end.isoformat()} is not aligned on {period} s")
    step = timedelta(seconds=period)
    out = []
    begin = start
    while begin < end:
        out.append(begin)
        begin += step
    return out

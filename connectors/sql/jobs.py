"""Batch jobs over explicit (scope, period) ranges: reprocessing schedules and backfills.

Both are a range of periods of one scope with a progress mark, rated by the same Beam graph as a
regular cycle (``job_transforms``); they differ in where they live and what their end means:

* a **reprocessing schedule** is a row of CloudKitty's ``storage_scope_reprocessing_schedule``
  (what ``POST /v2/task/reprocesses`` inserts): ``[start, end]`` with the end period *included*
  (`cloudkitty/orchestrator.py:527-631`), ``current_reprocess_time`` = begin of the last period re-rated, finished when
  ``current == end``.  Rows CloudKitty's API inserted are read exactly like ratebeam's own.
* a **backfill** is a row of ratebeam's ``ratebeam_backfills``: ``[start, end)`` (end excluded,
  like every ratebeam window), same progress mark.  The same command run again finds its row.

:class:`JobRange` is the one shape both take in the pipeline; ``last`` is always the begin of the
last period to rate, so the planner and the commit never care which kind they handle.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, cast

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from ratebeam.connectors.sql.engine import database_errors
from ratebeam.connectors.sql.models import Backfill, ReprocessingSchedule, StorageState
from ratebeam.transforms.periods import require_aware

Kind = Literal["reprocess", "backfill"]
REPROCESS: Kind = "reprocess"
BACKFILL: Kind = "backfill"

_R = cast(sa.Table, ReprocessingSchedule.__table__)
_B = cast(sa.Table, Backfill.__table__)
_S = cast(sa.Table, StorageState.__table__)


@dataclass(frozen=True, slots=True)
class JobRange:
    """A range of periods of one scope to rate, and how far it got."""

    kind: Kind
    id: int
    scope: str
    start: datetime
    #: Begin of the last period to rate (included).
    last: datetime
    #: Begin of the last period rated and acknowledged; None = nothing done yet.
    current: datetime | None
    reason: str = ""

    @property
    def finished(self) -> bool:
        """Every period of the range is done."""
        return self.current is not None and self.current >= self.last

    def remaining(self, period: int) -> int:
        """How many periods are left to rate."""
        step = timedelta(seconds=period)
        first = self.start if self.current is None else self.current + step
        return max(0, (self.last - first) // step + 1)

    def next_begins(self, period: int, cap: int) -> tuple[datetime, ...]:
        """Begins of the next ``cap`` periods to rate, oldest first."""
        step = timedelta(seconds=period)
        begin = self.start if self.current is None else self.current + step
        out: list[datetime] = []
        while begin <= self.last and len(out) < cap:
            out.append(begin)
            begin += step
        return tuple(out)


class JobStore:
    """Reprocessing schedules and backfills of one (scope_key, fetcher, collector)."""

    def __init__(self, engine: Engine, scope_key: str, fetcher: str, collector: str) -> None:
        self.engine = engine
        self.scope_key = scope_key
        self.fetcher = fetcher
        self.collector = collector

    def _known_scopes(self) -> sa.Select:
        """Identifiers with a state row in this store (CloudKitty's reprocessor needs one)."""
        return sa.select(_S.c.identifier).where(
            _S.c.scope_key == self.scope_key, _S.c.fetcher == self.fetcher, _S.c.collector == self.collector
        )

    # --- reprocessing schedules (CloudKitty's table) -------------------------------------------

    def schedules(self, scopes: list[str] | None = None, *, unfinished: bool = False) -> list[JobRange]:
        """Reprocessing schedules by id, of ``scopes`` (all when None); ``unfinished`` as CloudKitty's filter."""
        query = sa.select(_R).order_by(_R.c.id)
        if scopes is not None:
            query = query.where(_R.c.identifier.in_(scopes))
        if unfinished:
            query = query.where(sa.or_(_R.c.current_reprocess_time.is_(None),
                                       _R.c.current_reprocess_time < _R.c.end_reprocess_time))
        with database_errors(self.engine, "listing the reprocessing schedules"), self.engine.connect() as conn:
            return [_schedule(row) for row in conn.execute(query)]

    def pending_schedules(self) -> list[JobRange]:
        """Unfinished schedules whose scope this store knows (others belong to another collector)."""
        query = (
            sa.select(_R)
            .where(sa.or_(_R.c.current_reprocess_time.is_(None),
                          _R.c.current_reprocess_time < _R.c.end_reprocess_time),
                   _R.c.identifier.in_(self._known_scopes()))
            .order_by(_R.c.id)
        )
        with database_errors(self.engine, "reading the pending reprocessing schedules"), \
                self.engine.connect() as conn:
            return [_schedule(row) for row in conn.execute(query)]

    def add_schedules(self, scopes: list[str], start: datetime, end: datetime, reason: str) -> list[int]:
        """Insert one schedule per scope, as CloudKitty's API does (``current`` NULL); their ids."""
        start, end = require_aware(start, "start"), require_aware(end, "end")
        with database_errors(self.engine, "creating reprocessing schedules"), self.engine.begin() as conn:
            return [
                conn.execute(
                    sa.insert(_R).values(identifier=scope, reason=reason, start_reprocess_time=start,
                                         end_reprocess_time=end).returning(_R.c.id)
                ).scalar_one()
                for scope in scopes
            ]

    def cancel(self, ids: list[int] | None = None, scopes: list[str] | None = None) -> list[JobRange]:
        """Delete the unfinished schedules with these ids or of these scopes; returns them.

        CloudKitty has no cancel; deleting the row is what stops its reprocessor too.  Periods
        already re-rated stay re-rated: each one was replaced whole, so nothing is left half done.
        """
        cond = []
        if ids:
            cond.append(_R.c.id.in_(ids))
        if scopes:
            cond.append(_R.c.identifier.in_(scopes))
        if not cond:
            return []
        unfinished = sa.or_(_R.c.current_reprocess_time.is_(None),
                            _R.c.current_reprocess_time < _R.c.end_reprocess_time)
        where = sa.and_(sa.or_(*cond), unfinished)
        with database_errors(self.engine, "cancelling reprocessing schedules"), self.engine.begin() as conn:
            doomed = [_schedule(row) for row in conn.execute(sa.select(_R).where(where).order_by(_R.c.id))]
            conn.execute(sa.delete(_R).where(_R.c.id.in_([j.id for j in doomed])))
        return doomed

    # --- backfills (ratebeam's table) ----------------------------------------------------------

    def backfill(self, scope: str, start: datetime, end: datetime, period: int, now: datetime) -> JobRange:
        """The backfill of ``[start, end)`` for ``scope``: the row a former run made, else a new one."""
        start, end = require_aware(start, "start"), require_aware(end, "end")
        key = sa.and_(_B.c.identifier == scope, _B.c.scope_key == self.scope_key, _B.c.fetcher == self.fetcher,
                      _B.c.collector == self.collector, _B.c.start == start, _B.c.end == end)
        with database_errors(self.engine, f"reading the backfill of scope {scope!r}"), \
                self.engine.begin() as conn:
            row = conn.execute(sa.select(_B).where(key)).first()
            if row is None:
                conn.execute(sa.insert(_B).values(
                    identifier=scope, scope_key=self.scope_key, fetcher=self.fetcher, collector=self.collector,
                    start=start, end=end, current=None, created_at=require_aware(now, "now")))
                row = conn.execute(sa.select(_B).where(key)).one()
        return _backfill(row, period)

    def backfills(self, ids: list[int], period: int) -> list[JobRange]:
        """The backfills with these ids that are not finished."""
        with database_errors(self.engine, "reading backfills"), self.engine.connect() as conn:
            rows = conn.execute(sa.select(_B).where(_B.c.id.in_(ids)).order_by(_B.c.id))
            return [job for job in (_backfill(row, period) for row in rows) if not job.finished]

    # --- progress ------------------------------------------------------------------------------

    def advance(self, conn: Connection, job: JobRange, current: datetime) -> bool:
        """Move the job's progress forward to ``current`` (never back); True if it moved.

        Runs in the caller's transaction, which holds the scope's lease (the commit's fencing).
        """
        current = require_aware(current, "current")
        table, column = (_R, _R.c.current_reprocess_time) if job.kind == REPROCESS else (_B, _B.c.current)
        result = conn.execute(
            sa.update(table)
            .where(table.c.id == job.id, sa.or_(column.is_(None), column < current))
            .values({column.name: current})
        )
        return result.rowcount == 1


def _schedule(row: sa.Row) -> JobRange:
    return JobRange(REPROCESS, row.id, row.identifier, row.start_reprocess_time, row.end_reprocess_time,
                    row.current_reprocess_time, row.reason)


def _backfill(row: sa.Row, period: int) -> JobRange:
    return JobRange(BACKFILL, row.id, row.identifier, row.start, row.end - timedelta(seconds=period), row.current)


def overlaps(a_start: datetime, a_end: datetime, b_start: datetime, b_end: datetime) -> bool:
    """Whether two closed ranges share an instant (CloudKitty's ``DateTimeRange.is_intersection``)."""
    return a_start <= b_end and b_start <= a_end


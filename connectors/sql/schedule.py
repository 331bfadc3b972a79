"""Reprocessing schedules (CloudKitty's ``storage_scope_reprocessing_schedule``, spec §6.7).

:meth:`ScheduleRepository.add` applies the checks of CloudKitty's ``POST /v2/task/reprocesses``
in CloudKitty's order, with its messages, and creates one schedule per scope in a single
transaction (the scopes' state rows are locked while it checks, so two requests cannot both pass
the overlap check).  A schedule re-rates the periods beginning at ``start``, ``start + period``,
…, ``end``: the end bound is inclusive.  It is unfinished while ``current`` is null or before
``end``; :meth:`ScheduleRepository.set_current` records progress.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy import Engine

from ratebeam.connectors.sql.engine import database_errors, write_transaction
from ratebeam.connectors.sql.models import ReprocessingSchedule, StorageState
from ratebeam.transforms.periods import require_aware

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The ``scope_ids`` value that means every active scope.
ALL_SCOPES = "ALL"

_S = ReprocessingSchedule.__table__
_STATE = StorageState.__table__


class ScheduleError(ValueError):
    """A schedule request CloudKitty's API would refuse with 400 Bad Request."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """One reprocessing schedule of one scope; all datetimes aware UTC."""

    id: int
    scope: str
    reason: str
    start: datetime
    end: datetime  # inclusive: the period beginning at ``end`` is re-rated too
    current: datetime | None  # begin of the last re-rated period; None = not started

    @property
    def finished(self) -> bool:
        return self.current is not None and self.current >= self.end


def _unfinished() -> sa.ColumnElement[bool]:
    return sa.or_(_S.c.current_reprocess_time.is_(None), _S.c.current_reprocess_time < _S.c.end_reprocess_time)


class ScheduleRepository:
    """Schedules of the scopes of one (scope_key, fetcher, collector) state store."""

    def __init__(self, engine: Engine, scope_key: str, fetcher: str, collector: str) -> None:
        self.engine = engine
        self._states = sa.and_(
            _STATE.c.scope_key == scope_key, _STATE.c.fetcher == fetcher, _STATE.c.collector == collector
        )

    def add(self, scope_ids: Sequence[str] | str, start: datetime, end: datetime, reason: str,
            period: int) -> list[Schedule]:
        """Schedule the re-rating of ``[start, end]`` for ``scope_ids`` (or ``"ALL"`` active scopes).

        Refused with :class:`ScheduleError` when: ``ALL`` is mixed with scope ids; the reason is
        blank; ``end < start``; either bound is not aligned on ``period`` (the message suggests an
        aligned window); a scope has no active state; either bound is after a scope's
        ``last_processed_timestamp``; or the window intersects (bounds included) an unfinished
        schedule of the same scope.  ``ALL`` with no active scope creates nothing.
        """
        scopes = [scope_ids] if isinstance(scope_ids, str) else list(scope_ids)
        start = require_aware(start, "start_reprocess_time")
        end = require_aware(end, "end_reprocess_time")
        _validate_inputs(scopes, start, end, reason, period)
        every_scope = ALL_SCOPES in scopes
        with database_errors(self.engine, "scheduling a reprocessing"), write_transaction(self.engine) as conn:
            query = sa.select(_STATE.c.identifier, _STATE.c.last_processed_timestamp).where(
                self._states, _STATE.c.active.is_(True)
            )
            if not every_scope:
                query = query.where(_STATE.c.identifier.in_(scopes))
            states = conn.execute(query.order_by(_STATE.c.identifier).with_for_update()).all()
            known = {row.identifier for row in states}
            invalid = [scope for scope in scopes if scope not in known and not every_scope]
            if invalid:
                raise ScheduleError(
                    f"Scopes {invalid} scheduled to reprocess [start={start}, end={end}] do not exist."
                )
            for row in states:
                last = row.last_processed_timestamp
                if last is None or start > last:
                    raise ScheduleError(
                        f"Cannot execute a reprocessing [start={start}] for scope [{row.identifier}] "
                        f"starting after the last possible timestamp [{last}]."
                    )
                if end > last:
                    raise ScheduleError(
                        f"Cannot execute a reprocessing [end={end}] for scope [{row.identifier}] "
                        f"ending after the last possible timestamp [{last}]."
                    )
            overlapping = conn.execute(
                sa.select(_S.c.identifier, _S.c.start_reprocess_time, _S.c.end_reprocess_time)
                .where(_S.c.identifier.in_(known), _unfinished(),
                       _S.c.start_reprocess_time <= end, _S.c.end_reprocess_time >= start)
                .order_by(_S.c.id)
            ).first()
            if overlapping is not None:
                raise ScheduleError(
                    f"Cannot schedule a reprocessing for scope [{overlapping.identifier}] for reprocessing "
                    f"time [{start} - {end}], because it already has a schedule for a similar time range "
                    f"[{overlapping.start_reprocess_time} - {overlapping.end_reprocess_time}]."
                )
            created = []
            for row in states:
                schedule_id = conn.execute(
                    sa.insert(_S)
                    .values(identifier=row.identifier, reason=reason, start_reprocess_time=start,
                            end_reprocess_time=end, current_reprocess_time=None)
                    .returning(_S.c.id)
                ).scalar_one()
                created.append(Schedule(schedule_id, row.identifier, reason, start, end, None))
        return created

    def list_unfinished(self, scope_ids: Sequence[str] | None = None) -> list[Schedule]:
        """Unfinished schedules (``current`` null or before ``end``), oldest first."""
        query = sa.select(_S).where(_unfinished())
        if scope_ids is not None:
            query = query.where(_S.c.identifier.in_(list(scope_ids)))
        with database_errors(self.engine, "listing reprocessing schedules"), self.engine.connect() as conn:
            return [_schedule(row) for row in conn.execute(query.order_by(_S.c.id))]

    def set_current(self, schedule_id: int, current: datetime) -> bool:
        """Record that the period beginning at ``current`` was re-rated; False if no such schedule.

        ``current`` must lie in the schedule's ``[start, end]``; it reaching ``end`` finishes it.
        """
        current = require_aware(current, "current_reprocess_time")
        with database_errors(self.engine, f"updating reprocessing schedule {schedule_id}"), \
                self.engine.begin() as conn:
            result = conn.execute(
                sa.update(_S)
                .where(_S.c.id == schedule_id, _S.c.start_reprocess_time <= current,
                       _S.c.end_reprocess_time >= current)
                .values(current_reprocess_time=current)
            )
            if result.rowcount == 1:
                return True
            row = conn.execute(sa.select(_S).where(_S.c.id == schedule_id)).first()
        if row is None:
            return False
        schedule = _schedule(row)
        raise ScheduleError(
            f"reprocessing schedule {schedule_id}: current {current} is outside "
            f"[{schedule.start}, {schedule.end}]"
        )


def _validate_inputs(scopes: list[str], start: datetime, end: datetime, reason: str, period: int) -> None:
    """CloudKitty's ``validate_inputs`` (``api/v2/task/reprocess.py``), in its order."""
    if period <= 0:
        raise ValueError(f"period must be a positive number of seconds, got {period}")
    if not scopes:
        raise ScheduleError("scope_ids: give at least one scope id, or 'ALL'")
    if ALL_SCOPES in scopes and len(scopes) != 1:
        raise ScheduleError(
            f"Cannot use 'ALL' with scope ID [{scopes}]. Either schedule a reprocessing for all active "
            "scopes using 'ALL' option, or inform only the scopes you desire to schedule a reprocessing."
        )
    if not reason or not reason.strip():
        raise ScheduleError(
            "Empty or blank reason text is not allowed. Please, do inform/register the reason for the "
            "reprocessing of a previously processed timestamp."
        )
    if end < start:
        raise ScheduleError(
            f"End reprocessing timestamp [{end}] cannot be less than start reprocessing timestamp [{start}]."
        )
    step = timedelta(seconds=period)
    start_overflow = (start - _EPOCH) % step
    end_overflow = (end - _EPOCH) % step
    if start_overflow or end_overflow:
        valid_start = start - start_overflow
        valid_end = end - end_overflow
        if valid_start == valid_end:
            valid_end += step
        raise ScheduleError(
            "The provided reprocess time window does not comply with the configured collector period. "
            f"A valid time window near the provided one is ['{valid_start}', '{valid_end}']"
        )


def _schedule(row: sa.Row) -> Schedule:
    return Schedule(
        id=row.id,
        scope=row.identifier,
        reason=row.reason,
        start=row.start_reprocess_time,
        end=row.end_reprocess_time,
        current=row.current_reprocess_time,
    )

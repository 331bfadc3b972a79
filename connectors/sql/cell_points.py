"""How many points each committed (scope, period, metric type) cell stored, 0 included.

Written by ``CommitState`` right after it commits a scope's periods, from the writer's
acknowledgements (which count the points of each frame per type).  Without it "this period was
collected empty" cannot be told from "this period was never looked at" once the state moved past
it: ``ratebeam gaps`` reads it.  A cell rated again (after a state reset) overwrites its row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from ratebeam.connectors.sql.engine import database_errors, dialect_insert, write_transaction
from ratebeam.connectors.sql.models import CellPoints
from ratebeam.transforms.frames import FrameOutcome


class CellPointsStore:
    """Reads and writes the per-cell point counts of one database."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        insert = dialect_insert(engine)(CellPoints)
        #: Built once: the state commit of every scope runs it (building it cost more than running it).
        self._upsert = insert.on_conflict_do_update(
            index_elements=[CellPoints.scope, CellPoints.period_begin, CellPoints.type],
            set_={"points": insert.excluded.points, "recorded_at": insert.excluded.recorded_at},
        )

    def record(self, scope: str, begins: Sequence[datetime], outcomes: Iterable[FrameOutcome],
               metric_types: Sequence[str], now: datetime | None = None) -> None:
        """Store the points of every type of ``metric_types`` (and any other written) for ``begins``."""
        with database_errors(self.engine, "record cell points"), write_transaction(self.engine) as conn:
            self.record_in(conn, scope, begins, outcomes, metric_types, now)

    def record_in(self, conn: sa.Connection, scope: str, begins: Sequence[datetime],
                  outcomes: Iterable[FrameOutcome], metric_types: Sequence[str], now: datetime | None = None) -> None:
        """:meth:`record` in the caller's transaction (the state commit's: one transaction per scope)."""
        if not begins:
            return
        written: dict[datetime, dict[str, int]] = {}
        for outcome in outcomes:
            if outcome.ok:
                counts = written.setdefault(outcome.begin, {})
                for type_, points in outcome.types:
                    counts[type_] = counts.get(type_, 0) + points
        now = now or datetime.now(UTC)
        rows = [
            {"scope": scope, "period_begin": begin, "type": type_, "points": points, "recorded_at": now}
            for begin in begins
            for type_, points in ({t: 0 for t in metric_types} | written.get(begin, {})).items()
        ]
        if rows:
            conn.execute(self._upsert, rows)

    def find(self, begin: datetime, end: datetime, scopes: Sequence[str] = ()) -> Sequence[sa.Row[Any]]:
        """The recorded cells of periods in ``[begin, end)`` (of ``scopes`` when given)."""
        conditions = [CellPoints.period_begin >= begin, CellPoints.period_begin < end]
        if scopes:
            conditions.append(CellPoints.scope.in_(scopes))
        query = sa.select(CellPoints).where(*conditions).order_by(CellPoints.scope, CellPoints.period_begin,
                                                                 CellPoints.type)
        with database_errors(self.engine, "read cell points"), self.engine.connect() as conn:
            return conn.execute(query).all()

"""The pipeline's dead letters, kept in SQL: one row per failed frame, until a later run rates it.

Workers (on Flink as on the DirectRunner) write failed frames here; the launcher reads them back
by run id after the pipeline finished — the portable way to bring results home from a runner —
and ``ratebeam failures`` lists, shows and clears them.  A frame that fails again updates its row
(count, last reason, last seen) instead of adding one, so a scope stuck on a bad rule does not grow
the table at every run; once its scope's state is committed past the frame, the row is marked
resolved (``resolved_at``) and stays for the record until cleared.

The event stream's messages that could not be read (not JSON, no ``message_id``...) are dead
letters too, of another kind: one row per message body (``ratebeam_message_dead_letters``),
written with the inbox in one transaction (``connectors.notifications.inbox``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import apache_beam as beam
import sqlalchemy as sa

from ratebeam.connectors.sql.engine import database_errors, dialect_insert, make_engine, write_transaction
from ratebeam.connectors.sql.models import DeadLetter, MessageDeadLetter
from ratebeam.transforms.frames import FrameOutcome


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters a listing or a clear is about: all by default."""

    scopes: tuple[str, ...] = ()
    #: Only those whose last failure is at or after this instant.
    since: datetime | None = None
    #: Only the unresolved ones (the frames that still fail).
    unresolved: bool = False
    #: Only the resolved ones (rated by a later run).
    resolved: bool = False
    ids: tuple[int, ...] = ()

    def where(self) -> list[sa.ColumnElement[bool]]:
        """The SQL conditions of this filter."""
        conditions: list[sa.ColumnElement[bool]] = []
        if self.scopes:
            conditions.append(DeadLetter.scope.in_(self.scopes))
        if self.since is not None:
            conditions.append(DeadLetter.last_seen_at >= self.since)
        if self.unresolved:
            conditions.append(DeadLetter.resolved_at.is_(None))
        if self.resolved:
            conditions.append(DeadLetter.resolved_at.is_not(None))
        if self.ids:
            conditions.append(DeadLetter.id.in_(self.ids))
        return conditions


class DeadLetterStore:
    """Reads and writes dead letters of one database."""

    def __init__(self, database_url: str) -> None:
        self.engine = make_engine(database_url)
        #: Built once: every scope of every cycle asks it (building it cost more than running it).
        self._open_up_to = sa.select(DeadLetter.id).where(
            DeadLetter.scope == sa.bindparam("scope"), DeadLetter.period_begin <= sa.bindparam("committed"),
            DeadLetter.resolved_at.is_(None),
        ).limit(1)

    def add(self, run_id: str, failures: list[FrameOutcome], now: datetime | None = None) -> None:
        """Record the failed frames of run ``run_id`` in one transaction: one row per frame."""
        if not failures:
            return
        now = now or datetime.now(UTC)
        latest = {f.frame: f for f in failures}  # a frame is one row, even if reported twice
        rows = [
            {"run_id": run_id, "scope": f.scope_id, "period_begin": f.begin, "stage": f.stage,
             "reason": f.reason, "created_at": now, "last_seen_at": now, "failures": 1}
            for f in latest.values()
        ]
        insert = dialect_insert(self.engine)(DeadLetter)
        upsert = insert.on_conflict_do_update(
            index_elements=[DeadLetter.scope, DeadLetter.period_begin],
            set_={"run_id": insert.excluded.run_id, "stage": insert.excluded.stage,
                  "reason": insert.excluded.reason, "last_seen_at": insert.excluded.last_seen_at,
                  "failures": DeadLetter.failures + 1, "resolved_at": None},
        )
        with database_errors(self.engine, "record dead letters"), write_transaction(self.engine) as conn:
            conn.execute(upsert, rows)

    def resolve(self, scope: str, committed: datetime, now: datetime | None = None) -> int:
        """Mark resolved the open dead letters of ``scope`` up to its ``committed`` period; returns how many.

        Looks first, outside any write transaction: most scopes have none, and a write
        transaction per scope (the write lock, a commit) cost more than the rest of its commit.
        """
        with database_errors(self.engine, "resolve dead letters"), self.engine.connect() as conn:
            if conn.execute(self._open_up_to, {"scope": scope, "committed": committed}).first() is None:
                return 0
        update = (sa.update(DeadLetter)
                  .where(DeadLetter.scope == scope, DeadLetter.period_begin <= committed,
                         DeadLetter.resolved_at.is_(None))
                  .values(resolved_at=now or datetime.now(UTC)))
        with database_errors(self.engine, "resolve dead letters"), write_transaction(self.engine) as conn:
            return conn.execute(update).rowcount

    def for_run(self, run_id: str) -> list[FrameOutcome]:
        """The failed frames of run ``run_id``, by scope and period."""
        query = sa.select(DeadLetter).where(DeadLetter.run_id == run_id, DeadLetter.resolved_at.is_(None)).order_by(
            DeadLetter.scope, DeadLetter.period_begin
        )
        with self.engine.connect() as conn:
            return [
                FrameOutcome(r.scope, r.period_begin, False, r.stage, r.reason)
                for r in conn.execute(query)
            ]

    def find(self, selection: DeadLetterFilter, begin: datetime | None = None,
             end: datetime | None = None) -> Sequence[sa.Row[Any]]:
        """The dead letters ``selection`` names (periods in ``[begin, end)`` when given), oldest period first."""
        conditions = selection.where()
        if begin is not None:
            conditions.append(DeadLetter.period_begin >= begin)
        if end is not None:
            conditions.append(DeadLetter.period_begin < end)
        query = sa.select(DeadLetter).where(*conditions).order_by(DeadLetter.scope, DeadLetter.period_begin)
        with database_errors(self.engine, "read dead letters"), self.engine.connect() as conn:
            return conn.execute(query).all()

    def clear(self, selection: DeadLetterFilter) -> int:
        """Delete the dead letters ``selection`` names; returns how many."""
        with database_errors(self.engine, "clear dead letters"), write_transaction(self.engine) as conn:
            return conn.execute(sa.delete(DeadLetter).where(*selection.where())).rowcount


def resolve_frames(conn: sa.Connection, scope: str, begins: Sequence[datetime], now: datetime | None = None) -> int:
    """Mark resolved the open dead letters of ``scope``'s periods ``begins``; returns how many.

    For a reprocessing or backfill job that has just re-rated those periods: it runs in the job
    commit's transaction, so a dead letter closes exactly when the job's progress moves over it.
    """
    if not begins:
        return 0
    update = (sa.update(DeadLetter)
              .where(DeadLetter.scope == scope, DeadLetter.period_begin.in_(list(begins)),
                     DeadLetter.resolved_at.is_(None))
              .values(resolved_at=now or datetime.now(UTC)))
    return conn.execute(update).rowcount


def message_dead_letters_upsert(engine: sa.Engine) -> sa.Insert:
    """The statement recording unreadable messages: a body seen before adds its deliveries to the count."""
    insert = dialect_insert(engine)(MessageDeadLetter)
    return insert.on_conflict_do_update(
        index_elements=[MessageDeadLetter.digest],
        set_={"reason": insert.excluded.reason, "received_at": insert.excluded.received_at,
              "failures": MessageDeadLetter.failures + insert.excluded.failures},
    )


def message_dead_letters(engine: sa.Engine, since: datetime | None = None,
                         digests: Sequence[str] = ()) -> Sequence[sa.Row[Any]]:
    """The unreadable messages, oldest first: received at or after ``since``, or whose digest starts with one of ``digests``."""
    query = sa.select(MessageDeadLetter).where(*_message_filter(since, digests))
    query = query.order_by(MessageDeadLetter.received_at, MessageDeadLetter.digest)
    with database_errors(engine, "read message dead letters"), engine.connect() as conn:
        return conn.execute(query).all()


def clear_message_dead_letters(engine: sa.Engine, digests: Sequence[str]) -> int:
    """Delete the message dead letters of these whole digests; returns how many."""
    if not digests:
        return 0
    with database_errors(engine, "clear message dead letters"), write_transaction(engine) as conn:
        return conn.execute(sa.delete(MessageDeadLetter).where(MessageDeadLetter.digest.in_(list(digests)))).rowcount


def _message_filter(since: datetime | None, digests: Sequence[str]) -> list[sa.ColumnElement[bool]]:
    conditions: list[sa.ColumnElement[bool]] = []
    if since is not None:
        conditions.append(MessageDeadLetter.received_at >= since)
    if digests:
        conditions.append(sa.or_(*(MessageDeadLetter.digest.startswith(d, autoescape=True) for d in digests)))
    return conditions


class _WriteDeadLettersFn(beam.DoFn):
    def __init__(self, database_url: str, run_id: str) -> None:
        self._url = database_url
        self._run_id = run_id

    def setup(self) -> None:
        self._store = DeadLetterStore(self._url)

    def process(self, result: tuple):
        scope, last, failures = result
        if last is not None:  # committed up to ``last``: every frame up to it was rated after all
            self._store.resolve(scope, last)
        self._store.add(self._run_id, failures)

    def teardown(self) -> None:
        store = getattr(self, "_store", None)
        if store is not None:
            store.engine.dispose()


class WriteDeadLetters(beam.PTransform):
    """CommitState's per-scope results → their failures stored under the run id, older ones resolved."""

    def __init__(self, database_url: str, run_id: str) -> None:
        super().__init__()
        self._url = database_url
        self._run_id = run_id

    def expand(self, results: beam.PCollection) -> beam.PCollection:
        """Write the failed outcomes of ``results`` under this run's id."""
        return results | beam.ParDo(_WriteDeadLettersFn(self._url, self._run_id))

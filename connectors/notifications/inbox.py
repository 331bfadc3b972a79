"""The durable inbox of the event stream: notifications in SQL before they are acknowledged.

Why a table and not only Beam state: a portable runner (Prism here) keeps no state across a job's
death, and the broker forgets a message once it is acknowledged.  So every delivery is written
here first — in one transaction with the dead letters of the messages that could not be read —
and acknowledged after the commit.  ``message_id`` is the key: a duplicate changes nothing.

The streaming job then reads the rows back (:meth:`Inbox.take`): a new job (a restart) reads every
row not finished, so the trigger instances still open are rebuilt in its Beam state from their
events.  A row is finished when the frame its usage went into is stored (:meth:`Inbox.commit_frame`),
when no trigger wants it, or when it came late (:meth:`Inbox.late`, kept for the reprocessing job).
"""

from __future__ import annotations

import hashlib
import json
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import sqlalchemy as sa

from ratebeam.connectors.notifications.client import NotificationConsumer
from ratebeam.connectors.notifications.envelope import Rejected, parse
from ratebeam.connectors.sql.dead_letters import message_dead_letters_upsert
from ratebeam.connectors.sql.engine import database_errors, dialect_insert, make_engine, write_transaction
from ratebeam.connectors.sql.models import EventConsumer, EventFrame, EventInbox
from ratebeam.transforms.events.model import Notification


@dataclass(frozen=True)
class Recorded:
    """What one :meth:`Inbox.record` did: new rows, duplicates ignored, dead letters; ``drained``: see :meth:`Inbox.drain`."""

    new: int
    duplicates: int
    rejected: int
    drained: bool = False
    #: The latest ``generated`` time among the notifications it recorded or found recorded (None: none).
    latest: datetime | None = None


#: Notifications an inbox keeps parsed between recording and taking them (``Inbox._recorded``).
RECORDED_KEPT = 100_000
#: Seconds between two reads of the table by an unsharded job that hands its own rows on directly
#: (``Inbox.take``): rows another process recorded meanwhile (a job being replaced) are read then.
RECHECK_SECONDS = 5.0
#: A sharded job whose heartbeat is older than this is dead: its row no longer holds the others' event time
#: (the broker gave its unacknowledged messages back to the queue when its connection closed).
CONSUMER_STALE = timedelta(seconds=60)
#: Rows of jobs dead for this long are deleted.
CONSUMER_FORGOTTEN = timedelta(days=1)


def scope_hash(scope: str) -> int:
    """The stable hash of a scope that picks its shard (CRC-32: the same in every process, unlike ``hash``)."""
    return zlib.crc32(scope.encode())


class Inbox:
    """The inbox, stored-frame and message dead-letter tables of one database.

    ``scope_of``: the scope a notification is billed to (``''``: none), stored with it so that a
    sharded job takes only its scopes' rows (``events.job.EventJob.scope_of``); without it the
    rows are recorded without a scope (an unsharded job, the reading tests and tools).  ``shard``:
    the (K, N) of the job reading this inbox: it takes only that shard's rows, and keeps parsed the
    notifications of that shard it recorded.
    """

    def __init__(self, database_url: str, scope_of: Callable[[Notification], str] | None = None,
                 shard: tuple[int, int] = (0, 1)) -> None:
        self.engine = make_engine(database_url)
        self._scope_of = scope_of
        self._shard = shard
        #: The notifications of its shard this inbox recorded and has not taken yet, as parsed from the
        #: bus: ``take`` hands them on instead of reading their bodies back and parsing them again (the
        #: same values: a body is the JSON of what was parsed).  Bounded: past it, bodies are read again.
        self._recorded: dict[str, Notification] = {}
        #: The job whose every unread row was in hand at its last read of the table (an unsharded job only),
        #: and when it reads the table again: until then it records its rows as read by it and takes them
        #: from ``_fresh`` without a query (``take``).
        self._reading: str | None = None
        self._recheck = 0.0
        self._fresh: list[Notification] = []

    def record(self, messages: Sequence[tuple[bytes, Notification | Rejected]], now: datetime | None = None) -> Recorded:
        """Store the notifications (a known ``message_id`` is skipped) and the rejected messages, in one transaction."""
        now = now or datetime.now(UTC)
        parsed = {n.message_id: n for _, n in messages if isinstance(n, Notification)}
        rows = {key: self._row(n, now, self._reading) for key, n in parsed.items()}
        rejected = [(body, r) for body, r in messages if isinstance(r, Rejected)]
        fresh: list[str] = []
        with database_errors(self.engine, "record notifications"), write_transaction(self.engine) as conn:
            if rows:
                insert = dialect_insert(self.engine)(EventInbox).on_conflict_do_nothing(
                    index_elements=[EventInbox.message_id])
                known = set(conn.execute(sa.select(EventInbox.message_id)
                                         .where(EventInbox.message_id.in_(list(rows)))).scalars())
                fresh = [key for key in rows if key not in known]
                if fresh:
                    conn.execute(insert, [rows[key] for key in fresh])
            if rejected:  # a body delivered twice in one batch is one row with two failures
                digests = [hashlib.sha256(body).hexdigest() for body, _ in rejected]
                counts = Counter(digests)
                letters = {d: (body, r) for d, (body, r) in zip(digests, rejected, strict=True)}
                conn.execute(message_dead_letters_upsert(self.engine), [
                    {"digest": d, "message_id": r.message_id, "reason": r.reason, "received_at": now,
                     "body": body.decode("utf-8", "replace"), "failures": counts[d]}
                    for d, (body, r) in letters.items()])
        if self._reading is not None:  # recorded as read by that job: handed on by its next take
            self._fresh += (parsed[key] for key in fresh)
        else:
            if len(self._recorded) + len(fresh) > RECORDED_KEPT:
                self._recorded.clear()
            index, count = self._shard
            for key in fresh:  # committed: those of this inbox's shard (as ``take`` picks them) now theirs to hand on
                if (cast(int | None, rows[key]["scope_hash"]) or 0) % count == index:
                    self._recorded[key] = parsed[key]
        notifications = sum(isinstance(n, Notification) for _, n in messages)
        latest = max((n.timestamp for n in parsed.values()), default=None)
        return Recorded(len(fresh), notifications - len(fresh), len(rejected), latest=latest)

    def drain(self, consumer: NotificationConsumer, wait: float) -> Recorded:
        """What ``consumer`` delivers within ``wait`` seconds, recorded, then acknowledged (in that order).

        ``drained`` in the result: the queue had nothing more ready (``NotificationConsumer.drained``).
        """
        deliveries = consumer.receive(wait)
        recorded = self.record([(d.body, parse(d.body)) for d in deliveries])
        consumer.ack()
        return replace(recorded, drained=consumer.drained)

    def take(self, run_id: str, limit: int) -> list[Notification]:
        """Up to ``limit`` unfinished notifications job ``run_id`` has not read yet, oldest first; now read by it.

        Only those of this inbox's shard (K, N): whose scope hash is K modulo N (no scope: hash 0).  Rows
        recorded without a scope get theirs first (when this inbox has ``scope_of``).  The rows this
        inbox recorded are handed on as parsed then; only the others' bodies are read and parsed.

        An unsharded job whose read found fewer than ``limit`` rows has every unread row in hand: from
        then on this inbox records its rows as read by that job, and ``take`` hands them on without a
        query (the SELECT and UPDATE over the unfinished rows were a fifth of the source's time in a
        drain), reading the table again every :data:`RECHECK_SECONDS` for rows another process
        recorded (a job being replaced).  No other process records the rows of an unsharded job's
        inbox while it runs; a sharded job's rows are recorded by every shard's job, so it always reads.
        """
        if self._reading != run_id:
            self._reading, self._fresh = None, []
        elif time.monotonic() < self._recheck:
            handed, self._fresh = self._fresh, []
            return sorted(handed, key=_order)
        unread = sa.and_(EventInbox.finished_at.is_(None),
                         sa.or_(EventInbox.emitted_run.is_(None), EventInbox.emitted_run != run_id))
        index, count = self._shard
        if count > 1:
            unread = sa.and_(unread, sa.func.coalesce(EventInbox.scope_hash, 0) % count == index)
        heads = [c for c in EventInbox.__table__.c if c.name != "body"]
        query = sa.select(*heads).where(unread).order_by(EventInbox.generated, EventInbox.message_id).limit(limit)
        with database_errors(self.engine, "read the inbox"), write_transaction(self.engine) as conn:
            self._assign_scopes(conn)
            rows = conn.execute(query).all()
            ids = [r.message_id for r in rows]
            if ids:
                conn.execute(sa.update(EventInbox).where(EventInbox.message_id.in_(ids)).values(emitted_run=run_id))
            unknown = [key for key in ids if key not in self._recorded]
            bodies = {key: body for key, body in conn.execute(
                sa.select(EventInbox.message_id, EventInbox.body).where(EventInbox.message_id.in_(unknown)))
            } if unknown else {}
        taken = [self._recorded.pop(r.message_id) if r.message_id in self._recorded
                 else _notification(r, bodies[r.message_id]) for r in rows]
        if count == 1 and len(rows) < limit:
            self._reading, self._recheck = run_id, time.monotonic() + RECHECK_SECONDS
            handed, self._fresh = self._fresh, []
            return sorted([*taken, *handed], key=_order) if handed else taken
        self._reading = None
        return taken

    def _assign_scopes(self, conn: sa.Connection) -> None:
        """The scope of the unfinished rows recorded without one (before revision 0009, or by a tool)."""
        if self._scope_of is None:
            return
        query = sa.select(EventInbox).where(EventInbox.finished_at.is_(None), EventInbox.scope_hash.is_(None))
        for row in conn.execute(query).all():
            scope = self._scope_of(_notification(row))
            conn.execute(sa.update(EventInbox).where(EventInbox.message_id == row.message_id)
                         .values(scope=scope, scope_hash=scope_hash(scope)))

    def _row(self, n: Notification, now: datetime, read_by: str | None) -> dict[str, object]:
        scope = None if self._scope_of is None else self._scope_of(n)
        return {"message_id": n.message_id, "event_type": n.event_type, "publisher_id": n.publisher_id,
                "priority": n.priority, "generated": n.timestamp, "received_at": now, "emitted_run": read_by,
                "body": json.dumps({"payload": n.payload, "ctxt": n.ctxt}, default=str, sort_keys=True),
                "scope": scope, "scope_hash": None if scope is None else scope_hash(scope)}

    def consumers_low(self, run_id: str, holding_from: datetime | None, now: datetime) -> datetime | None:
        """Report this sharded job's progress on the shared queue; the time no shard job's event time may pass.

        ``holding_from``: the latest ``generated`` among the notifications it recorded at its last poll,
        when that poll left messages on the queue (``None``: it found the queue drained, it holds none).
        Every message delivered to a job and not recorded yet comes after those it recorded in the queue
        (the broker delivers in queue order), so the earliest ``holding_from`` of the jobs alive (a
        heartbeat within ``CONSUMER_STALE``) bounds what any of them may still record.  ``None``: no bound.
        """
        shard = f"{self._shard[0]}/{self._shard[1]}"
        row = {"run_id": run_id, "shard": shard, "recorded_through": holding_from, "heartbeat": now}
        upsert = dialect_insert(self.engine)(EventConsumer).values(row).on_conflict_do_update(
            index_elements=[EventConsumer.run_id], set_={k: v for k, v in row.items() if k != "run_id"})
        with database_errors(self.engine, "report the queue's consumers"), write_transaction(self.engine) as conn:
            conn.execute(upsert)
            conn.execute(sa.delete(EventConsumer).where(EventConsumer.heartbeat < now - CONSUMER_FORGOTTEN))
            return conn.execute(sa.select(sa.func.min(EventConsumer.recorded_through)).where(
                EventConsumer.heartbeat >= now - CONSUMER_STALE)).scalar()

    def leave(self, run_id: str) -> None:
        """This job stops reading the shared queue: its row no longer bounds the others' event time."""
        with database_errors(self.engine, "report the queue's consumers"), write_transaction(self.engine) as conn:
            conn.execute(sa.delete(EventConsumer).where(EventConsumer.run_id == run_id))

    def history(self, until: datetime, after: tuple[datetime, str] | None, limit: int) -> list[Notification]:
        """What the reprocessing replays (``pipelines.events.replay``): every notification up to ``until``.

        Finished or not, late ones included; oldest first, up to ``limit`` after ``after`` (the last
        (time, message id) of the previous page).
        """
        query = sa.select(EventInbox).where(EventInbox.generated <= until)
        if after is not None:
            at, message_id = after
            query = query.where(sa.or_(EventInbox.generated > at,
                                       sa.and_(EventInbox.generated == at, EventInbox.message_id > message_id)))
        query = query.order_by(EventInbox.generated, EventInbox.message_id).limit(limit)
        with database_errors(self.engine, "read the inbox"), self.engine.connect() as conn:
            return [_notification(r) for r in conn.execute(query)]

    def history_counts(self, until: datetime) -> tuple[int, int]:
        """How many notifications :meth:`history` has up to ``until``, and how many of them the stream recorded late."""
        query = sa.select(sa.func.count(), sa.func.count(EventInbox.late_at)).where(EventInbox.generated <= until)
        with database_errors(self.engine, "read the inbox"), self.engine.connect() as conn:
            total, late = conn.execute(query).one()
        return int(total), int(late)

    def finish(self, message_ids: Iterable[str], now: datetime | None = None) -> None:
        """Mark finished notifications that need no frame (no trigger wants them, or they could not be converted)."""
        ids = list(message_ids)
        if ids:
            with database_errors(self.engine, "finish notifications"), write_transaction(self.engine) as conn:
                conn.execute(sa.update(EventInbox).where(EventInbox.message_id.in_(ids), EventInbox.finished_at.is_(None))
                             .values(finished_at=now or datetime.now(UTC)))

    def reject(self, message_id: str, reason: str, now: datetime | None = None) -> None:
        """A recorded notification the event definitions cannot convert: a dead letter with the reason, finished."""
        now = now or datetime.now(UTC)
        with database_errors(self.engine, "record a dead letter"), write_transaction(self.engine) as conn:
            body = conn.execute(sa.select(EventInbox.body).where(EventInbox.message_id == message_id)).scalar()
            conn.execute(message_dead_letters_upsert(self.engine), [{
                "digest": hashlib.sha256(message_id.encode()).hexdigest(), "message_id": message_id,
                "reason": reason, "body": body or "", "received_at": now, "failures": 1}])
            conn.execute(sa.update(EventInbox).where(EventInbox.message_id == message_id).values(finished_at=now))

    def late(self, message_id: str, reason: str, now: datetime | None = None) -> None:
        """Record a notification that came after its trigger's ``fire_delay`` (left out of the usage), finished."""
        now = now or datetime.now(UTC)
        with database_errors(self.engine, "record a late notification"), write_transaction(self.engine) as conn:
            conn.execute(sa.update(EventInbox).where(EventInbox.message_id == message_id)
                         .values(late_at=now, late_reason=reason, finished_at=now))

    def await_frame(self, message_ids: Iterable[str], scope: str, begin: datetime) -> None:
        """The notifications ``message_ids`` are finished when frame (``scope``, ``begin``) is stored."""
        ids = list(message_ids)
        if ids:
            with database_errors(self.engine, "note the frame of notifications"), write_transaction(self.engine) as conn:
                conn.execute(sa.update(EventInbox).where(EventInbox.message_id.in_(ids))
                             .values(finish_scope=scope, finish_period=begin))

    def frame_stored(self, scope: str, begin: datetime) -> bool:
        """Whether the stream already stored frame (``scope``, ``begin``) (a restarted job must not replace it)."""
        query = sa.select(EventFrame.points).where(EventFrame.scope == scope, EventFrame.period_begin == begin)
        with database_errors(self.engine, "read the stored frames"), self.engine.connect() as conn:
            return conn.execute(query).first() is not None

    def commit_frame(self, scope: str, begin: datetime, points: int, now: datetime | None = None) -> int:
        """Frame (``scope``, ``begin``) is stored: record it and finish its notifications; returns how many."""
        now = now or datetime.now(UTC)
        insert = dialect_insert(self.engine)(EventFrame).values(
            scope=scope, period_begin=begin, points=points, committed_at=now)
        with database_errors(self.engine, "commit a frame"), write_transaction(self.engine) as conn:
            conn.execute(insert.on_conflict_do_nothing(index_elements=[EventFrame.scope, EventFrame.period_begin]))
            return conn.execute(sa.update(EventInbox).where(
                EventInbox.finish_scope == scope, EventInbox.finish_period == begin, EventInbox.finished_at.is_(None),
            ).values(finished_at=now)).rowcount


def _order(n: Notification) -> tuple[datetime, str]:
    """The inbox's reading order: oldest first, then by message id."""
    return n.timestamp, n.message_id


def _notification(row: sa.Row[Any], text: str | None = None) -> Notification:
    """The notification of an inbox row (``text``: its body, when the row was read without it)."""
    body = json.loads(row.body if text is None else text)
    return Notification(message_id=row.message_id, event_type=row.event_type, publisher_id=row.publisher_id,
                        timestamp=row.generated, priority=row.priority, payload=body["payload"], ctxt=body["ctxt"])

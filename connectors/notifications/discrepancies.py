"""The event stream's discrepancies, kept in SQL: reported, not hidden.

The lifecycle pipeline (``transforms.events.lifecycle``) finds where the stream and Nova's audit
(``compute.instance.exists``) disagree, or what the stream lacks (a start never seen).  A log line
is lost with the worker's log; a row here is listed by ``ratebeam events discrepancies``.

The lifecycle is computed again from the instance's events at every period close, so the same
finding comes back every period: it is one row, keyed by (trigger, instance key, kind, message
id), whose ``last_seen_at``, ``detail`` and ``run_id`` move, and :meth:`DiscrepancyStore.record`
says how many were new, so the caller counts and logs only those.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa

from ratebeam.connectors.sql.engine import database_errors, dialect_insert, make_engine, write_transaction
from ratebeam.connectors.sql.models import EventDiscrepancy
from ratebeam.transforms.events.reconcile import Discrepancy


@dataclass(frozen=True)
class DiscrepancyRow:
    """One stored discrepancy: the finding (its latest ``detail``) and when it was first and last found."""

    trigger: str
    instance_key: str
    kind: str
    message_id: str
    resource_id: str
    scope: str | None
    detail: str
    first_seen_at: datetime
    last_seen_at: datetime
    run_id: str


class DiscrepancyStore:
    """Records and lists the discrepancies of one database."""

    def __init__(self, database_url: str) -> None:
        self.engine = make_engine(database_url)

    def record(self, trigger: str, instance_key: str, found: Sequence[Discrepancy], run_id: str = "",
               now: datetime | None = None) -> list[Discrepancy]:
        """Store what one lifecycle computation of an instance found, in one transaction; returns the new findings.

        A finding already stored keeps its ``first_seen_at`` and gets this call's ``detail``,
        labels, ``run_id`` and ``now`` as ``last_seen_at``.  Findings of one call with the same
        key (two segments without a quantity, both named by the first event) are one row whose
        detail joins theirs.
        """
        if not found:
            return []
        now = now or datetime.now(UTC)
        latest: dict[tuple[str, str], Discrepancy] = {}
        details: dict[tuple[str, str], dict[str, None]] = {}  # an ordered set per key
        for d in found:
            latest[(d.kind, d.message_id)] = d
            details.setdefault((d.kind, d.message_id), {})[d.detail] = None
        rows = [{"trigger": trigger, "instance_key": instance_key, "kind": d.kind, "message_id": d.message_id,
                 "resource_id": d.resource_id, "scope": d.scope_id, "detail": "; ".join(details[key]),
                 "first_seen_at": now, "last_seen_at": now, "run_id": run_id} for key, d in latest.items()]
        insert = dialect_insert(self.engine)(EventDiscrepancy)
        upsert = insert.on_conflict_do_update(
            index_elements=[EventDiscrepancy.trigger, EventDiscrepancy.instance_key, EventDiscrepancy.kind,
                            EventDiscrepancy.message_id],
            set_={name: insert.excluded[name] for name in ("resource_id", "scope", "detail", "last_seen_at", "run_id")},
        )
        known = sa.select(EventDiscrepancy.kind, EventDiscrepancy.message_id).where(
            EventDiscrepancy.trigger == trigger, EventDiscrepancy.instance_key == instance_key)
        with database_errors(self.engine, "record discrepancies"), write_transaction(self.engine) as conn:
            stored = {(r.kind, r.message_id) for r in conn.execute(known)}
            conn.execute(upsert, rows)
        return [d for key, d in latest.items() if key not in stored]

    def listing(self, scope: str | None = None, kind: str | None = None,
                since: datetime | None = None) -> list[DiscrepancyRow]:
        """The discrepancies of ``scope``, of ``kind``, last found at or after ``since`` (each when given), oldest first."""
        conditions: list[sa.ColumnElement[bool]] = []
        if scope is not None:
            conditions.append(EventDiscrepancy.scope == scope)
        if kind is not None:
            conditions.append(EventDiscrepancy.kind == kind)
        if since is not None:
            conditions.append(EventDiscrepancy.last_seen_at >= since)
        query = sa.select(EventDiscrepancy).where(*conditions).order_by(
            EventDiscrepancy.first_seen_at, EventDiscrepancy.trigger, EventDiscrepancy.instance_key,
            EventDiscrepancy.kind, EventDiscrepancy.message_id)
        with database_errors(self.engine, "read discrepancies"), self.engine.connect() as conn:
            return [DiscrepancyRow(**r._asdict()) for r in conn.execute(query)]  # its fields are the columns

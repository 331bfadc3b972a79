"""The scope state (CloudKitty's ``cloudkitty_storage_states``) with a lease per scope.

CloudKitty serializes work on a scope with a tooz lock; ratebeam keeps the lock in the state row
itself (``lease_owner``, ``lease_expires_at``), so it needs nothing but the database and works the
same on SQLite and PostgreSQL:

* :meth:`StateStore.acquire` is one atomic conditional ``UPDATE ... RETURNING``: the lease is
  taken only if it is free, expired, or already ours; a lease held by a *dead process of this
  host* (owner ``"<host>:<pid>:<run id>"``, see :func:`make_owner`) is taken over with a
  compare-and-swap on that exact owner.  Two concurrent runs can therefore never both hold a scope.
  The state (``last_processed``, ``active``) is the one returned by that UPDATE, i.e. read after
  the lease was taken, so nobody can have moved it in between.
* :meth:`StateStore.commit` is fenced: it advances ``last_processed_timestamp`` only while the
  caller still holds the lease, and only forward, so a run that lost its lease (expired and taken
  over, or revoked by :meth:`StateStore.reset`) cannot move the state back or skip periods.

Rows are keyed like CloudKitty's (identifier, scope_key, fetcher, collector); a legacy row with
null scope_key/fetcher/collector is adopted on first use, as CloudKitty does.  Timestamps are
aware UTC in Python, naive UTC in the database.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import cast

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from ratebeam.connectors.sql.engine import database_errors, dialect_insert
from ratebeam.connectors.sql.models import StorageState
from ratebeam.transforms.periods import require_aware


def make_owner(run_id: str) -> str:
    """The lease owner of this process for run ``run_id``: ``"<host>:<pid>:<run id>"``."""
    if not run_id:
        raise ValueError("run id: must not be empty")
    return f"{socket.gethostname()}:{os.getpid()}:{run_id}"


def owner_is_dead(owner: str) -> bool:
    """True only when ``owner`` names a process of this host that no longer runs (or is a zombie).

    Anything else — another host, an owner not made by :func:`make_owner`, a process we may not
    signal — counts as alive: a lease is only stolen from a holder known to be gone.
    """
    host, _, rest = owner.partition(":")
    pid_text, _, _run = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit() or int(pid_text) <= 0:
        return False
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            state = stat.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("Z", "X")


@dataclass(frozen=True, slots=True)
class ScopeLease:
    """A lease taken on a scope, and the scope's state read after taking it."""

    scope: str
    owner: str
    expires_at: datetime
    last_processed: datetime | None  # begin of the last committed period; None = never rated
    active: bool


@dataclass(frozen=True, slots=True)
class ScopeState:
    """One row of the state table, as :meth:`StateStore.list_states` returns it."""

    scope: str
    scope_key: str | None
    fetcher: str | None
    collector: str | None
    last_processed: datetime | None
    active: bool
    activation_toggled_at: datetime
    lease_owner: str | None
    lease_expires_at: datetime | None


#: SQLAlchemy types ``__table__`` as any ``FromClause``; a declarative model's is its ``Table``.
_T = cast(sa.Table, StorageState.__table__)
_RETURNED = (_T.c.last_processed_timestamp, _T.c.active)


class StateStore:
    """Scope states and leases of one (scope_key, fetcher, collector), like CloudKitty's keys."""

    def __init__(self, engine: Engine, scope_key: str, fetcher: str, collector: str) -> None:
        self.engine = engine
        self.scope_key = scope_key
        self.fetcher = fetcher
        self.collector = collector

    def _rows(self) -> sa.ColumnElement[bool]:
        """The rows of this store's (scope_key, fetcher, collector)."""
        return sa.and_(_T.c.scope_key == self.scope_key, _T.c.fetcher == self.fetcher, _T.c.collector == self.collector)

    def _key(self, scope: str) -> sa.ColumnElement[bool]:
        return sa.and_(_T.c.identifier == scope, self._rows())

    # --- lease ---------------------------------------------------------------------------------

    def acquire(self, scope: str, owner: str, ttl_s: float, now: datetime) -> ScopeLease | None:
        """Take (or renew) the lease on ``scope`` until ``now + ttl_s``; None if another run holds it.

        Taken if free, expired, already held by ``owner``, or held by a dead process of this
        host.  The row is created first when the scope has none (never rated: ``last_processed``
        None, active).
        """
        now = require_aware(now, "now")
        if ttl_s <= 0:
            raise ValueError(f"lease ttl must be positive, got {ttl_s}")
        expires = now + timedelta(seconds=ttl_s)
        free = sa.or_(
            _T.c.lease_owner.is_(None),
            _T.c.lease_owner == owner,
            _T.c.lease_expires_at.is_(None),
            _T.c.lease_expires_at <= now,
        )
        with database_errors(self.engine, f"taking the lease on scope {scope!r}"):
            row = self._take(scope, owner, expires, free)
            if row is None:
                holder = self._holder(scope)
                if holder is None:  # no row yet: create it, then try again
                    self._create(scope, now)
                    row = self._take(scope, owner, expires, free)
                elif owner_is_dead(holder):
                    row = self._take(scope, owner, expires, _T.c.lease_owner == holder)
        if row is None:
            return None
        return ScopeLease(scope, owner, expires, row.last_processed_timestamp, bool(row.active))

    def _take(self, scope: str, owner: str, expires: datetime, condition: sa.ColumnElement[bool]):
        with self.engine.begin() as conn:
            return conn.execute(
                sa.update(_T)
                .where(self._key(scope), condition)
                .values(lease_owner=owner, lease_expires_at=expires)
                .returning(*_RETURNED)
            ).first()

    def _holder(self, scope: str) -> str | None:
        """The current lease owner ('' when the row exists with no owner), None when there is no row."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(_T.c.lease_owner).where(self._key(scope))).first()
        return None if row is None else row.lease_owner or ""

    def _create(self, scope: str, now: datetime) -> None:
        with self.engine.begin() as conn:
            self._ensure_row(conn, scope, now, None)

    def _ensure_row(self, conn: Connection, scope: str, now: datetime, last: datetime | None) -> None:
        """Adopt a legacy row of the scope (null keys), else insert one; racing creators are harmless."""
        other = _T.alias("other")
        legacy = (
            sa.select(sa.func.min(other.c.id))
            .where(other.c.identifier == scope, other.c.scope_key.is_(None), other.c.fetcher.is_(None),
                   other.c.collector.is_(None))
            .scalar_subquery()
        )
        keyed = sa.exists().where(
            other.c.identifier == scope, other.c.scope_key == self.scope_key,
            other.c.fetcher == self.fetcher, other.c.collector == self.collector,
        )
        adopted = conn.execute(
            sa.update(_T)
            .where(_T.c.id == legacy, ~keyed)
            .values(scope_key=self.scope_key, fetcher=self.fetcher, collector=self.collector)
        ).rowcount
        if adopted:
            return
        conn.execute(
            dialect_insert(self.engine)(_T)
            .values(identifier=scope, scope_key=self.scope_key, fetcher=self.fetcher,
                    collector=self.collector, last_processed_timestamp=last, active=True,
                    scope_activation_toggle_date=now)
            .on_conflict_do_nothing(index_elements=["identifier", "scope_key", "collector", "fetcher"])
        )

    def commit(self, scope: str, owner: str, last_processed: datetime) -> bool:
        """Set ``last_processed_timestamp`` to ``last_processed`` if ``owner`` holds the lease.

        Forward only: False (nothing written) when the lease is not ``owner``'s any more or the
        stored timestamp is later; True when the state now is ``last_processed``.
        """
        last_processed = require_aware(last_processed, "last_processed")
        with database_errors(self.engine, f"committing the state of scope {scope!r}"), \
                self.engine.begin() as conn:
            result = conn.execute(
                sa.update(_T)
                .where(
                    self._key(scope),
                    _T.c.lease_owner == owner,
                    sa.or_(_T.c.last_processed_timestamp.is_(None),
                           _T.c.last_processed_timestamp <= last_processed),
                )
                .values(last_processed_timestamp=last_processed)
            )
            return result.rowcount == 1

    def release(self, scope: str, owner: str) -> bool:
        """Give the lease back if ``owner`` still holds it; True if it did."""
        with database_errors(self.engine, f"releasing the lease on scope {scope!r}"), \
                self.engine.begin() as conn:
            result = conn.execute(
                sa.update(_T)
                .where(self._key(scope), _T.c.lease_owner == owner)
                .values(lease_owner=None, lease_expires_at=None)
            )
            return result.rowcount == 1

    def release_all(self, owner: str) -> int:
        """Give back every lease ``owner`` holds (a run that failed); returns how many."""
        with database_errors(self.engine, f"releasing the leases of {owner!r}"), self.engine.begin() as conn:
            result = conn.execute(
                sa.update(_T)
                .where(self._rows(), _T.c.lease_owner == owner)
                .values(lease_owner=None, lease_expires_at=None)
            )
            return result.rowcount

    # --- administration ------------------------------------------------------------------------

    def get(self, scope: str) -> ScopeState | None:
        """The state of ``scope``, or None if it has no row."""
        with database_errors(self.engine, f"reading the state of scope {scope!r}"), \
                self.engine.connect() as conn:
            row = conn.execute(sa.select(_T).where(self._key(scope))).first()
        return None if row is None else _state(row)

    def list_states(self, *, active: bool | None = None) -> list[ScopeState]:
        """Every scope state of this (scope_key, fetcher, collector), by scope id; ``active`` filters."""
        query = sa.select(_T).where(
            _T.c.scope_key == self.scope_key, _T.c.fetcher == self.fetcher, _T.c.collector == self.collector
        )
        if active is not None:
            query = query.where(_T.c.active == active)
        with database_errors(self.engine, "listing the scope states"), self.engine.connect() as conn:
            return [_state(row) for row in conn.execute(query.order_by(_T.c.identifier))]

    def reset(
        self,
        scope: str,
        timestamp: datetime,
        *,
        now: datetime | None = None,
        owner: str | None = None,
        ttl_s: float | None = None,
    ) -> None:
        """Set the scope's ``last_processed_timestamp`` (CloudKitty's state reset, spec §6.8).

        Creates the row if needed.  Any lease on the scope is revoked, so a run still rating it
        cannot commit over the reset (its :meth:`commit` returns False).  With ``owner`` the lease
        passes to ``owner`` for ``ttl_s`` seconds instead of being freed: a state reset that must
        then delete stored data holds the scope, so no run rates (and writes) a period that the
        delete would remove afterwards; :meth:`release` ends it, and a crashed holder's lease is
        taken over like any dead run's.
        """
        timestamp = require_aware(timestamp, "timestamp")
        now = require_aware(now, "now") if now is not None else datetime.now(UTC)
        if owner is not None and (ttl_s is None or ttl_s <= 0):
            raise ValueError(f"lease ttl must be positive, got {ttl_s}")
        expires = None if owner is None else now + timedelta(seconds=ttl_s or 0)
        with database_errors(self.engine, f"resetting the state of scope {scope!r}"), \
                self.engine.begin() as conn:
            self._ensure_row(conn, scope, now, timestamp)
            conn.execute(
                sa.update(_T)
                .where(self._key(scope))
                .values(last_processed_timestamp=timestamp, lease_owner=owner, lease_expires_at=expires)
            )

    def set_active(self, scope: str, active: bool, *, now: datetime | None = None, create: bool = False) -> None:
        """(De)activate a scope; the toggle date moves only when the flag changes, as in CloudKitty.

        Raises ``KeyError`` when the scope has no state, unless ``create`` makes it one first (a
        typo must not silently become a new scope, so creating is asked for).
        """
        now = require_aware(now, "now") if now is not None else datetime.now(UTC)
        with database_errors(self.engine, f"setting scope {scope!r} active={active}"), \
                self.engine.begin() as conn:
            if create:
                self._ensure_row(conn, scope, now, None)
            conn.execute(
                sa.update(_T)
                .where(self._key(scope), _T.c.active != active)
                .values(active=active, scope_activation_toggle_date=now)
            )
            exists = conn.execute(sa.select(_T.c.id).where(self._key(scope))).first()
        if exists is None:
            raise KeyError(f"scope {scope!r} has no state for {self.scope_key}/{self.fetcher}/{self.collector}")


def _state(row: sa.Row) -> ScopeState:
    return ScopeState(
        scope=row.identifier,
        scope_key=row.scope_key,
        fetcher=row.fetcher,
        collector=row.collector,
        last_processed=row.last_processed_timestamp,
        active=bool(row.active),
        activation_toggled_at=row.scope_activation_toggle_date,
        lease_owner=row.lease_owner,
        lease_expires_at=row.lease_expires_at,
    )

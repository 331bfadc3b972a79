"""The scope state (CloudKitty's ``cloudkitty_storage_states``) and ratebeam's scope leases.

CloudKitty serializes work on a scope with a tooz lock; ratebeam keeps a lease per scope in a table
of its own (``ratebeam_scope_leases``), so it needs nothing but the database, works the same on
SQLite and PostgreSQL, and never writes a state row that CloudKitty cannot read:

* :meth:`StateStore.acquire` is one atomic ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` on the
  lease row: the lease is taken if there is none, if it expired, or if it is already ours.  Two
  concurrent runs can therefore never both hold a scope.  The state is read *after* the lease was
  taken, so nobody can have moved it in between.
* A holder keeps its leases alive with :meth:`StateStore.heartbeat` (one UPDATE for every lease of
  the run, sent by the run's launcher while it works); a holder that stops beating — killed, its
  container restarted, its host gone — is recognised by its lease expiring ``ttl`` after its last
  heartbeat.  Sooner only when it is proven gone: a lease whose owner is a process of this boot
  and PID namespace that no longer runs (``lease_owner.owner_gone``: its pid and start time, so a
  reused pid is no proof of life) is taken over at once with a compare-and-swap on that owner.
  (A hostname and a pid alone were wrong twice: a container restart reuses PID 1, and a run that
  had just finished looked dead to a run still going.)
* :meth:`StateStore.commit` is fenced: it advances ``last_processed_timestamp`` only while the
  caller still holds the lease (the lease row is locked for the transaction), and only forward, so
  a run that lost its lease (expired and taken over, revoked by :meth:`StateStore.reset` or
  :meth:`StateStore.unlock`) cannot move the state back or skip periods.

State rows are keyed like CloudKitty's (identifier, scope_key, fetcher, collector); a legacy row
with null scope_key/fetcher/collector is adopted on first commit, as CloudKitty does.  A scope
without a row has never been rated and is active.  Timestamps are aware UTC in Python, naive UTC
in the database.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import cast

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.sql.engine import database_errors, dialect_insert, write_transaction
from ratebeam.connectors.sql.lease_owner import owner_gone
from ratebeam.connectors.sql.models import Lease, StorageState
from ratebeam.transforms.periods import require_aware

LOG = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ScopeLease:
    """A lease taken on a scope, and the scope's state read after taking it."""

    scope: str
    owner: str
    expires_at: datetime
    last_processed: datetime | None  # begin of the last committed period; None = never rated
    active: bool


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Who holds a scope's lease, since when it last beat, and until when it holds it."""

    scope: str
    owner: str
    heartbeat_at: datetime
    expires_at: datetime


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
_L = cast(sa.Table, Lease.__table__)
_LEASE_KEY = ["identifier", "scope_key", "fetcher", "collector"]


#: Parameters of the statements every cycle runs per scope (``StateStore._hot``).
_SCOPE: sa.BindParameter[str] = sa.bindparam("scope")
_OWNER: sa.BindParameter[str] = sa.bindparam("owner")
_NOW: sa.BindParameter[datetime] = sa.bindparam("now")
_EXPIRES: sa.BindParameter[datetime] = sa.bindparam("expires")
_LAST: sa.BindParameter[datetime] = sa.bindparam("last")


@dataclass(frozen=True)
class _HotStatements:
    """The statements a cycle runs for every scope, built once per store: building one cost ~6x running it."""

    take: sa.Executable
    state: sa.Executable
    held: sa.Executable
    adopt: sa.Executable
    create: sa.Executable
    advance: sa.Executable
    release: sa.Executable


def _ttl(ttl_s: float) -> timedelta:
    if ttl_s <= 0:
        raise ValueError(f"lease ttl must be positive, got {ttl_s}")
    return timedelta(seconds=ttl_s)


class StateStore:
    """Scope states and leases of one (scope_key, fetcher, collector), like CloudKitty's keys."""

    def __init__(self, engine: Engine, scope_key: str, fetcher: str, collector: str) -> None:
        self.engine = engine
        self.scope_key = scope_key
        self.fetcher = fetcher
        self.collector = collector
        self._hot = self._hot_statements()

    def _hot_statements(self) -> _HotStatements:
        keys = {"scope_key": self.scope_key, "fetcher": self.fetcher, "collector": self.collector}
        insert = dialect_insert(self.engine)
        lease = insert(_L).values(identifier=_SCOPE, **keys, owner=_OWNER, heartbeat_at=_NOW, expires_at=_EXPIRES)
        other = _T.alias("other")
        legacy = (
            sa.select(sa.func.min(other.c.id))
            .where(other.c.identifier == _SCOPE, other.c.scope_key.is_(None), other.c.fetcher.is_(None),
                   other.c.collector.is_(None))
            .scalar_subquery()
        )
        keyed = sa.exists().where(self._key(_SCOPE, other))
        return _HotStatements(
            take=lease.on_conflict_do_update(
                index_elements=_LEASE_KEY, set_={"owner": _OWNER, "heartbeat_at": _NOW, "expires_at": _EXPIRES},
                where=sa.or_(_L.c.owner == _OWNER, _L.c.expires_at <= _NOW),
            ).returning(_L.c.owner),
            state=sa.select(_T.c.last_processed_timestamp, _T.c.active).where(self._key(_SCOPE)),
            held=sa.select(_L.c.id).where(self._key(_SCOPE, _L), _L.c.owner == _OWNER).with_for_update(),
            adopt=sa.update(_T).where(_T.c.id == legacy, ~keyed).values(**keys),
            create=insert(_T).values(
                identifier=_SCOPE, **keys, last_processed_timestamp=_LAST, active=True,
                scope_activation_toggle_date=_NOW,
            ).on_conflict_do_nothing(index_elements=["identifier", "scope_key", "collector", "fetcher"]),
            advance=sa.update(_T).where(
                self._key(_SCOPE),
                sa.or_(_T.c.last_processed_timestamp.is_(None), _T.c.last_processed_timestamp <= _LAST),
            ).values(last_processed_timestamp=_LAST),
            release=sa.delete(_L).where(self._key(_SCOPE, _L), _L.c.owner == _OWNER),
        )

    def _rows(self, table: sa.FromClause = _T) -> sa.ColumnElement[bool]:
        """The rows of this store's (scope_key, fetcher, collector) in ``table``."""
        return sa.and_(table.c.scope_key == self.scope_key, table.c.fetcher == self.fetcher,
                       table.c.collector == self.collector)

    def _key(self, scope: str | sa.BindParameter[str], table: sa.FromClause = _T) -> sa.ColumnElement[bool]:
        return sa.and_(table.c.identifier == scope, self._rows(table))

    # --- lease ---------------------------------------------------------------------------------

    def acquire(self, scope: str, owner: str, ttl_s: float, now: datetime) -> ScopeLease | None:
        """Take (or renew) the lease on ``scope`` until ``now + ttl_s``; None if another run holds it.

        Taken if free, expired, already held by ``owner``, or held by a process proven gone
        (``lease_owner.owner_gone``: taken over at once, logged).  Creates no state row: a scope
        without one has never been rated and is active.
        """
        now = require_aware(now, "now")
        expires = now + _ttl(ttl_s)
        params = {"scope": scope, "owner": owner, "now": now, "expires": expires}
        with database_errors(self.engine, f"taking the lease on scope {scope!r}"), self.engine.begin() as conn:
            if conn.execute(self._hot.take, params).first() is None and not self._take_over(conn, scope, params):
                return None
            row = conn.execute(self._hot.state, params).first()
        if row is None:
            return ScopeLease(scope, owner, expires, None, True)
        return ScopeLease(scope, owner, expires, row.last_processed_timestamp, bool(row.active))

    def _take_over(self, conn: Connection, scope: str, params: dict) -> bool:
        """Take the lease from a holder proven gone; False when it may still run (or someone was quicker)."""
        held = conn.execute(sa.select(_L.c.owner).where(self._key(scope, _L))).scalar()
        pid = None if held is None else owner_gone(held)
        if pid is None:
            return False
        taken = conn.execute(
            sa.update(_L).where(self._key(scope, _L), _L.c.owner == held)
            .values(owner=params["owner"], heartbeat_at=params["now"], expires_at=params["expires"])
        ).rowcount == 1
        if taken:
            LOG.warning("scope %s: took over the lease of run %s: its process %d on this host is gone", scope, held, pid)
        return taken

    def holder(self, scope: str) -> LeaseHolder | None:
        """Who holds the lease on ``scope`` (expired or not), None when nobody does."""
        with database_errors(self.engine, f"reading the lease on scope {scope!r}"), self.engine.connect() as conn:
            row = conn.execute(sa.select(_L).where(self._key(scope, _L))).first()
        return None if row is None else _holder(row)

    def leases(self) -> list[LeaseHolder]:
        """Every lease held on a scope of this store, by scope id."""
        with database_errors(self.engine, "listing the leases"), self.engine.connect() as conn:
            return [_holder(r) for r in conn.execute(sa.select(_L).where(self._rows(_L)).order_by(_L.c.identifier))]

    def heartbeat(self, owner: str, ttl_s: float, now: datetime) -> int:
        """Extend every lease of run ``owner`` (on any key) to ``now + ttl_s``; returns how many.

        The run's leases are those held by ``owner`` or by one of its ticks (``owner@<tick>``).
        A lease that expired but that nobody took is still the run's and is renewed too.
        """
        now = require_aware(now, "now")
        expires = now + _ttl(ttl_s)
        with database_errors(self.engine, f"renewing the leases of {owner!r}"), self.engine.begin() as conn:
            return conn.execute(
                sa.update(_L).where(_of_run(owner)).values(heartbeat_at=now, expires_at=expires)
            ).rowcount

    def _ensure_row(self, conn: Connection, scope: str, now: datetime, last: datetime | None) -> None:
        """Adopt a legacy row of the scope (null keys), else insert one; racing creators are harmless."""
        params = {"scope": scope, "now": now, "last": last}
        if not conn.execute(self._hot.adopt, params).rowcount:
            conn.execute(self._hot.create, params)

    def commit(self, scope: str, owner: str, last_processed: datetime) -> bool:
        """Set ``last_processed_timestamp`` to ``last_processed`` if ``owner`` holds the lease.

        Forward only: False (nothing written) when the lease is not ``owner``'s any more or the
        stored timestamp is later; True when the state now is ``last_processed``.  The lease row
        stays locked until the state is written, so nobody takes the lease over in between.
        """
        last_processed = require_aware(last_processed, "last_processed")
        with self.holding(scope, owner, "committing the state") as conn:
            if conn is None:
                return False
            return self.commit_in(conn, scope, last_processed)

    def commit_in(self, conn: Connection, scope: str, last_processed: datetime) -> bool:
        """:meth:`commit`'s forward-only state move, in a transaction of :meth:`holding`."""
        self._ensure_row(conn, scope, datetime.now(UTC), last_processed)
        return conn.execute(self._hot.advance, {"scope": scope, "last": last_processed}).rowcount == 1

    @contextmanager
    def holding(self, scope: str, owner: str, what: str) -> Iterator[Connection | None]:
        """A write transaction in which ``owner`` holds the scope's lease, or None if it does not.

        The lease row stays locked until the transaction ends, so nobody takes the lease over
        while the caller writes what the lease fences (a state, a job's progress).
        """
        with database_errors(self.engine, f"{what} of scope {scope!r}"), write_transaction(self.engine) as conn:
            held = conn.execute(self._hot.held, {"scope": scope, "owner": owner}).first()
            yield None if held is None else conn

    def release(self, scope: str, owner: str) -> bool:
        """Give the lease back if ``owner`` still holds it; True if it did."""
        with database_errors(self.engine, f"releasing the lease on scope {scope!r}"), \
                self.engine.begin() as conn:
            return self.release_in(conn, scope, owner)

    def release_in(self, conn: Connection, scope: str, owner: str) -> bool:
        """:meth:`release` in the caller's transaction (e.g. the one that committed the state)."""
        return conn.execute(self._hot.release, {"scope": scope, "owner": owner}).rowcount == 1

    def release_all(self, owner: str) -> int:
        """Give back every lease of run ``owner`` (one that failed or stopped); returns how many."""
        with database_errors(self.engine, f"releasing the leases of {owner!r}"), self.engine.begin() as conn:
            return conn.execute(sa.delete(_L).where(self._rows(_L), _of_run(owner))).rowcount

    def unlock(self, scope: str) -> LeaseHolder | None:
        """Clear the lease on ``scope`` whoever holds it (``state unlock``); returns the lease cleared.

        The state and the rated data are untouched; a run still working on the scope cannot
        commit any more (its :meth:`commit` returns False) and the next run rates the scope again.
        """
        with database_errors(self.engine, f"clearing the lease on scope {scope!r}"), \
                write_transaction(self.engine) as conn:
            row = conn.execute(sa.select(_L).where(self._key(scope, _L))).first()
            conn.execute(sa.delete(_L).where(self._key(scope, _L)))
        return None if row is None else _holder(row)

    # --- administration ------------------------------------------------------------------------

    def _states(self) -> sa.Select:
        """State rows of this store with the lease on each (if any)."""
        return sa.select(_T, _L.c.owner, _L.c.expires_at).select_from(
            _T.outerjoin(_L, sa.and_(_L.c.identifier == _T.c.identifier, self._rows(_L)))
        ).where(self._rows())

    def get(self, scope: str) -> ScopeState | None:
        """The state of ``scope``, or None if it has no row."""
        with database_errors(self.engine, f"reading the state of scope {scope!r}"), \
                self.engine.connect() as conn:
            row = conn.execute(self._states().where(_T.c.identifier == scope)).first()
        return None if row is None else _state(row)

    def list_states(self, *, active: bool | None = None) -> list[ScopeState]:
        """Every scope state of this (scope_key, fetcher, collector), by scope id; ``active`` filters."""
        query = self._states()
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
        """Set the scope's ``last_processed_timestamp`` (CloudKitty's state reset, `cloudkitty/orchestrator.py:221-246`).

        Creates the row if needed.  Any lease on the scope is revoked, so a run still rating it
        cannot commit over the reset (its :meth:`commit` returns False).  With ``owner`` the lease
        passes to ``owner`` for ``ttl_s`` seconds instead of being freed: a state reset that must
        then delete stored data holds the scope, so no run rates (and writes) a period that the
        delete would remove afterwards; :meth:`release` ends it, and a crashed holder's lease
        expires like any dead run's.
        """
        timestamp = require_aware(timestamp, "timestamp")
        now = require_aware(now, "now") if now is not None else datetime.now(UTC)
        if owner is not None and (ttl_s is None or ttl_s <= 0):
            raise ValueError(f"lease ttl must be positive, got {ttl_s}")
        with database_errors(self.engine, f"resetting the state of scope {scope!r}"), \
                write_transaction(self.engine) as conn:
            self._ensure_row(conn, scope, now, timestamp)
            conn.execute(sa.update(_T).where(self._key(scope)).values(last_processed_timestamp=timestamp))
            conn.execute(sa.delete(_L).where(self._key(scope, _L)))
            if owner is not None:
                conn.execute(sa.insert(_L).values(
                    identifier=scope, scope_key=self.scope_key, fetcher=self.fetcher, collector=self.collector,
                    owner=owner, heartbeat_at=now, expires_at=now + _ttl(ttl_s or 0)))

    def set_active(self, scope: str, active: bool, *, now: datetime | None = None, create: bool = False) -> None:
        """(De)activate a scope; the toggle date moves only when the flag changes, as in CloudKitty.

        Raises ``KeyError`` when the scope has no state, unless ``create`` makes it one first (a
        typo must not silently become a new scope, so creating is asked for).
        """
        now = require_aware(now, "now") if now is not None else datetime.now(UTC)
        with database_errors(self.engine, f"setting scope {scope!r} active={active}"), \
                self.engine.begin() as conn:
            if create:
                try:
                    self._ensure_row(conn, scope, now, None)
                except sa.exc.IntegrityError:
                    raise FatalConnectorError(
                        f"scope {scope!r} was never rated, and CloudKitty's cloudkitty_storage_states (its "
                        "last_processed_timestamp is NOT NULL) cannot hold its state: rate it first, or give it "
                        f"a start with `ratebeam state reset {scope} --from <begin> --create`"
                    ) from None
            conn.execute(
                sa.update(_T)
                .where(self._key(scope), _T.c.active != active)
                .values(active=active, scope_activation_toggle_date=now)
            )
            exists = conn.execute(sa.select(_T.c.id).where(self._key(scope))).first()
        if exists is None:
            raise KeyError(f"scope {scope!r} has no state for {self.scope_key}/{self.fetcher}/{self.collector}")


def _of_run(owner: str) -> sa.ColumnElement[bool]:
    """The leases of run ``owner``: its own and its ticks' (``owner@<tick>``)."""
    return sa.or_(_L.c.owner == owner, _L.c.owner.startswith(f"{owner}@", autoescape=True))


def _holder(row: sa.Row) -> LeaseHolder:
    return LeaseHolder(row.identifier, row.owner, row.heartbeat_at, row.expires_at)


def _state(row: sa.Row) -> ScopeState:
    return ScopeState(
        scope=row.identifier,
        scope_key=row.scope_key,
        fetcher=row.fetcher,
        collector=row.collector,
        last_processed=row.last_processed_timestamp,
        active=bool(row.active),
        activation_toggled_at=row.scope_activation_toggle_date,
        lease_owner=row.owner,
        lease_expires_at=row.expires_at,
    )

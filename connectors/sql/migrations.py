"""Create and migrate the ratebeam schema (``ratebeam db upgrade``), and check it before use.

Migrations are numbered steps recorded in ``ratebeam_schema_version``.  :func:`upgrade` applies
the missing ones in one transaction under a lock (``BEGIN IMMEDIATE`` on SQLite, an advisory lock
on PostgreSQL), so running it twice, or from two processes at once, is harmless.  Each step is
itself written to work on an empty database *and* on an existing CloudKitty database whose tables
are already there (it only adds what is missing).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.sql.engine import (
    UPGRADE_HINT,
    database_errors,
    describe,
    make_engine,
    write_transaction,
)
from ratebeam.connectors.sql.models import Base, DeadLetter, SchemaVersion, StorageState

__all__ = ["SCHEMA_VERSION", "check_schema", "current_version", "make_engine", "upgrade"]

_ADVISORY_LOCK_KEY = 0x7261746562656D  # "ratebem": serializes concurrent upgrades on PostgreSQL
_LEASE_COLUMNS = ("lease_owner", "lease_expires_at")


def _create_tables(conn: Connection) -> None:
    """CloudKitty's hashmap, state, schedule and module tables, ratebeam's scripts and lease columns."""
    Base.metadata.create_all(conn, checkfirst=True)
    _adapt_storage_states(conn)


def _adapt_storage_states(conn: Connection) -> None:
    """Give a CloudKitty-created state table the lease columns and a nullable timestamp."""
    table = StorageState.__table__
    columns = {c["name"]: c for c in sa.inspect(conn).get_columns(table.name)}
    missing = [name for name in _LEASE_COLUMNS if name not in columns]
    strict_timestamp = not columns["last_processed_timestamp"]["nullable"]
    if not missing and not strict_timestamp:
        return
    if conn.dialect.name == "sqlite":
        # SQLite cannot relax NOT NULL in place: rebuild the table from the model, keeping its rows.
        kept = ", ".join(f'"{name}"' for name in columns)
        old = f"{table.name}__before_ratebeam"
        conn.exec_driver_sql(f'ALTER TABLE "{table.name}" RENAME TO "{old}"')
        table.create(conn)
        conn.exec_driver_sql(f'INSERT INTO "{table.name}" ({kept}) SELECT {kept} FROM "{old}"')
        conn.exec_driver_sql(f'DROP TABLE "{old}"')
        return
    preparer = conn.dialect.identifier_preparer
    for name in missing:
        column = table.c[name]
        conn.exec_driver_sql(
            f"ALTER TABLE {preparer.format_table(table)} ADD COLUMN {preparer.format_column(column)} "
            f"{column.type.compile(dialect=conn.dialect)}"
        )
    if strict_timestamp:
        conn.exec_driver_sql(
            f"ALTER TABLE {preparer.format_table(table)} ALTER COLUMN last_processed_timestamp DROP NOT NULL"
        )


#: (description, step) in order; the version of a step is its position, starting at 1.
_MIGRATIONS: tuple[tuple[str, Callable[[Connection], None]], ...] = (
    ("CloudKitty hashmap, state, schedule and module tables; ratebeam scripts and scope leases",
     _create_tables),
    ("ratebeam dead letters", lambda conn: DeadLetter.__table__.create(conn, checkfirst=True)),
)

#: The schema version this code needs.
SCHEMA_VERSION = len(_MIGRATIONS)


def _read_version(conn: Connection) -> int | None:
    if not sa.inspect(conn).has_table(SchemaVersion.__tablename__):
        return None
    return conn.execute(sa.select(sa.func.max(SchemaVersion.version))).scalar_one() or 0


def upgrade(engine: Engine) -> list[str]:
    """Bring the schema to :data:`SCHEMA_VERSION`; return the steps applied ("<n>: <what>")."""
    applied = []
    with database_errors(engine, "db upgrade"), write_transaction(engine) as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_ADVISORY_LOCK_KEY)))
        SchemaVersion.__table__.create(conn, checkfirst=True)
        version = _read_version(conn) or 0
        if version > SCHEMA_VERSION:
            raise FatalConnectorError(_too_new(engine, version))
        for number, (description, step) in enumerate(_MIGRATIONS, start=1):
            if number <= version:
                continue
            step(conn)
            conn.execute(
                sa.insert(SchemaVersion).values(
                    version=number, description=description, applied_at=datetime.now(UTC)
                )
            )
            applied.append(f"{number}: {description}")
    return applied


def current_version(engine: Engine) -> int | None:
    """The applied schema version, or None when ratebeam's schema was never created."""
    with database_errors(engine, "reading the schema version"), engine.connect() as conn:
        return _read_version(conn)


def check_schema(engine: Engine) -> int:
    """Connect and make sure the schema is exactly the one this code needs, else a clear fatal error."""
    version = current_version(engine)
    where = describe(engine)
    if version is None:
        raise FatalConnectorError(f"no ratebeam schema in the database at {where}: {UPGRADE_HINT}")
    if version < SCHEMA_VERSION:
        raise FatalConnectorError(
            f"the ratebeam schema at {where} is at version {version}, this ratebeam needs "
            f"{SCHEMA_VERSION}: {UPGRADE_HINT}"
        )
    if version > SCHEMA_VERSION:
        raise FatalConnectorError(_too_new(engine, version))
    return version


def _too_new(engine: Engine, version: int) -> str:
    return (
        f"the ratebeam schema at {describe(engine)} is at version {version}, newer than this "
        f"ratebeam ({SCHEMA_VERSION}): upgrade ratebeam"
    )

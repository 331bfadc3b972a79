"""Create and migrate the ratebeam schema with Alembic (``ratebeam db upgrade``), and check it before use.

The revisions live in ``alembic/versions/`` beside this module.  Each defines its tables explicitly
(never ``create_all``), so a revision keeps its meaning whatever the models become;
``tests/test_sql_migrations.py`` checks that the head revision builds exactly the models' schema.
There is no alembic.ini: :func:`alembic_config` builds the configuration in code.

* ratebeam records its revision in its own version table, :data:`VERSION_TABLE`, so it can share a
  database with CloudKitty, whose alembic trees each have theirs (``cloudkitty_alembic``,
  ``storage_states_alembic``, ``hashmap_alembic``...; none is Alembic's default
  ``alembic_version``): ratebeam never reads nor writes those.
* :func:`upgrade` runs in one transaction under a lock (``BEGIN IMMEDIATE`` on SQLite, an advisory
  lock on PostgreSQL), so running it twice, or from two processes at once, is harmless.  Revision
  0001 creates only the CloudKitty tables that are missing, so it works on a CloudKitty database.
* A database made by the hand-written migrations of earlier ratebeams (table
  ``ratebeam_schema_version``, versions 1 and 2) already has the schema of revisions 0001 and 0002:
  :func:`upgrade` stamps the matching revision without running its DDL and drops the old table, in
  the same transaction, so that the database has one record of its schema version, not two that
  could disagree later.  Until then :func:`check_schema` asks for ``ratebeam db upgrade``.

A new revision: write ``alembic/versions/<id>_<what>.py`` by hand, or let Alembic draft it from
the models against a database at the head revision, then make its definitions explicit::

    from alembic import command
    with make_engine("sqlite:///dev.db").begin() as conn:
        command.revision(alembic_config(conn), "what changes", autogenerate=True, rev_id="0003")
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext, MigrationInfo
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine

from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.sql.engine import (
    UPGRADE_HINT,
    database_errors,
    describe,
    make_engine,
    write_transaction,
)

__all__ = ["REVISIONS", "SCHEMA_VERSION", "VERSION_TABLE", "alembic_config", "check_schema", "current_version",
           "make_engine", "upgrade"]

#: ratebeam's Alembic version table (CloudKitty has one per alembic tree, ``<tree>_alembic``).
VERSION_TABLE = "ratebeam_alembic_version"

_SCRIPT_LOCATION = Path(__file__).with_name("alembic")
_SCRIPTS = ScriptDirectory(str(_SCRIPT_LOCATION))
#: Every revision, oldest first.
REVISIONS: tuple[str, ...] = tuple(reversed([script.revision for script in _SCRIPTS.walk_revisions()]))

#: The revision this code needs: the head of ``alembic/versions``.
SCHEMA_VERSION: str = cast(str, _SCRIPTS.get_current_head())  # None only for an empty versions folder

_ADVISORY_LOCK_KEY = 0x7261746562656D  # "ratebem": serializes concurrent upgrades on PostgreSQL

#: The hand-written migrations' version table, and the revision matching each of its versions.
_LEGACY_TABLE = "ratebeam_schema_version"
_LEGACY_REVISIONS = {1: "0001", 2: "0002"}


def alembic_config(connection: Connection, on_version_apply: Callable[..., None] | None = None) -> Config:
    """The Alembic configuration of ratebeam's schema, whose ``env.py`` migrates ``connection``."""
    config = Config()
    config.set_main_option("script_location", str(_SCRIPT_LOCATION))
    config.attributes["connection"] = connection
    if on_version_apply is not None:
        config.attributes["on_version_apply"] = on_version_apply
    return config


def _context(conn: Connection) -> MigrationContext:
    return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})


def upgrade(engine: Engine) -> list[str]:
    """Bring the schema to :data:`SCHEMA_VERSION`; return the revisions applied ("<id>: <what>")."""
    applied: list[str] = []

    def record(*, step: MigrationInfo, **_) -> None:
        # alembic types ``up_revision`` as an optional ``Revision``; an upgrade step's is the ``Script``.
        applied.append(f"{step.up_revision_id}: {step.up_revision.doc}")  # type: ignore[union-attr]

    with database_errors(engine, "db upgrade"), write_transaction(engine) as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_ADVISORY_LOCK_KEY)))
        context = _context(conn)
        version = context.get_current_revision()
        if version is not None and version not in REVISIONS:
            raise FatalConnectorError(_too_new(engine, version))
        if sa.inspect(conn).has_table(_LEGACY_TABLE):
            if version is None:
                context.stamp(_SCRIPTS, _legacy_revision(engine, conn))
            conn.exec_driver_sql(f"DROP TABLE {_LEGACY_TABLE}")
        command.upgrade(alembic_config(conn, record), "head")
    return applied


def _legacy_revision(engine: Engine, conn: Connection) -> str:
    """The revision with the schema that the hand-written migrations recorded in their table."""
    version: int | None = conn.execute(
        sa.select(sa.func.max(sa.column("version"))).select_from(sa.table(_LEGACY_TABLE))
    ).scalar_one()
    if version not in _LEGACY_REVISIONS:
        raise FatalConnectorError(
            f"{_LEGACY_TABLE} at {describe(engine)} records version {version}, which no ratebeam "
            f"wrote (known: {', '.join(map(str, _LEGACY_REVISIONS))}): restore the table or the database"
        )
    return _LEGACY_REVISIONS[version]


def current_version(engine: Engine) -> str | None:
    """The applied revision, or None when ratebeam's Alembic schema was never created."""
    with database_errors(engine, "reading the schema version"), engine.connect() as conn:
        return _context(conn).get_current_revision()


def check_schema(engine: Engine) -> str:
    """Connect and make sure the schema is exactly the one this code needs, else a clear fatal error."""
    version = current_version(engine)
    if version == SCHEMA_VERSION:
        return version
    where = describe(engine)
    if version is None:
        raise FatalConnectorError(
            f"no ratebeam schema, or one from before ratebeam used Alembic, in the database at {where}: "
            f"{UPGRADE_HINT}"
        )
    if version not in REVISIONS:
        raise FatalConnectorError(_too_new(engine, version))
    raise FatalConnectorError(
        f"the ratebeam schema at {where} is at revision {version}, this ratebeam needs "
        f"{SCHEMA_VERSION}: {UPGRADE_HINT}"
    )


def _too_new(engine: Engine, version: str) -> str:
    return (
        f"the ratebeam schema at {describe(engine)} is at revision {version}, unknown to this "
        f"ratebeam (whose newest is {SCHEMA_VERSION}): it was made by a newer ratebeam: upgrade ratebeam"
    )

"""Tables as CloudKitty 25.0.0's own migrations leave them, for the tests that upgrade a CloudKitty database.

Unnamed primary keys, CloudKitty's column order, a NOT NULL ``last_processed_timestamp`` and no
lease columns in the scope state; a version table per CloudKitty alembic tree; ``states``, a table
ratebeam does not know.  Modelled on what ``cloudkitty-dbsync`` and the storage-state migrations
create on SQLite, so that the same shapes can be made on PostgreSQL too (CloudKitty's venv has no
PostgreSQL driver).
"""

from __future__ import annotations

import sqlalchemy as sa

#: CloudKitty's version tables (one per alembic tree) and a revision each holds.
VERSIONS = {"cloudkitty_alembic": "385e33fef139", "storage_states_alembic": "9feccd32", "hashmap_alembic": "4e0232ce"}


def cloudkitty_metadata() -> sa.MetaData:
    """Some of CloudKitty's tables (not all: ratebeam must create the missing ones)."""
    metadata = sa.MetaData()
    for name in VERSIONS:
        sa.Table(name, metadata, sa.Column("version_num", sa.String(32), primary_key=True))
    sa.Table("states", metadata, sa.Column("name", sa.String(255), primary_key=True),
             sa.Column("state", sa.BigInteger, nullable=False), sa.Column("s_metadata", sa.Text))
    sa.Table("modules_state", metadata, sa.Column("name", sa.String(255), primary_key=True),
             sa.Column("state", sa.Boolean, nullable=False), sa.Column("priority", sa.Integer))
    sa.Table("hashmap_services", metadata, sa.Column("id", sa.Integer, primary_key=True),
             sa.Column("service_id", sa.String(36), nullable=False), sa.Column("name", sa.String(255), nullable=False),
             sa.UniqueConstraint("service_id", name="uq_hashmap_services_service_id"),
             sa.UniqueConstraint("name", name="uq_hashmap_services_name"))
    sa.Table(
        "cloudkitty_storage_states", metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("identifier", sa.String(256), nullable=False),
        sa.Column("scope_key", sa.String(40)), sa.Column("fetcher", sa.String(40)),
        sa.Column("collector", sa.String(40)),
        sa.Column("last_processed_timestamp", sa.DateTime, nullable=False),
        sa.Column("scope_activation_toggle_date", sa.DateTime, nullable=False, server_default=sa.func.now()),
        sa.Column("active", sa.Boolean, nullable=False),
        sa.UniqueConstraint("identifier", "scope_key", "collector", "fetcher",
                            name="uq_cloudkitty_storage_states_identifier"),
    )
    sa.Table("storage_scope_reprocessing_schedule", metadata, sa.Column("id", sa.Integer, primary_key=True),
             sa.Column("identifier", sa.String(256), nullable=False),
             sa.Column("start_reprocess_time", sa.DateTime, nullable=False),
             sa.Column("end_reprocess_time", sa.DateTime, nullable=False),
             sa.Column("current_reprocess_time", sa.DateTime), sa.Column("reason", sa.Text, nullable=False))
    return metadata

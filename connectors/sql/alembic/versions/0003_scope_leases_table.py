"""scope leases in ratebeam's own table

Revision ID: 0003
Revises: 0002

Leases leave CloudKitty's ``cloudkitty_storage_states`` for ``ratebeam_scope_leases`` (owner run,
heartbeat, expiry), so that ratebeam never writes a state row CloudKitty cannot read:

* the new table has one row per held lease, keyed like a state row;
* ``lease_owner`` / ``lease_expires_at`` are dropped from the state table.  Dropping them is safe:
  CloudKitty never reads them, a ratebeam older than this revision refuses to start on the upgraded
  schema (``check_schema``), and a lease still held in them belongs to a run that the upgrade
  outlives only if it was running meanwhile — its commit then fails on the missing column, so it
  changes nothing, and the periods it wrote are rewritten idempotently by the next run;
* the state rows earlier ratebeams created only to hold a lease (no ``last_processed_timestamp``,
  active: exactly what "no row" means) are deleted; an inactive never-rated scope keeps its row
  (its NULL timestamp is the only way to remember that it was deactivated).

The columns are dropped only where an earlier 0001 added them (a state table it created, or a
CloudKitty one it altered): a CloudKitty table that never had them is not touched.  On SQLite the
column drop rebuilds the table (batch mode), keeping rows and constraints.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the lease table, move the leases out of CloudKitty's state table, drop lease-only rows."""
    op.create_table(
        "ratebeam_scope_leases",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("identifier", sa.String(256), nullable=False),
        sa.Column("scope_key", sa.String(40), nullable=False),
        sa.Column("fetcher", sa.String(40), nullable=False),
        sa.Column("collector", sa.String(40), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ratebeam_scope_leases")),
        sa.UniqueConstraint("identifier", "scope_key", "fetcher", "collector",
                            name=op.f("uq_ratebeam_scope_leases_identifier")),
    )
    op.create_index(op.f("ix_ratebeam_scope_leases_owner"), "ratebeam_scope_leases", ["owner"])
    states = sa.table("cloudkitty_storage_states", sa.column("last_processed_timestamp"), sa.column("active"))
    op.execute(sa.delete(states).where(states.c.last_processed_timestamp.is_(None), states.c.active.is_(True)))
    columns = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("cloudkitty_storage_states")}
    leases = [name for name in ("lease_owner", "lease_expires_at") if name in columns]
    if leases:
        with op.batch_alter_table("cloudkitty_storage_states") as batch:
            for name in leases:
                batch.drop_column(name)

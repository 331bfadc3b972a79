"""ratebeam backfills

Revision ID: 0004
Revises: 0003

The progress of ``ratebeam backfill`` runs, one row per (scope, range), in ratebeam's own table:
CloudKitty's reprocessing table would make its own reprocessor take them too.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``ratebeam_backfills``."""
    op.create_table(
        "ratebeam_backfills",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("identifier", sa.String(256), nullable=False),
        sa.Column("scope_key", sa.String(40), nullable=False),
        sa.Column("fetcher", sa.String(40), nullable=False),
        sa.Column("collector", sa.String(40), nullable=False),
        sa.Column("start", sa.DateTime(), nullable=False),
        sa.Column("end", sa.DateTime(), nullable=False),
        sa.Column("current", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ratebeam_backfills")),
        sa.UniqueConstraint("identifier", "scope_key", "fetcher", "collector", "start", "end",
                            name=op.f("uq_ratebeam_backfills_identifier")),
    )

"""ratebeam dead letters

Revision ID: 0002
Revises: 0001

The frames (scope x period) a run could not rate or store, with the stage and the reason.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``ratebeam_dead_letters``."""
    op.create_table(
        "ratebeam_dead_letters",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(255), nullable=False),
        sa.Column("scope", sa.String(256), nullable=False),
        sa.Column("period_begin", sa.DateTime(), nullable=False),
        sa.Column("stage", sa.String(40), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ratebeam_dead_letters")),
    )
    op.create_index(op.f("ix_ratebeam_dead_letters_run_id"), "ratebeam_dead_letters", ["run_id"])

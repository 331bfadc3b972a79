"""ratebeam run tallies

Revision ID: 0006
Revises: 0005

``ratebeam_run_tallies`` holds the figures a run's graph counted (``transforms.tallies``), one
row per (run id, name), written by the pipeline's last step and read back by the launcher, which
deletes its run's rows once read: the figures no longer depend on a runner reporting Beam metrics.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the run tallies table."""
    op.create_table(
        "ratebeam_run_tallies",
        sa.Column("run_id", sa.String(255), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "name", name=op.f("pk_ratebeam_run_tallies")),
    )


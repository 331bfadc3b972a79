"""event stream discrepancies

Revision ID: 0008
Revises: 0007

``ratebeam_event_discrepancies``: what the event stream's lifecycles found to disagree with Nova's
audit (``compute.instance.exists``) or missing from the stream (a start never seen), reported by
``ratebeam events discrepancies`` instead of only logged.  Keyed by (trigger, instance key, kind,
message id), so the same finding at every period close is one row whose ``last_seen_at`` moves.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the discrepancies table."""
    op.create_table(
        "ratebeam_event_discrepancies",
        sa.Column("trigger", sa.String(255), nullable=False),
        sa.Column("instance_key", sa.String(1024), nullable=False),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("message_id", sa.String(255), nullable=False),
        sa.Column("resource_id", sa.String(255), nullable=False),
        sa.Column("scope", sa.String(256), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("first_seen_at", sa.DateTime(), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(), nullable=False),
        sa.Column("run_id", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("trigger", "instance_key", "kind", "message_id",
                                name=op.f("pk_ratebeam_event_discrepancies")),
    )
    op.create_index(op.f("ix_ratebeam_event_discrepancies_scope"), "ratebeam_event_discrepancies", ["scope"])

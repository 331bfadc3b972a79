"""event stream consumers

Revision ID: 0010
Revises: 0009

``ratebeam_event_consumers``: one row per running sharded event-stream job (its run id): the latest
``generated`` time among the notifications it has recorded from the shared queue, and a heartbeat.
A shard job's event time never passes the oldest of these (``Inbox.consumers_low``): the messages
another job holds delivered but not yet recorded come after its latest recorded one in the queue.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the consumers table."""
    op.create_table(
        "ratebeam_event_consumers",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("shard", sa.String(32), nullable=False),
        sa.Column("recorded_through", sa.DateTime(), nullable=True),
        sa.Column("heartbeat", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_ratebeam_event_consumers")),
    )

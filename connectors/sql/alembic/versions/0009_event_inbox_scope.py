"""event inbox scope

Revision ID: 0009
Revises: 0008

``ratebeam_event_inbox`` gets each notification's scope (``scope``: the value of its triggers'
``scope_trait``, ``''`` when it has none, NULL for the rows recorded before this revision until a
job computes it) and ``scope_hash`` (the CRC-32 of the scope): sharded event-stream jobs
(``ratebeam events serve --shard K/N``) take the rows whose ``scope_hash % N`` is ``K``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the two columns."""
    with op.batch_alter_table("ratebeam_event_inbox") as batch:
        batch.add_column(sa.Column("scope", sa.String(256), nullable=True))
        batch.add_column(sa.Column("scope_hash", sa.BigInteger(), nullable=True))


"""event stream inbox, stored frames, message dead letters

Revision ID: 0007
Revises: 0006

Three tables of ratebeam's own for ``ratebeam events serve`` (CloudKitty's are untouched):

* ``ratebeam_event_inbox``: every notification received, keyed by its ``message_id`` (a duplicate
  inserts nothing), written before the message is acknowledged, finished once its usage is stored.
* ``ratebeam_event_frames``: the frames (scope, period) the stream stored, so a restarted job does
  not replace them with what it rebuilt.
* ``ratebeam_message_dead_letters``: the messages it could not read, keyed by the body's SHA-256.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the event stream's three tables."""
    op.create_table(
        "ratebeam_event_inbox",
        sa.Column("message_id", sa.String(255), nullable=False),
        sa.Column("event_type", sa.String(255), nullable=False),
        sa.Column("publisher_id", sa.String(255), nullable=False),
        sa.Column("priority", sa.String(40), nullable=False),
        sa.Column("generated", sa.DateTime(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("received_at", sa.DateTime(), nullable=False),
        sa.Column("emitted_run", sa.String(64), nullable=True),
        sa.Column("finish_scope", sa.String(256), nullable=True),
        sa.Column("finish_period", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("late_at", sa.DateTime(), nullable=True),
        sa.Column("late_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("message_id", name=op.f("pk_ratebeam_event_inbox")),
    )
    op.create_index(op.f("ix_ratebeam_event_inbox_finished_at"), "ratebeam_event_inbox", ["finished_at"])
    op.create_table(
        "ratebeam_event_frames",
        sa.Column("scope", sa.String(256), nullable=False),
        sa.Column("period_begin", sa.DateTime(), nullable=False),
        sa.Column("points", sa.Integer(), nullable=False),
        sa.Column("committed_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("scope", "period_begin", name=op.f("pk_ratebeam_event_frames")),
    )
    op.create_table(
        "ratebeam_message_dead_letters",
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("message_id", sa.String(255), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("received_at", sa.DateTime(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False, server_default="1"),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_ratebeam_message_dead_letters")),
    )

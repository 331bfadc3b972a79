"""dead letters per frame; points per rated cell

Revision ID: 0005
Revises: 0004

Two changes, both in ratebeam's own tables (CloudKitty's are untouched):

* ``ratebeam_dead_letters`` keeps one row per frame (scope, period) instead of one per failure: a
  scope stuck on a bad rule used to add a row at every run.  The row counts the failures
  (``failures``), says when the frame last failed (``last_seen_at``; ``created_at`` stays the
  first failure and ``run_id``, ``stage``, ``reason`` the last one) and when it was rated after all
  (``resolved_at``, NULL while it still fails).  Existing rows are merged per frame here.
* ``ratebeam_cell_points`` records, at commit time, how many points each committed (scope,
  period, metric type) cell stored — 0 included — so ``ratebeam gaps`` can tell a period that was
  *collected empty* from one rated with data.  Periods committed before this revision have no row:
  ``gaps`` cannot know whether they were empty and does not report them as such.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Merge dead letters per frame, add their counters, create the cell points table."""
    with op.batch_alter_table("ratebeam_dead_letters") as batch:
        batch.add_column(sa.Column("failures", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("last_seen_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("resolved_at", sa.DateTime(), nullable=True))
    _merge_per_frame()
    with op.batch_alter_table("ratebeam_dead_letters") as batch:
        batch.alter_column("last_seen_at", existing_type=sa.DateTime(), nullable=False)
        batch.create_unique_constraint(op.f("uq_ratebeam_dead_letters_scope"), ["scope", "period_begin"])
    op.create_table(
        "ratebeam_cell_points",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("scope", sa.String(256), nullable=False),
        sa.Column("period_begin", sa.DateTime(), nullable=False),
        sa.Column("type", sa.String(255), nullable=False),
        sa.Column("points", sa.Integer(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ratebeam_cell_points")),
        sa.UniqueConstraint("scope", "period_begin", "type", name=op.f("uq_ratebeam_cell_points_scope")),
    )


def _merge_per_frame() -> None:
    """One row per (scope, period): the latest failure's row, with the count and both instants.

    Rows are grouped here, on the values as stored (untyped columns), so a period written in
    another textual form on SQLite is still compared as the database holds it.
    """
    letters = sa.table("ratebeam_dead_letters", sa.column("id"), sa.column("scope"), sa.column("period_begin"),
                       sa.column("created_at"), sa.column("failures"), sa.column("last_seen_at"))
    conn = op.get_bind()
    frames: dict[tuple[object, object], list[tuple[int, object]]] = {}
    for id_, scope, begin, created in conn.execute(
        sa.select(letters.c.id, letters.c.scope, letters.c.period_begin, letters.c.created_at)
    ):
        frames.setdefault((scope, begin), []).append((id_, created))
    for rows in frames.values():
        ids = sorted(id_ for id_, _ in rows)
        first = min((c for _, c in rows), key=str)
        last = max((c for _, c in rows), key=str)
        if len(ids) > 1:
            conn.execute(sa.delete(letters).where(letters.c.id.in_(ids[:-1])))
        conn.execute(sa.update(letters).where(letters.c.id == ids[-1])
                     .values(failures=len(ids), created_at=first, last_seen_at=last))

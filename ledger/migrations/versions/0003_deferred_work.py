"""Deferred work: an entry's task handle and, while it waits, its whole request.

Revision ID: 0003
Revises: 0002
Create Date: 2027-01-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("ledger_entries") as batch:
        batch.add_column(sa.Column("task_id", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("request", sa.LargeBinary(), nullable=True))
        batch.create_index(
            "uq_ledger_entries_task",
            ["task_id"],
            unique=True,
            sqlite_where=sa.text("task_id IS NOT NULL"),
            postgresql_where=sa.text("task_id IS NOT NULL"),
        )


def downgrade() -> None:
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_index("uq_ledger_entries_task")
        batch.drop_column("request")
        batch.drop_column("task_id")

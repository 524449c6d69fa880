"""Operator retries counted apart from attempts (the proxy's own hand-overs do not spend them).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("ledger_entries") as batch:
        batch.add_column(
            sa.Column("operator_retries", sa.Integer(), nullable=False, server_default="0")
        )
    # Entries retried before this revision keep the retries they had used.
    op.execute(
        "UPDATE ledger_entries SET operator_retries = ("
        "SELECT count(*) FROM ledger_transitions t WHERE t.entry_id = ledger_entries.id "
        "AND t.reason = 'resolved_retry' AND t.to_state = 'accepted')"
    )


def downgrade() -> None:
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_column("operator_retries")

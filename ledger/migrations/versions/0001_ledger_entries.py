"""Ledger entries and their append-only transition history.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_STATES = "'accepted', 'running', 'succeeded', 'failed', 'unknown', 'blocked', 'rejected'"


def _bigint() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _when(name: str, *, nullable: bool) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "ledger_entries",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("upstream", sa.String(), nullable=False),
        sa.Column("tool", sa.String(), nullable=False),
        sa.Column("idempotency_key", sa.String(), nullable=False),
        sa.Column("key_source", sa.String(16), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("arguments", sa.Text(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(), nullable=True),
        _when("lease_expires_at", nullable=True),
        sa.Column("fencing_token", _bigint(), nullable=False),
        sa.Column("work_class", sa.String(32), nullable=False),
        sa.Column("run_id", sa.String(), nullable=True),
        sa.Column("trace_id", sa.String(), nullable=True),
        _when("created_at", nullable=False),
        _when("updated_at", nullable=False),
        _when("started_at", nullable=True),
        _when("finished_at", nullable=True),
        sa.Column("outcome", sa.LargeBinary(), nullable=True),
        sa.Column("outcome_hash", sa.String(64), nullable=True),
        sa.Column("outcome_retained", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("retry_after_s", sa.Float(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.CheckConstraint(f"state IN ({_STATES})", name="ck_ledger_entries_state"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("idempotency_key", "tenant", "upstream", name="uq_ledger_key_scope"),
    )
    for name, columns in (
        ("ix_ledger_entries_created", ["created_at"]),
        ("ix_ledger_entries_state_lease", ["state", "lease_expires_at"]),
        ("ix_ledger_entries_state_updated", ["state", "updated_at"]),
        ("ix_ledger_entries_tenant_created", ["tenant", "created_at"]),
        ("ix_ledger_entries_upstream_state", ["upstream", "state"]),
    ):
        op.create_index(name, "ledger_entries", columns)

    op.create_table(
        "ledger_transitions",
        sa.Column("id", _bigint(), nullable=False),
        sa.Column("entry_id", sa.String(32), nullable=False),
        sa.Column("from_state", sa.String(16), nullable=True),
        sa.Column("to_state", sa.String(16), nullable=False),
        _when("at", nullable=False),
        sa.Column("actor", sa.String(), nullable=False),
        sa.Column("reason", sa.String(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("fencing_token", _bigint(), nullable=False),
        sa.Column("evidence", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["entry_id"], ["ledger_entries.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_ledger_transitions_entry", "ledger_transitions", ["entry_id", "id"])


def downgrade() -> None:
    op.drop_table("ledger_transitions")
    op.drop_table("ledger_entries")

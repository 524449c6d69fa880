"""The ledger's schema as SQLModel tables. Only `ledger.queries` reads or writes them.

`ledger_entries` holds one row per side effect, unique on its idempotency key within its scope
(tenant, upstream): the database, not Python, decides which of two racing claims wins.
`ledger_transitions` is the append-only audit trail: one row per move, and notes for refused
reports. The Alembic migrations under `ledger/migrations/versions` create exactly these; a test
compares the two.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Dialect
from sqlmodel import Field, SQLModel

from ledger.sqlite_sql import stored_time, utc_text
from ledger.states import EntryState

__all__ = ["LedgerEntry", "LedgerTransition", "UTCTimestamp", "metadata"]

metadata = SQLModel.metadata

_STATE_CHECK = " OR ".join(f"state = '{state.value}'" for state in EntryState)
"""Comparisons, not an IN list: SQLite builds a temporary b-tree of an IN list's values for every
row it writes (revision 0004)."""
_BIGINT = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite rowids are INTEGER


class _SQLiteText(sqlite.DATETIME):
    """SQLite DATETIME whose values `UTCTimestamp` has already turned into text."""

    def bind_processor(self, dialect: Dialect) -> None:
        return None

    def result_processor(self, dialect: Dialect, coltype: object) -> None:
        return None


class UTCTimestamp(sa.TypeDecorator[datetime]):
    """An aware datetime stored in UTC: `timestamptz` on PostgreSQL; on SQLite the text
    "YYYY-MM-DD HH:MM:SS.ffffff" (SQLAlchemy's own format, so it sorts and compares as time).

    Written here rather than taken from SQLModel because every claim and finish converts a
    dozen of them: the C `isoformat`/`fromisoformat` are several times faster.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(_SQLiteText())  # type: ignore[no-untyped-call]
        return dialect.type_descriptor(sa.DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if dialect.name == "sqlite":
            return utc_text(value)
        if value.tzinfo is None:
            raise ValueError(f"ledger times must be timezone-aware, not {value!r}")
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            return stored_time(value)
        moment: datetime = value
        return moment.astimezone(UTC)


class LedgerEntry(SQLModel, table=True):
    """One side-effecting call, keyed by (tenant, upstream, idempotency key).

    Deferred work (see `ledger.deferred`) is an entry with a `task_id` and, until it has run,
    its `request`. An entry whose derived key's dedup window passed gives its key up to a newer
    entry: its `idempotency_key` becomes `past:<id>:<key>` (see `ledger.batch.archived_key`)."""

    __tablename__ = "ledger_entries"
    __table_args__ = (
        # Key first so a lookup by key alone (`ledger show KEY`) uses this index too.
        sa.UniqueConstraint("idempotency_key", "tenant", "upstream", name="uq_ledger_key_scope"),
        sa.CheckConstraint(_STATE_CHECK, name="ck_ledger_entries_state"),
        sa.Index("ix_ledger_entries_state_lease", "state", "lease_expires_at"),
        sa.Index("ix_ledger_entries_state_updated", "state", "updated_at"),
        sa.Index("ix_ledger_entries_upstream_state", "upstream", "state"),
        sa.Index("ix_ledger_entries_tenant_created", "tenant", "created_at"),
        sa.Index("ix_ledger_entries_created", "created_at"),
        # Partial: most entries have no task, and a claim should not pay for indexing a NULL.
        sa.Index(
            "uq_ledger_entries_task",
            "task_id",
            unique=True,
            sqlite_where=sa.text("task_id IS NOT NULL"),
            postgresql_where=sa.text("task_id IS NOT NULL"),
        ),
    )

    id: str = Field(primary_key=True, max_length=32)
    tenant: str
    upstream: str
    tool: str
    idempotency_key: str
    key_source: str = Field(max_length=16)
    fingerprint: str = Field(max_length=64)
    arguments: str | None = Field(default=None, sa_type=sa.Text)
    state: str = Field(max_length=16)
    attempt: int
    owner: str | None = None
    lease_expires_at: datetime | None = Field(default=None, sa_type=UTCTimestamp)
    fencing_token: int = Field(sa_type=_BIGINT)
    work_class: str = Field(max_length=32)
    run_id: str | None = None
    trace_id: str | None = None
    created_at: datetime = Field(sa_type=UTCTimestamp)
    updated_at: datetime = Field(sa_type=UTCTimestamp)
    started_at: datetime | None = Field(default=None, sa_type=UTCTimestamp)
    finished_at: datetime | None = Field(default=None, sa_type=UTCTimestamp)
    outcome: bytes | None = Field(default=None, sa_type=sa.LargeBinary)
    outcome_hash: str | None = Field(default=None, max_length=64)
    outcome_retained: bool = True
    error: str | None = Field(default=None, sa_type=sa.Text)
    retry_after_s: float | None = None
    note: str | None = Field(default=None, sa_type=sa.Text)
    operator_retries: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    task_id: str | None = Field(default=None, max_length=64)
    """The handle of deferred work (unguessable; callers read it only within their tenant), or
    `up:<upstream>:<id>` for a task the upstream itself created."""
    request: bytes | None = Field(default=None, sa_type=sa.LargeBinary)
    """Deferred work's whole request, kept until it has run (cleared when it finishes)."""


class LedgerTransition(SQLModel, table=True):
    """One appended row of an entry's history: a move, or a note when from == to."""

    __tablename__ = "ledger_transitions"
    __table_args__ = (sa.Index("ix_ledger_transitions_entry", "entry_id", "id"),)

    id: int | None = Field(default=None, primary_key=True, sa_type=_BIGINT)
    entry_id: str = Field(foreign_key="ledger_entries.id", ondelete="CASCADE", max_length=32)
    from_state: str | None = Field(default=None, max_length=16)
    to_state: str = Field(max_length=16)
    at: datetime = Field(sa_type=UTCTimestamp)
    actor: str
    reason: str
    attempt: int
    fencing_token: int = Field(sa_type=_BIGINT)
    evidence: str | None = Field(default=None, sa_type=sa.Text)
    """JSON text."""

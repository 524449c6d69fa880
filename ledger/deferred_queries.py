"""The SQL of deferred work through the toolkit, beside `ledger.queries` (same conventions).

The loaders of `ledger.deferred_rows` run these inside the PostgreSQL writer's transaction:
`accepted_counts` for `AcceptedCounts`, `load_claimable` for `ClaimableRows`, whose rows are
locked `FOR UPDATE SKIP LOCKED`: a row that another replica is claiming right now is skipped (that
replica has it), and a row this batch gets cannot change under it before COMMIT. (SQLite's
writer reads the same with plain statements: `BEGIN IMMEDIATE` already gives its batch the whole
database.) The reads serve the task routes and the dispatcher on PostgreSQL (on SQLite:
`ledger.sqlite_queries`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from ledger.batch import EntryRow, WorkingSet
from ledger.queries import ENTRIES, _rows, _select_rows
from ledger.states import EntryState
from ledger.views import UPSTREAM_TASK_PREFIX, Candidate

__all__ = [
    "accepted_counts",
    "candidates",
    "find_task",
    "list_tasks",
    "load_claimable",
    "task_owner",
]

_ACCEPTED = EntryState.ACCEPTED.value
_WAITING = sa.and_(ENTRIES.c.state == _ACCEPTED, ENTRIES.c.request.is_not(None))
"""Deferred work that has not started: accepted, with its request."""


_ADVISORY_LOCKS = sa.text(  # in the order given (sorted), in one round trip
    "SELECT pg_advisory_xact_lock(hashtextextended(name, 0)) "
    "FROM unnest(CAST(:names AS text[])) WITH ORDINALITY AS locks (name, n) ORDER BY n"
)


def accepted_counts(
    conn: sa.Connection, tenants: set[str], upstreams: set[str]
) -> dict[str, dict[str, int]]:
    """Waiting deferred work of these tenants and upstreams (`AcceptedCounts`' facts).

    Each tenant's and upstream's count is taken under a transaction-scoped advisory lock named
    for it (in one order: no deadlock between two batches), held to COMMIT: a replica counting
    the same tenant waits until this batch's new rows are committed, then counts them. Under
    READ COMMITTED, two plain counts would each miss the other's rows and both accept."""
    names = sorted(
        [f"interlock.accepted.tenant:{t}" for t in tenants]
        + [f"interlock.accepted.upstream:{u}" for u in upstreams]
    )
    if names:
        conn.execute(_ADVISORY_LOCKS, {"names": names})
    facts = {}
    for name, column, values in (
        ("accepted_by_tenant", ENTRIES.c.tenant, tenants),
        ("accepted_by_upstream", ENTRIES.c.upstream, upstreams),
    ):
        stmt = (
            sa.select(column, sa.func.count())
            .where(_WAITING, column.in_(sorted(values)))
            .group_by(column)
        )
        facts[name] = {str(key): int(n) for key, n in conn.execute(stmt)}
    return facts


def load_claimable(conn: sa.Connection, ids: set[str], ws: WorkingSet) -> None:
    """The named entries that are waiting deferred work, locked `FOR UPDATE SKIP LOCKED`, into
    `ws` (`ClaimableRows`, on PostgreSQL)."""
    stmt = _select_rows().where(_WAITING, ENTRIES.c.id.in_(sorted(ids)))
    result = conn.execute(stmt.order_by(ENTRIES.c.id).with_for_update(skip_locked=True))
    for row in _rows(result):
        if row.id not in ws.rows:
            ws.load(row)


_CANDIDATE_COLUMNS = (
    ENTRIES.c.id,
    ENTRIES.c.tenant,
    ENTRIES.c.upstream,
    ENTRIES.c.tool,
    ENTRIES.c.work_class,
    ENTRIES.c.run_id,
    ENTRIES.c.created_at,
)


async def candidates(conn: AsyncConnection, limit: int, *, per_group: int) -> list[Candidate]:
    """Waiting deferred work, oldest first, at most `per_group` calls per (tenant, upstream): a
    tenant with a flood of waiting work never hides another tenant's."""
    rank = (
        sa.func.row_number()
        .over(
            partition_by=(ENTRIES.c.tenant, ENTRIES.c.upstream),
            order_by=(ENTRIES.c.created_at, ENTRIES.c.id),
        )
        .label("rank")
    )
    ranked = sa.select(*_CANDIDATE_COLUMNS, rank).where(_WAITING).subquery()
    stmt = (
        sa.select(*(ranked.c[column.name] for column in _CANDIDATE_COLUMNS))
        .where(ranked.c.rank <= per_group)
        .order_by(ranked.c.created_at, ranked.c.id)
        .limit(limit)
    )
    return [Candidate(*values) for values in await conn.execute(stmt)]


async def find_task(conn: AsyncConnection, task_id: str, tenant: str) -> EntryRow | None:
    """The entry of task `task_id` if tenant `tenant` created it (None otherwise)."""
    stmt = _select_rows().where(ENTRIES.c.task_id == task_id, ENTRIES.c.tenant == tenant)
    rows = _rows(await conn.execute(stmt))
    return rows[0] if rows else None


async def task_owner(conn: AsyncConnection, task_id: str) -> str | None:
    """The tenant whose entry holds task `task_id` (None: no entry does)."""
    stmt = sa.select(ENTRIES.c.tenant).where(ENTRIES.c.task_id == task_id).limit(1)
    value = (await conn.execute(stmt)).scalar()
    return None if value is None else str(value)


async def list_tasks(
    conn: AsyncConnection,
    tenant: str,
    *,
    limit: int,
    before: tuple[datetime, str] | None,
    upstream: str | None = None,
) -> list[EntryRow]:
    """Tenant `tenant`'s tasks (the proxy's own; on `upstream` only, if given), newest first,
    created before `before`."""
    stmt: Any = _select_rows().where(
        ENTRIES.c.tenant == tenant,
        ENTRIES.c.task_id.is_not(None),
        ENTRIES.c.task_id.not_like(f"{UPSTREAM_TASK_PREFIX}%"),
    )
    if upstream is not None:
        stmt = stmt.where(ENTRIES.c.upstream == upstream)
    if before is not None:
        created, entry_id = before
        stmt = stmt.where(
            sa.or_(
                ENTRIES.c.created_at < created,
                sa.and_(ENTRIES.c.created_at == created, ENTRIES.c.id < entry_id),
            )
        )
    stmt = stmt.order_by(ENTRIES.c.created_at.desc(), ENTRIES.c.id.desc()).limit(limit)
    return _rows(await conn.execute(stmt))

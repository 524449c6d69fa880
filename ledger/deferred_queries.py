"""The SQL of deferred work, beside `ledger.queries` (same tables, same conventions).

Two loaders run inside the writer's transaction (see `Needs.loaders`): `AcceptedCounts` counts the
accepted work per tenant and per upstream that a batch's `Defer` operations bound, and
`ClaimableRows` reads the entries a batch's `ClaimDeferred` operations want to start, locked
`FOR UPDATE SKIP LOCKED` on PostgreSQL: a row that another replica is claiming right now is
skipped (that replica has it), and a row this batch gets cannot change under it before COMMIT.
SQLite's `BEGIN IMMEDIATE` already gives the batch the whole database. The reads serve the task
routes and the dispatcher.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Self

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from ledger.batch import EntryRow, Needs, WorkingSet
from ledger.queries import ENTRIES, _locking, _rows, _select_rows
from ledger.states import EntryState

__all__ = [
    "UPSTREAM_TASK_PREFIX",
    "AcceptedCounts",
    "Candidate",
    "ClaimableRows",
    "candidates",
    "find_task",
    "list_tasks",
    "task_owner",
]

_ACCEPTED = EntryState.ACCEPTED.value
_WAITING = sa.and_(ENTRIES.c.state == _ACCEPTED, ENTRIES.c.request.is_not(None))
"""Deferred work that has not started: accepted, with its request."""
UPSTREAM_TASK_PREFIX = "up:"
"""Task ids the ledger keeps for tasks an upstream created (`up:<upstream>:<its id>`); the
proxy's own are URL-safe base64, which never contains ':'."""


class _BatchLoader:
    """A loader the operations of one batch share: `of(needs)` is the batch's one instance."""

    __slots__ = ()

    @classmethod
    def of(cls, needs: Needs) -> Self:
        """The batch's loader (one per batch, whatever the number of operations)."""
        for existing in needs.loaders:
            if isinstance(existing, cls):
                return existing
        loader = cls()
        needs.loaders.append(loader)
        return loader

    def __call__(self, conn: sa.Connection, ws: WorkingSet, *, now: datetime, dialect: str) -> None:
        raise NotImplementedError


@dataclass(slots=True)
class AcceptedCounts(_BatchLoader):
    """Loader: waiting deferred work per tenant and per upstream, into `ws.facts`
    (`accepted_by_tenant`, `accepted_by_upstream`)."""

    tenants: set[str] = field(default_factory=set)
    upstreams: set[str] = field(default_factory=set)

    def add(self, tenant: str, upstream: str) -> None:
        self.tenants.add(tenant)
        self.upstreams.add(upstream)

    def __call__(self, conn: sa.Connection, ws: WorkingSet, *, now: datetime, dialect: str) -> None:
        del now, dialect
        for name, column, values in (
            ("accepted_by_tenant", ENTRIES.c.tenant, self.tenants),
            ("accepted_by_upstream", ENTRIES.c.upstream, self.upstreams),
        ):
            stmt = (
                sa.select(column, sa.func.count())
                .where(_WAITING, column.in_(sorted(values)))
                .group_by(column)
            )
            ws.facts[name] = {str(key): int(n) for key, n in conn.execute(stmt)}


@dataclass(slots=True)
class ClaimableRows(_BatchLoader):
    """Loader: the named entries that are waiting deferred work, each locked by this batch or
    left out (another replica is claiming it)."""

    ids: set[str] = field(default_factory=set)

    def add(self, entry_id: str) -> None:
        self.ids.add(entry_id)

    def __call__(self, conn: sa.Connection, ws: WorkingSet, *, now: datetime, dialect: str) -> None:
        del now
        stmt = _select_rows().where(_WAITING, ENTRIES.c.id.in_(sorted(self.ids)))
        result = conn.execute(_locking(stmt.order_by(ENTRIES.c.id), dialect, skip_locked=True))
        for row in _rows(result):
            if row.id not in ws.rows:
                ws.load(row)


@dataclass(frozen=True, slots=True)
class Candidate:
    """Waiting deferred work as the dispatcher sees it (without its request)."""

    entry_id: str
    tenant: str
    upstream: str
    tool: str
    work_class: str
    run_id: str | None
    created_at: datetime


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

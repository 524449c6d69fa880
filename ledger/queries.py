"""The ledger's statements through SQLAlchemy Core (the query toolkit), for a PostgreSQL ledger.

The reads (`find_entry`, `list_entries`, …) are async; a SQLite ledger's are
`ledger.sqlite_queries`, plain SQL that answers the same (a test reads one database both ways).
`load` reads the rows of a PostgreSQL write batch that sweeps, purges or runs an operation's own
loader (`ledger.pg_transactions`: not the hot path, whose statements are plain SQL in
`ledger.pg_sql`, as are every batch's writes; a SQLite batch reads all of these with
`ledger.sqlite_sql`). Rows a batch will change are read with `FOR UPDATE`, so the decisions made
in Python cannot be raced by another process before the commit.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from ledger.batch import ROW_FIELDS, EntryRow, Needs, WorkingSet
from ledger.errors import EntryNotFound
from ledger.states import PURGEABLE, EntryState
from ledger.tables import metadata
from ledger.views import (
    FIND_LIMIT,
    ReferenceKind,
    TransitionView,
    one_entry,
    reference_lookups,
)

__all__ = [
    "count_by_state",
    "database_now",
    "find_entry",
    "history",
    "list_entries",
    "load_rest",
    "lock_named",
    "ping",
    "stats",
]

ENTRIES = metadata.tables["ledger_entries"]
TRANSITIONS = metadata.tables["ledger_transitions"]
_ROW_COLUMNS = [ENTRIES.c[name] for name in ROW_FIELDS]  # in EntryRow's field order
_entry_row: Callable[..., EntryRow] = EntryRow  # built positionally from a row's values


def _select_rows() -> sa.Select[Any]:
    return sa.select(*_ROW_COLUMNS)


def _rows(result: sa.Result[Any]) -> list[EntryRow]:
    return [_entry_row(*values) for values in result]


_PG_NOW = sa.text("SELECT clock_timestamp()")


def database_now(conn: sa.Connection) -> datetime:
    """PostgreSQL's clock (`clock_timestamp()`), timezone-aware UTC. SQLite's is
    `ledger.sqlite_sql.database_now`."""
    moment: datetime = conn.execute(_PG_NOW).scalar_one()
    return moment.astimezone(UTC)


def lock_named(conn: sa.Connection, needs: Needs, ws: WorkingSet) -> None:
    """Read and lock (in id order) the rows `needs` names by id and by key into `ws` (the
    PostgreSQL writer's full batches; `ledger.sqlite_sql.load` reads the same on SQLite). This
    may wait for another transaction's locks: the batch reads its time after it."""
    named: list[sa.ColumnElement[bool]] = []
    if needs.ids:
        named.append(ENTRIES.c.id.in_(sorted(needs.ids)))
    if needs.keys:
        # The key is the unique index's first column; the scope filters narrow what is locked,
        # and `ws.find` matches the exact (tenant, upstream, key) triples.
        tenants, upstreams, keys = (sorted(set(part)) for part in zip(*needs.keys, strict=True))
        named.append(
            sa.and_(
                ENTRIES.c.idempotency_key.in_(keys),
                ENTRIES.c.tenant.in_(tenants),
                ENTRIES.c.upstream.in_(upstreams),
            )
        )
    if named:
        # One statement, so every row is locked in id order whether named by id or by key, as
        # the plain path (`ledger.pg_sql`) locks them: two batches never wait for each other
        # crosswise (a deadlock PostgreSQL breaks only after `deadlock_timeout`, 1 s).
        stmt = _select_rows().where(sa.or_(*named)).order_by(ENTRIES.c.id).with_for_update()
        for row in _rows(conn.execute(stmt)):
            ws.load(row)


def load_rest(conn: sa.Connection, needs: Needs, ws: WorkingSet, *, now: datetime) -> None:
    """After `lock_named`, with the batch's time: the closed rows old enough to purge (ids
    only), the running rows whose lease had expired by `now` (the sweep), then the loaders."""
    if needs.purge is not None:
        older_than, limit = needs.purge
        # No ORDER BY: any `limit` closed rows will do, found without sorting them all.
        stmt = (
            sa.select(ENTRIES.c.id)
            .where(ENTRIES.c.state.in_(sorted(PURGEABLE)), ENTRIES.c.updated_at < now - older_than)
            .limit(limit)
        )
        ws.purgeable.extend(conn.execute(stmt.with_for_update(skip_locked=True)).scalars())
    if needs.sweep_limit:
        stmt = (
            _select_rows()
            .where(ENTRIES.c.state == EntryState.RUNNING, ENTRIES.c.lease_expires_at < now)
            .order_by(ENTRIES.c.id)
            .limit(needs.sweep_limit)
        )
        # Skip rows another replica holds: it is finishing, renewing or sweeping them itself.
        result = conn.execute(stmt.with_for_update(skip_locked=True))
        for row in _rows(result):
            if row.id not in ws.rows:
                ws.load(row)
            ws.expired.append(row.id)
    for loader in needs.loaders:
        loader.on_postgres(conn, ws)


async def ping(conn: AsyncConnection) -> None:
    """One round trip that touches the ledger's table."""
    await conn.execute(sa.select(sa.func.count()).select_from(ENTRIES).where(sa.false()))


async def find_entry(conn: AsyncConnection, reference: str) -> EntryRow:
    """The entry named by an id, an idempotency key, or a unique id prefix (≥ 6 hex digits).

    Raises:
        EntryNotFound: nothing matches.
        AmbiguousReference: the key or prefix names several entries.
    """
    for kind, value in reference_lookups(reference):
        stmt = _select_rows().where(_reference_condition(kind, value))
        rows = _rows(await conn.execute(stmt.order_by(ENTRIES.c.id).limit(FIND_LIMIT)))
        if (found := one_entry(reference, rows)) is not None:
            return found
    raise EntryNotFound(reference)


def _reference_condition(kind: ReferenceKind, value: str) -> sa.ColumnElement[bool]:
    if kind == "id":
        return ENTRIES.c.id == value
    if kind == "key":
        return ENTRIES.c.idempotency_key == value
    return ENTRIES.c.id.startswith(value, autoescape=True)


async def history(conn: AsyncConnection, entry_id: str) -> list[TransitionView]:
    """An entry's history rows, oldest first."""
    stmt = (
        sa.select(TRANSITIONS).where(TRANSITIONS.c.entry_id == entry_id).order_by(TRANSITIONS.c.id)
    )
    return [_transition(m) for m in (await conn.execute(stmt)).mappings()]


def _transition(m: sa.RowMapping) -> TransitionView:
    return TransitionView(
        id=m["id"],
        entry_id=m["entry_id"],
        from_state=None if m["from_state"] is None else EntryState(m["from_state"]),
        to_state=EntryState(m["to_state"]),
        at=m["at"],
        actor=m["actor"],
        reason=m["reason"],
        attempt=m["attempt"],
        fencing_token=m["fencing_token"],
        evidence=None if m["evidence"] is None else json.loads(m["evidence"]),
    )


async def list_entries(
    conn: AsyncConnection,
    *,
    states: Sequence[str] = (),
    upstream: str | None = None,
    tenant: str | None = None,
    since: datetime | None = None,
    limit: int = 100,
) -> list[EntryRow]:
    """Entries matching every given filter, newest first."""
    stmt = _select_rows()
    if states:
        stmt = stmt.where(ENTRIES.c.state.in_(list(states)))
    if upstream is not None:
        stmt = stmt.where(ENTRIES.c.upstream == upstream)
    if tenant is not None:
        stmt = stmt.where(ENTRIES.c.tenant == tenant)
    if since is not None:
        stmt = stmt.where(ENTRIES.c.created_at >= since)
    stmt = stmt.order_by(ENTRIES.c.created_at.desc(), ENTRIES.c.id.desc()).limit(limit)
    return _rows(await conn.execute(stmt))


async def stats(conn: AsyncConnection) -> dict[tuple[str, str], int]:
    """Entry counts by (state, upstream)."""
    stmt = sa.select(ENTRIES.c.state, ENTRIES.c.upstream, sa.func.count()).group_by(
        ENTRIES.c.state, ENTRIES.c.upstream
    )
    return {(state, upstream): n for state, upstream, n in await conn.execute(stmt)}


async def count_by_state(conn: AsyncConnection) -> dict[str, int]:
    """Entry counts by state."""
    stmt = sa.select(ENTRIES.c.state, sa.func.count()).group_by(ENTRIES.c.state)
    return {str(state): int(n) for state, n in await conn.execute(stmt)}


async def oldest_change(conn: AsyncConnection, state: str) -> datetime | None:
    """When the entry in `state` that changed least recently last changed (None: no such entry)."""
    stmt = sa.select(sa.func.min(ENTRIES.c.updated_at)).where(ENTRIES.c.state == state)
    value = (await conn.execute(stmt)).scalar()
    return value if isinstance(value, datetime) else None

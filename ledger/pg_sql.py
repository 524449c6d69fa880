"""The PostgreSQL writer's statements as plain SQL on its asyncpg connection.

Each statement is a fixed string (one per shape of batch) that asyncpg prepares once per
connection, and every multi-row write is over arrays (`unnest`), however many operations the batch
holds. A batch whose operations only name rows by id or key costs four round trips: BEGIN; one
statement that reads the database's clock and reads and locks (`FOR UPDATE`, in id order) every
row the batch names; one statement that writes the changed rows, the new rows and the history
rows (data-modifying CTEs); COMMIT. The Python decisions sit between the read and the writes, so
those cannot be one statement, and COMMIT cannot travel with parameters (asyncpg sends a
statement with parameters alone, through the extended protocol).

Arrays are cast to the columns' base types (`text`, not `varchar(n)`): an explicit cast to
`varchar(n)` would silently truncate, where the column's own assignment cast refuses.
"""

from __future__ import annotations

import functools
import operator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ledger.batch import ROW_FIELDS, EntryRow, Needs, WorkingSet

if TYPE_CHECKING:  # the driver itself is loaded only for a PostgreSQL ledger (by its engine)
    import asyncpg

__all__ = ["begin", "commit", "flush", "load", "rollback"]

_COLUMNS = ", ".join(ROW_FIELDS)
_row_tuple = operator.attrgetter(*ROW_FIELDS)
_TEXT, _INT, _BIGINT, _TIME = "text", "int4", "int8", "timestamptz"
_TYPES = {  # each column's base type (the table is `ledger.tables.LedgerEntry`)
    **dict.fromkeys(ROW_FIELDS, _TEXT),
    **dict.fromkeys(("attempt", "operator_retries"), _INT),
    "fencing_token": _BIGINT,
    **dict.fromkeys(
        ("lease_expires_at", "created_at", "updated_at", "started_at", "finished_at"), _TIME
    ),
    **dict.fromkeys(("outcome", "request"), "bytea"),
    "outcome_retained": "bool",
    "retry_after_s": "float8",
}
_HISTORY_TYPES = {
    "entry_id": _TEXT,
    "from_state": _TEXT,
    "to_state": _TEXT,
    "at": _TIME,
    "actor": _TEXT,
    "reason": _TEXT,
    "attempt": _INT,
    "fencing_token": _BIGINT,
    "evidence": _TEXT,
}


def _arrays(types: list[str], first: int = 1) -> str:
    return ", ".join(f"${n}::{t}[]" for n, t in enumerate(types, start=first))


# The exact (key, tenant, upstream) triples are matched by a filter the planner cannot use an index
# for: with a generic plan and no statistics yet, an indexable tenant or upstream condition can
# lead it to scan every row of the one tenant rather than probe the unique index by key.
_LOAD = f"""
WITH locked AS MATERIALIZED (
    SELECT {_COLUMNS} FROM ledger_entries
    WHERE id = ANY($1::text[])
       OR (idempotency_key = ANY($2::text[]) AND (idempotency_key, tenant, upstream)
           IN (SELECT * FROM unnest($2::text[], $3::text[], $4::text[])))
    ORDER BY id FOR UPDATE
)
SELECT clock_timestamp(), locked.* FROM (VALUES (1)) AS one (x) LEFT JOIN locked ON true
"""
_HISTORY_COLUMNS = ", ".join(_HISTORY_TYPES)
_history_tuple = operator.itemgetter(*_HISTORY_TYPES)
_DELETE = "DELETE FROM ledger_entries WHERE id = ANY($1::text[])"


async def begin(conn: asyncpg.Connection) -> None:
    """BEGIN, and (in the same round trip) keep this transaction's plans off sequential scans.

    Every statement here names its rows by id or key. A prepared statement's generic plan is
    kept for the connection's life: planned while the table was small, a sequential scan would
    stay, and read the whole table at every batch once it has grown.
    """
    await conn.execute("BEGIN; SET LOCAL enable_seqscan = off")


async def commit(conn: asyncpg.Connection) -> None:
    await conn.execute("COMMIT")


async def rollback(conn: asyncpg.Connection) -> None:
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


async def load(conn: asyncpg.Connection, needs: Needs, ws: WorkingSet) -> datetime:
    """Read and lock every row `needs.ids` and `needs.keys` name into `ws`, in one round trip;
    return the database's clock, read once the rows are locked."""
    triples = sorted(needs.keys)
    tenants = [tenant for tenant, _, _ in triples]
    upstreams = [upstream for _, upstream, _ in triples]
    keys = [key for _, _, key in triples]
    records = await conn.fetch(_LOAD, sorted(needs.ids), keys, tenants, upstreams)
    # Each row is locked as the read reaches it, and each output row's clock is read after its
    # lock: the latest is the time after every lock (and every wait for one) this read took.
    now: datetime | None = None
    for record in records:
        now = record[0] if now is None else max(now, record[0])
        if record[1] is not None:  # the one row of an empty read is all NULL but the clock
            ws.load(EntryRow(*record[1:]))
    if now is None:
        raise RuntimeError("the ledger's read returned no row")
    return now


async def flush(conn: asyncpg.Connection, ws: WorkingSet) -> bool:
    """Write the batch's changed rows, new rows and history rows in one statement (its parts
    as data-modifying CTEs), then its deletions.

    Returns False, having written only part of the batch, when another transaction committed one
    of the new keys first: the caller rolls back and runs the batch again, which then sees it.
    """
    groups: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
    for row_id in sorted(ws.dirty):
        changes = ws.changes(row_id)
        groups.setdefault(tuple(changes), []).append((row_id, *changes.values()))
    if ws.new_ids and any("idempotency_key" in columns for columns in groups):
        # A row gives its key up to a new row of this batch: that update lands first, in a
        # statement of its own, so the new row's insert meets the unique index already changed.
        for columns, rows in groups.items():
            await conn.execute(_update_by_id(columns), *_columns_of(rows, len(columns) + 1))
        groups = {}
    new_rows = ws.new_rows()
    if groups or new_rows or ws.history:
        args: list[list[Any]] = []
        for columns, rows in groups.items():
            args.extend(_columns_of(rows, len(columns) + 1))
        if new_rows:
            args.extend(_columns_of([_row_tuple(r) for r in new_rows], len(ROW_FIELDS)))
        if ws.history:
            history = [_history_tuple(h) for h in ws.history]
            args.extend(_columns_of(history, len(_HISTORY_TYPES)))
            if new_rows:
                args.append([r.id for r in new_rows])
        sql = _writes(tuple(groups), bool(new_rows), bool(ws.history))
        if await conn.fetchval(sql, *args) != len(new_rows):
            return False
    if ws.deleted:
        # Their history goes with them (ON DELETE CASCADE).
        await conn.execute(_DELETE, sorted(ws.deleted))
    return True


@functools.lru_cache(maxsize=128)
def _writes(groups: tuple[tuple[str, ...], ...], new: bool, history: bool) -> str:
    """The statement writing a batch: an UPDATE per group of changed columns, the INSERT of the
    new rows, the INSERT of the history rows; it returns how many new rows went in.

    History rows of new rows that did not go in (a lost key race) are left out, so that their
    foreign key does not fail the statement: the caller rolls it back and reruns the batch.
    """
    parts: list[str] = []
    n = 1
    for i, columns in enumerate(groups):
        parts.append(f"u{i} AS ({_update_by_id(columns, n)})")
        n += 1 + len(columns)
    if new:
        parts.append(
            f"inserted AS (INSERT INTO ledger_entries ({_COLUMNS}) "
            f"SELECT * FROM unnest({_arrays([_TYPES[name] for name in ROW_FIELDS], n)}) "
            "ON CONFLICT DO NOTHING RETURNING id)"
        )
        n += len(ROW_FIELDS)
    if history:
        arrays = _arrays(list(_HISTORY_TYPES.values()), n)
        n += len(_HISTORY_TYPES)
        keep = (
            f"WHERE h.entry_id = ANY(ARRAY(SELECT id FROM inserted)) "
            f"OR h.entry_id <> ALL(${n}::text[]) "
            if new
            else ""
        )
        parts.append(
            f"history AS (INSERT INTO ledger_transitions ({_HISTORY_COLUMNS}) "
            f"SELECT {_HISTORY_COLUMNS} FROM unnest({arrays}) "
            f"WITH ORDINALITY AS h ({_HISTORY_COLUMNS}, n) {keep}"
            "ORDER BY n)"  # ids in the batch's order
        )
    counted = "SELECT count(*) FROM inserted" if new else "SELECT 0"
    return f"WITH {', '.join(parts)} {counted}"


def _columns_of(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Rows turned into one list per column (the arrays `unnest` takes)."""
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[]] * width


@functools.lru_cache(maxsize=64)
def _update_by_id(columns: tuple[str, ...], first: int = 1) -> str:
    """UPDATE of these columns of many rows by id, from one array per column (the ids', then
    each column's), numbered from parameter `first`."""
    names = ["id", *columns]
    assignments = ", ".join(f"{name} = u.{name}" for name in columns)
    return (
        f"UPDATE ledger_entries AS e SET {assignments} "
        f"FROM unnest({_arrays([_TYPES[name] for name in names], first)}) "
        f"AS u ({', '.join(names)}) WHERE e.id = u.id"
    )

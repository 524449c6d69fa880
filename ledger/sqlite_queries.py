"""The ledger's reads as plain SQL on a SQLite connection: what `ledger.queries` and
`ledger.deferred_queries` read through the query toolkit, for a SQLite ledger.

Each function takes a stdlib `sqlite3` connection (the reader thread's: `ledger.sqlite_reads`) and
answers with the same values as its toolkit twin; a test reads one database both ways and compares.
Times are bound and read as the UTC text `ledger.tables.UTCTimestamp` stores.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from typing import Any

from ledger.batch import EntryRow
from ledger.errors import EntryNotFound
from ledger.revisions import VERSION_TABLE
from ledger.sqlite_sql import COLUMNS, WAITING, entry_row, marks, stored_time, utc_text
from ledger.states import EntryState
from ledger.views import (
    FIND_LIMIT,
    UPSTREAM_TASK_PREFIX,
    Candidate,
    EntryFilter,
    TransitionView,
    one_entry,
    reference_lookups,
)

__all__ = [
    "candidates",
    "count_by_state",
    "find_entry",
    "find_task",
    "history",
    "list_entries",
    "list_tasks",
    "oldest_change",
    "ping",
    "revision",
    "stats",
    "task_owner",
]

_REFERENCE = {"id": "id = ?", "key": "idempotency_key = ?", "prefix": "id >= ? AND id < ?"}
_HISTORY_COLUMNS = (
    "id, entry_id, from_state, to_state, at, actor, reason, attempt, fencing_token, evidence"
)
# At most `per_group` calls per (tenant, upstream), oldest first: a tenant with a flood of waiting
# work never hides another tenant's.
_CANDIDATES = f"""
SELECT id, tenant, upstream, tool, work_class, run_id, created_at FROM (
    SELECT id, tenant, upstream, tool, work_class, run_id, created_at, row_number() OVER (
        PARTITION BY tenant, upstream ORDER BY created_at, id
    ) AS rank
    FROM ledger_entries WHERE {WAITING}
) WHERE rank <= ? ORDER BY created_at, id LIMIT ?
"""
_NEWEST_FIRST = "ORDER BY created_at DESC, id DESC LIMIT ?"


def ping(conn: sqlite3.Connection) -> None:
    """One read that touches the ledger's table."""
    conn.execute("SELECT count(*) FROM ledger_entries WHERE 0").fetchall()


def revision(conn: sqlite3.Connection) -> str | None:
    """The schema's revision, or None when the database has never been migrated."""
    found = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    if conn.execute(found, (VERSION_TABLE,)).fetchone() is None:
        return None
    row = conn.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchone()
    return None if row is None else str(row[0])


def count_by_state(conn: sqlite3.Connection) -> dict[str, int]:
    """Entry counts by state (only the states that have entries)."""
    stmt = "SELECT state, count(*) FROM ledger_entries GROUP BY state"
    return {str(state): int(n) for state, n in conn.execute(stmt)}


def stats(conn: sqlite3.Connection) -> dict[tuple[str, str], int]:
    """Entry counts by (state, upstream)."""
    stmt = "SELECT state, upstream, count(*) FROM ledger_entries GROUP BY state, upstream"
    return {(str(state), str(upstream)): int(n) for state, upstream, n in conn.execute(stmt)}


def oldest_change(conn: sqlite3.Connection, state: str) -> datetime | None:
    """When the entry in `state` that changed least recently last changed (None: no entry)."""
    stmt = "SELECT min(updated_at) FROM ledger_entries WHERE state = ?"
    (text,) = conn.execute(stmt, (state,)).fetchone()
    return None if text is None else stored_time(text)


def find_entry(conn: sqlite3.Connection, reference: str) -> EntryRow:
    """The entry named by an id, an idempotency key, or a unique id prefix (≥ 6 hex digits).

    Raises:
        EntryNotFound: nothing matches.
        AmbiguousReference: the key or prefix names several entries.
    """
    for kind, value in reference_lookups(reference):
        stmt = f"SELECT {COLUMNS} FROM ledger_entries WHERE {_REFERENCE[kind]} ORDER BY id LIMIT ?"
        # Ids are lowercase hex, all below "g": the ids that start with a prefix are exactly
        # those in [prefix, prefix + "g"), found through the primary key (a LIKE reads them all).
        values = (value, f"{value}g") if kind == "prefix" else (value,)
        rows = [entry_row(row) for row in conn.execute(stmt, (*values, FIND_LIMIT))]
        if (found := one_entry(reference, rows)) is not None:
            return found
    raise EntryNotFound(reference)


def history(conn: sqlite3.Connection, entry_id: str) -> list[TransitionView]:
    """An entry's history rows, oldest first."""
    stmt = f"SELECT {_HISTORY_COLUMNS} FROM ledger_transitions WHERE entry_id = ? ORDER BY id"
    return [
        TransitionView(
            id=row_id,
            entry_id=entry,
            from_state=None if from_state is None else EntryState(from_state),
            to_state=EntryState(to_state),
            at=stored_time(at),
            actor=actor,
            reason=reason,
            attempt=attempt,
            fencing_token=token,
            evidence=None if evidence is None else json.loads(evidence),
        )
        for row_id, entry, from_state, to_state, at, actor, reason, attempt, token, evidence in (
            conn.execute(stmt, (entry_id,))
        )
    ]


def list_entries(conn: sqlite3.Connection, wanted: EntryFilter) -> list[EntryRow]:
    """The entries `wanted` asks for, newest first."""
    where: list[str] = []
    params: list[Any] = []
    if wanted.states:
        where.append(f"state IN ({marks(len(wanted.states))})")
        params.extend(wanted.states)
    for column, value in (("upstream", wanted.upstream), ("tenant", wanted.tenant)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if wanted.since is not None:
        where.append("created_at >= ?")
        params.append(utc_text(wanted.since))
    return _entries(conn, where, params, wanted.limit)


def candidates(conn: sqlite3.Connection, limit: int, per_group: int) -> list[Candidate]:
    """Waiting deferred work, oldest first, at most `per_group` calls per (tenant, upstream)."""
    return [
        Candidate(entry_id, tenant, upstream, tool, work_class, run_id, stored_time(created))
        for entry_id, tenant, upstream, tool, work_class, run_id, created in conn.execute(
            _CANDIDATES, (per_group, limit)
        )
    ]


def task_owner(conn: sqlite3.Connection, task_id: str) -> str | None:
    """The tenant whose entry holds task `task_id` (None: no entry does)."""
    stmt = "SELECT tenant FROM ledger_entries WHERE task_id = ? LIMIT 1"
    row = conn.execute(stmt, (task_id,)).fetchone()
    return None if row is None else str(row[0])


def find_task(conn: sqlite3.Connection, task_id: str, tenant: str) -> EntryRow | None:
    """The entry of task `task_id` if tenant `tenant` created it (None otherwise)."""
    stmt = f"SELECT {COLUMNS} FROM ledger_entries WHERE task_id = ? AND tenant = ?"
    row = conn.execute(stmt, (task_id, tenant)).fetchone()
    return None if row is None else entry_row(row)


def list_tasks(
    conn: sqlite3.Connection,
    tenant: str,
    limit: int,
    before: tuple[datetime, str] | None,
    upstream: str | None,
) -> list[EntryRow]:
    """Tenant `tenant`'s tasks (the proxy's own; on `upstream` only, if given), newest first,
    created before `before`."""
    where = ["tenant = ?", "task_id IS NOT NULL", "task_id NOT LIKE ?"]
    params: list[Any] = [tenant, f"{UPSTREAM_TASK_PREFIX}%"]
    if upstream is not None:
        where.append("upstream = ?")
        params.append(upstream)
    if before is not None:
        created, entry_id = before
        text = utc_text(created)
        where.append("(created_at < ? OR (created_at = ? AND id < ?))")
        params.extend((text, text, entry_id))
    return _entries(conn, where, params, limit)


def _entries(
    conn: sqlite3.Connection, where: list[str], params: list[Any], limit: int
) -> list[EntryRow]:
    condition = f"WHERE {' AND '.join(where)} " if where else ""
    stmt = f"SELECT {COLUMNS} FROM ledger_entries {condition}{_NEWEST_FIRST}"
    return [entry_row(values) for values in conn.execute(stmt, (*params, limit))]

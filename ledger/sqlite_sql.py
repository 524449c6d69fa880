"""The SQLite writer's statements as plain SQL on its stdlib `sqlite3` connection.

A batch's hot statements (begin, the clock, reading the rows its operations name, writing the
result) are fixed strings, prepared once by `sqlite3`'s own statement cache and bound with plain
tuples: no SQLAlchemy compile or parameter processing per batch. Values are converted as
`ledger.tables` stores them: times as UTC text "YYYY-MM-DD HH:MM:SS.ffffff", booleans as 0/1,
states as their text. Only plain `str`, `int` and `float` values bind at the driver's C speed
(anything else, `None` included, goes through its adapter lookup: about half a microsecond each,
and a new entry has a dozen NULL columns), so a NULL is written as a literal in the statement:
rows are grouped by which of their values are set, one prepared statement per shape.

The lease sweep's and the purge's reads and deferred work's loaders are plain statements too, so
a SQLite proxy's writer never needs the query toolkit (`ledger.queries` reads the same on
PostgreSQL, locking what it reads).

Everything here runs on the writer's thread, inside the transaction `begin` opened:
`BEGIN IMMEDIATE` takes the database's write lock before anything is read, so the rows read
cannot change under the batch's decisions before COMMIT.
"""

from __future__ import annotations

import functools
import itertools
import operator
import sqlite3
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from ledger.batch import ROW_FIELDS, EntryRow, Needs, WorkingSet
from ledger.states import PURGEABLE, EntryState

__all__ = [
    "COLUMNS",
    "WAITING",
    "TimeTexts",
    "accepted_counts",
    "begin",
    "commit",
    "database_now",
    "entry_row",
    "flush",
    "load",
    "load_claimable",
    "marks",
    "rollback",
    "stored_time",
    "utc_text",
]

COLUMNS = ", ".join(ROW_FIELDS)
_TIME_FIELDS = frozenset(
    {"lease_expires_at", "created_at", "updated_at", "started_at", "finished_at"}
)
_TIME_INDEXES = tuple(i for i, name in enumerate(ROW_FIELDS) if name in _TIME_FIELDS)
_RETAINED = ROW_FIELDS.index("outcome_retained")
_CONVERTED = tuple(
    i
    for i, name in enumerate(ROW_FIELDS)
    if name in _TIME_FIELDS or name in ("state", "outcome_retained")
)
"""The columns whose values `_column_value` converts (the others are bound as they are)."""
_TEXT_LENGTH = len("2030-01-01 00:00:00.000000")
_row_tuple = operator.attrgetter(*ROW_FIELDS)
_HISTORY_FIELDS = (
    "entry_id",
    "from_state",
    "to_state",
    "at",
    "actor",
    "reason",
    "attempt",
    "fencing_token",
    "evidence",
)
_history_tuple = operator.itemgetter(*_HISTORY_FIELDS)
_AT = _HISTORY_FIELDS.index("at")
_FROM_STATE = _HISTORY_FIELDS.index("from_state")
_TO_STATE = _HISTORY_FIELDS.index("to_state")
_NONES = (None,) * max(len(ROW_FIELDS), len(_HISTORY_FIELDS))
Shape = tuple[bool, ...]
"""Which of a row's values are set (bound as `?`); the others are NULL literals."""
_NOW = "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')"
_PURGEABLE = (
    "SELECT id FROM ledger_entries WHERE state IN "
    f"({', '.join(repr(str(state)) for state in sorted(PURGEABLE))}) AND updated_at < ? LIMIT ?"
)
_EXPIRED = (
    f"SELECT {COLUMNS} FROM ledger_entries WHERE state = '{EntryState.RUNNING.value}' "
    "AND lease_expires_at < ? ORDER BY id LIMIT ?"
)
WAITING = f"state = '{EntryState.ACCEPTED.value}' AND request IS NOT NULL"
"""Deferred work that has not started: accepted, with its request."""


def begin(conn: sqlite3.Connection) -> None:
    """Open the batch's transaction holding the write lock (waits up to the busy timeout)."""
    conn.execute("BEGIN IMMEDIATE")


def commit(conn: sqlite3.Connection) -> None:
    conn.execute("COMMIT")


def rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def database_now(conn: sqlite3.Connection) -> datetime:
    """The host's clock as SQLite reads it, to the millisecond, timezone-aware UTC."""
    (text,) = conn.execute(_NOW).fetchone()
    return stored_time(text)


def load(
    conn: sqlite3.Connection, needs: Needs, ws: WorkingSet, *, now: datetime, text: TimeTexts
) -> None:
    """Read everything `needs` names into `ws`: the closed rows old enough to purge (ids only),
    the rows named by id and by key, the running rows whose lease had expired by `now` (the
    sweep), then what the loaders read. (`ledger.queries` reads the same on
    PostgreSQL.)"""
    if needs.purge is not None:
        older_than, limit = needs.purge
        # No ORDER BY: any `limit` closed rows will do, found without sorting them all.
        found = conn.execute(_PURGEABLE, (text(now - older_than), limit))
        ws.purgeable.extend(row_id for (row_id,) in found)
    if needs.ids:
        ids = sorted(needs.ids)
        _load_rows(conn, _select_by_ids(len(ids)), ids, ws)
    if needs.keys:
        # The key is the unique index's first column; the scope filters narrow what is read,
        # and `ws.find` matches the exact (tenant, upstream, key) triples.
        tenants, upstreams, keys = (sorted(set(part)) for part in zip(*needs.keys, strict=True))
        sql = _select_by_keys(len(keys), len(tenants), len(upstreams))
        _load_rows(conn, sql, [*keys, *tenants, *upstreams], ws)
    if needs.sweep_limit:
        expired = _load_rows(conn, _EXPIRED, [text(now), needs.sweep_limit], ws)
        ws.expired.extend(row.id for row in expired)
    for loader in needs.loaders:
        loader.on_sqlite(conn, ws)


def accepted_counts(
    conn: sqlite3.Connection, tenants: set[str], upstreams: set[str]
) -> dict[str, dict[str, int]]:
    """Waiting deferred work of these tenants and upstreams (`AcceptedCounts`' facts)."""
    facts = {}
    for name, column, values in (
        ("accepted_by_tenant", "tenant", sorted(tenants)),
        ("accepted_by_upstream", "upstream", sorted(upstreams)),
    ):
        sql = (
            f"SELECT {column}, count(*) FROM ledger_entries WHERE {WAITING} "
            f"AND {column} IN ({marks(len(values))}) GROUP BY {column}"
        )
        facts[name] = {str(key): int(n) for key, n in conn.execute(sql, values)}
    return facts


def load_claimable(conn: sqlite3.Connection, ids: set[str], ws: WorkingSet) -> None:
    """The named entries that are waiting deferred work, into `ws` (`ClaimableRows`)."""
    wanted = sorted(ids)
    sql = (
        f"SELECT {COLUMNS} FROM ledger_entries WHERE {WAITING} "
        f"AND id IN ({marks(len(wanted))}) ORDER BY id"
    )
    _load_rows(conn, sql, wanted, ws)


def flush(conn: sqlite3.Connection, ws: WorkingSet, text: TimeTexts) -> bool:
    """Write the batch's changed rows, new rows, history rows and deletions.

    Returns False, having written only part of the batch, when another transaction committed one
    of the new keys first: the caller rolls back and runs the batch again, which then sees it.
    """
    by_columns: dict[tuple[tuple[str, ...], Shape], list[list[Any]]] = {}
    for row_id in sorted(ws.dirty):
        columns, shape, params = _update_values(ws.changes(row_id), text)
        params.append(row_id)
        by_columns.setdefault((columns, shape), []).append(params)
    for (columns, shape), params_list in by_columns.items():
        conn.executemany(_update_by_id(columns, shape), params_list)
    # After the updates: a row whose key a new row takes over has given it up by now.
    if ws.new_ids and not _insert_new(conn, ws, text):
        return False
    if ws.history:
        history = (_history_values(h, text) for h in ws.history)
        for shape, params_list in _by_shape(history).items():
            conn.executemany(_insert_history(shape), params_list)
    if ws.deleted:
        # Their history goes with them (ON DELETE CASCADE).
        ids = sorted(ws.deleted)
        conn.execute(f"DELETE FROM ledger_entries WHERE id IN ({marks(len(ids))})", ids)
    return True


def _insert_new(conn: sqlite3.Connection, ws: WorkingSet, text: TimeTexts) -> bool:
    new_rows = ws.new_rows()
    inserted = 0
    for shape, params_list in _by_shape(_entry_values(r, text) for r in new_rows).items():
        inserted += conn.executemany(_insert_entry(shape), params_list).rowcount
    return inserted == len(new_rows)


def _entry_values(row: EntryRow, text: TimeTexts) -> list[Any]:
    """A new row's values as they are bound (see the module docstring)."""
    values = list(_row_tuple(row))
    for i in _CONVERTED:
        if (value := values[i]) is not None:
            values[i] = _column_value(ROW_FIELDS[i], value, text)
    return values


def _history_values(history: dict[str, Any], text: TimeTexts) -> list[Any]:
    """A history row's values as they are bound."""
    values = list(_history_tuple(history))
    values[_AT] = text(values[_AT])
    values[_TO_STATE] = str(values[_TO_STATE])
    if values[_FROM_STATE] is not None:
        values[_FROM_STATE] = str(values[_FROM_STATE])
    return values


def _by_shape(rows: Iterable[list[Any]]) -> dict[Shape, list[list[Any]]]:
    """Rows grouped by their shape, each with only the values it binds."""
    groups: dict[Shape, list[list[Any]]] = {}
    for values in rows:
        shape, params = _bound(values)
        groups.setdefault(shape, []).append(params)
    return groups


def _bound(values: list[Any]) -> tuple[Shape, list[Any]]:
    """The row's shape and the values it binds (those that are not None)."""
    shape = tuple(map(operator.is_not, values, _NONES))
    return shape, list(itertools.compress(values, shape))


def _update_values(
    changes: dict[str, Any], text: TimeTexts
) -> tuple[tuple[str, ...], Shape, list[Any]]:
    """A changed row's UPDATE (`WorkingSet.changes`), in one pass over its changed columns: the
    columns, which of their new values are set, and those values as they are bound."""
    shape: list[bool] = []
    params: list[Any] = []
    for name, value in changes.items():
        shape.append(value is not None)
        if value is not None:
            params.append(_column_value(name, value, text))
    return tuple(changes), tuple(shape), params


def _column_value(name: str, value: Any, text: TimeTexts) -> Any:
    """A changed column's value as it is bound (see the module docstring)."""
    if name in _TIME_FIELDS:
        return text(value)
    if name == "state":
        return str(value)
    if name == "outcome_retained":
        return int(value)
    return value


def _placeholders(shape: Shape) -> list[str]:
    return ["?" if bound else "NULL" for bound in shape]


@functools.lru_cache(maxsize=64)
def _insert_entry(shape: Shape) -> str:
    values = ", ".join(_placeholders(shape))
    return f"INSERT INTO ledger_entries ({COLUMNS}) VALUES ({values}) ON CONFLICT DO NOTHING"


@functools.lru_cache(maxsize=64)
def _insert_history(shape: Shape) -> str:
    columns, values = ", ".join(_HISTORY_FIELDS), ", ".join(_placeholders(shape))
    return f"INSERT INTO ledger_transitions ({columns}) VALUES ({values})"


def _load_rows(
    conn: sqlite3.Connection, sql: str, params: list[Any], ws: WorkingSet
) -> list[EntryRow]:
    """The rows `sql` reads, each loaded into `ws` unless an earlier read of the batch did."""
    rows = [entry_row(values) for values in conn.execute(sql, params)]
    for row in rows:
        if row.id not in ws.rows:
            ws.load(row)
    return rows


def entry_row(values: Iterable[Any]) -> EntryRow:
    """A row of `COLUMNS` as read, as an `EntryRow` (times aware, `outcome_retained` a bool)."""
    row = list(values)
    for i in _TIME_INDEXES:
        if (text := row[i]) is not None:
            row[i] = stored_time(text)
    row[_RETAINED] = bool(row[_RETAINED])
    return EntryRow(*row)


def stored_time(text: str) -> datetime:
    """A time as SQLite holds it (UTC text, `ledger.tables.UTCTimestamp`): aware, in UTC."""
    return datetime.fromisoformat(f"{text}+00:00")


class TimeTexts:
    """Aware datetimes as the UTC text `ledger.tables.UTCTimestamp` stores, each distinct time
    converted once per batch (most of a batch's times are its one `now`)."""

    __slots__ = ("_texts",)

    def __init__(self) -> None:
        self._texts: dict[datetime, str] = {}

    def __call__(self, value: datetime | None) -> str | None:
        if value is None:
            return None
        text = self._texts.get(value)
        if text is None:
            text = self._texts[value] = utc_text(value)
        return text


def utc_text(value: datetime) -> str:
    """An aware datetime as the UTC text SQLite holds (`ledger.tables.UTCTimestamp`).

    Raises:
        ValueError: a naive datetime (its zone is unknown).
    """
    if value.tzinfo is None:
        raise ValueError(f"ledger times must be timezone-aware, not {value!r}")
    # "2030-01-01 00:00:00.000000+00:00" without its offset (cheaper than .replace()).
    return value.astimezone(UTC).isoformat(" ", "microseconds")[:_TEXT_LENGTH]


@functools.lru_cache(maxsize=512)
def marks(count: int) -> str:
    """`count` comma-separated `?` placeholders."""
    return ", ".join("?" * count)


@functools.lru_cache(maxsize=512)
def _select_by_ids(count: int) -> str:
    return f"SELECT {COLUMNS} FROM ledger_entries WHERE id IN ({marks(count)}) ORDER BY id"


@functools.lru_cache(maxsize=512)
def _select_by_keys(keys: int, tenants: int, upstreams: int) -> str:
    return (
        f"SELECT {COLUMNS} FROM ledger_entries WHERE idempotency_key IN ({marks(keys)}) "
        f"AND tenant IN ({marks(tenants)}) AND upstream IN ({marks(upstreams)}) ORDER BY id"
    )


@functools.lru_cache(maxsize=256)
def _update_by_id(columns: tuple[str, ...], shape: Shape) -> str:
    """UPDATE of these columns (`shape`: which of their new values are bound) of one row by id
    (an executemany statement)."""
    marks = _placeholders(shape)
    assignments = ", ".join(f"{name} = {mark}" for name, mark in zip(columns, marks, strict=True))
    return f"UPDATE ledger_entries SET {assignments} WHERE id = ?"

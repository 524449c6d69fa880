"""The writer's plain statements agree with the schema `ledger.tables` declares."""

from __future__ import annotations

from sqlalchemy.dialects import postgresql

from ledger import pg_sql, sqlite_sql
from ledger.batch import ROW_FIELDS
from ledger.tables import metadata

_BASE = {  # PostgreSQL's name for each type as SQLAlchemy compiles it, without a length
    "VARCHAR": "text",
    "TEXT": "text",
    "INTEGER": "int4",
    "BIGINT": "int8",
    "TIMESTAMP WITH TIME ZONE": "timestamptz",
    "BYTEA": "bytea",
    "BOOLEAN": "bool",
    "FLOAT": "float8",
}


def _schema_types(table: str) -> dict[str, str]:
    dialect = postgresql.asyncpg.dialect()
    columns = metadata.tables[table].c
    return {c.name: _BASE[c.type.compile(dialect=dialect).split("(")[0]] for c in columns}


def test_the_postgresql_arrays_carry_each_columns_own_type() -> None:
    """Every entry column and history column is sent as an array of its column's base type."""
    entries = _schema_types("ledger_entries")
    assert list(entries) == list(ROW_FIELDS)
    assert entries == pg_sql._TYPES
    history = _schema_types("ledger_transitions")
    del history["id"]
    assert history == pg_sql._HISTORY_TYPES


def test_the_sqlite_statements_name_every_column() -> None:
    """SQLite's insert names every entry column, and its times are the schema's time columns."""
    entries = _schema_types("ledger_entries")
    times = {name for name, kind in entries.items() if kind == "timestamptz"}
    assert times == sqlite_sql._TIME_FIELDS
    every = (True,) * len(ROW_FIELDS)
    assert sqlite_sql._insert_entry(every).count("?") == len(ROW_FIELDS)


def test_a_sqlite_statement_writes_unset_values_as_null_literals() -> None:
    """A value that is None is not bound: its place in the statement is NULL."""
    shape = tuple(name != "run_id" for name in ROW_FIELDS)
    insert = sqlite_sql._insert_entry(shape)
    assert insert.count("?") == len(ROW_FIELDS) - 1
    values = insert.split("VALUES (")[1].split(")")[0].split(", ")
    assert values[ROW_FIELDS.index("run_id")] == "NULL"
    update = sqlite_sql._update_by_id(("state", "lease_expires_at"), (True, False))
    assert update.endswith("SET state = ?, lease_expires_at = NULL WHERE id = ?")

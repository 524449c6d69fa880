"""The CHECK on an entry's state as comparisons instead of an IN list (the same seven states).

SQLite evaluates `state IN (seven values)` by building a temporary b-tree of the values for every
row an INSERT or UPDATE writes, and dropping it after: about 5 % of a side-effecting call's
instructions, two rows per call. Comparisons are evaluated in place. What the check allows is
unchanged, so no row needs to be read or rewritten:

- PostgreSQL: the constraint is dropped and added again (it validates the rows it has);
- SQLite cannot alter a constraint short of rebuilding the table (and dropping `ledger_entries`
  with foreign keys enforced would delete the history with it), so the table's stored definition
  is edited in place, the procedure SQLite documents for removing a CHECK constraint (ALTER TABLE,
  "making other kinds of table schema changes"): within this transaction, the text of the
  constraint is replaced in `sqlite_master` and the schema version moved on, so that every
  connection reads the new definition. A definition that does not hold the expected text stops
  the migration (nothing is changed); a SQLite that refuses schema edits keeps the IN list (the
  same states allowed), with a warning.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

log = logging.getLogger("interlock.ledger")

_NAME = "ck_ledger_entries_state"
_STATES = ("accepted", "running", "succeeded", "failed", "unknown", "blocked", "rejected")
_LISTED = "state IN ({})".format(", ".join(f"'{s}'" for s in _STATES))
_COMPARED = " OR ".join(f"state = '{s}'" for s in _STATES)


def upgrade() -> None:
    _replace(_LISTED, _COMPARED)


def downgrade() -> None:
    _replace(_COMPARED, _LISTED)


def _replace(old: str, new: str) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        op.drop_constraint(_NAME, "ledger_entries", type_="check")
        op.create_check_constraint(_NAME, "ledger_entries", sa.text(new))
        return
    old_clause, new_clause = (
        f"CONSTRAINT {_NAME} CHECK ({old})",
        f"CONSTRAINT {_NAME} CHECK ({new})",
    )
    query = "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'ledger_entries'"
    (definition,) = bind.exec_driver_sql(query).one()
    if definition.count(old_clause) != 1:
        raise RuntimeError(
            f"ledger_entries does not hold its state check as expected ({old_clause}): not migrated"
        )
    (version,) = bind.exec_driver_sql("PRAGMA schema_version").one()
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    try:
        bind.exec_driver_sql(
            "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'ledger_entries'",
            (definition.replace(old_clause, new_clause),),
        )
    except sa.exc.DBAPIError as error:
        # A SQLite built to refuse edits of its schema (SQLITE_DBCONFIG_DEFENSIVE): the check
        # keeps its IN list, which allows exactly the same states, only at a higher cost per row.
        log.warning("the ledger's state check is left as an IN list: %s", error.orig)
        return
    finally:
        bind.exec_driver_sql("PRAGMA writable_schema = OFF")
    bind.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")

"""Opening a ledger: its schema at the revision this code needs, checked, or migrated.

The check reads the database's revision with the plain reader on SQLite (`ledger.sqlite_reads`)
and through the toolkit's engines on PostgreSQL. A schema that is behind is migrated by a child
process when the caller asks (`interlock serve`: `ledger.revisions.migrate_in_child`), else, or
when the child could not, here with Alembic (`ledger.migrate`, imported then).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledger import revisions
from ledger.errors import LedgerUnavailable
from ledger.sqlite_reads import SQLiteReads
from policies.model import LedgerSettings

if TYPE_CHECKING:
    from ledger.db import Engines

__all__ = ["schema_at_head"]


async def schema_at_head(
    settings: LedgerSettings,
    sqlite: SQLiteReads | None,
    engines: Engines | None,
    *,
    migrate: bool,
    in_child: bool,
) -> Engines | None:
    """Check the schema's revision (on SQLite through `sqlite`, else through `engines`) and, when
    it is behind and `migrate` allows, migrate it: in a child process when `in_child` asks for
    it, and here when not or when the child could not. Returns `engines` (None on SQLite: the
    engines an in-process migration of a SQLite ledger needs are disposed of once it is done).

    Raises:
        LedgerUnavailable: the database cannot be read or migrated, or (`migrate=False`) it is
            not at the revision this version needs.
    """
    if sqlite is not None:
        found = await sqlite.revision()
    else:
        from ledger.migrate import current_revision

        assert engines is not None
        found = await current_revision(engines)
    if found == revisions.HEAD_REVISION:
        return engines
    if not migrate:
        raise LedgerUnavailable(
            f"the ledger schema is at revision {found or '(none)'}, this version needs "
            f"{revisions.HEAD_REVISION}: run `interlock ledger migrate`"
        )
    if in_child and await revisions.migrate_in_child(settings):
        return engines
    from ledger.db import open_engines
    from ledger.migrate import upgrade

    if engines is not None:
        await upgrade(engines)
        return engines
    migrating = open_engines(settings)  # a SQLite ledger's, for the migration only
    try:
        await upgrade(migrating)
    finally:
        await migrating.dispose()
    return None

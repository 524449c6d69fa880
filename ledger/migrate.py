"""Schema migrations with Alembic, configured in code so they work from an installed package.

The migration runs inside one write transaction: `BEGIN IMMEDIATE` on SQLite, and on PostgreSQL
a transaction-scoped advisory lock, so replicas starting together migrate once, one after another.
Both backends have transactional DDL, so a migration that dies half-way leaves nothing behind.

Alembic is imported only when a migration actually runs: opening a current database (every
proxy start, every `interlock ledger` command) compares its revision with `HEAD_REVISION`
(`ledger.revisions`). `interlock serve` goes further (`LedgerStore.open(...,
migrate_in_child=True)`): a database that is behind is migrated by a child process (this module
run as a program), so Alembic (about 12 MB, resident for the process's life once imported) never
enters the proxy's memory; when the child cannot do it, the open migrates in-process as before.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ledger.db import Engines, open_engines, translate_errors
from ledger.revisions import HEAD_REVISION, VERSION_TABLE
from ledger.sqlite_connect import retry_while_locked
from policies.model import LedgerSettings

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = [
    "HEAD_REVISION",
    "VERSION_TABLE",
    "alembic_config",
    "current_revision",
    "head_revision",
    "migrate_ledger",
    "upgrade",
]

_ADVISORY_LOCK = 0x1E06E5  # any constant shared by every replica


def alembic_config(connection: sa.Connection | None = None) -> Config:
    """An Alembic config whose scripts are the package's `ledger/migrations`."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision among the package's migration scripts (read with Alembic)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError("the ledger package ships no migrations")
    return head


async def current_revision(engines: Engines) -> str | None:
    """The database's revision, or None when it has never been migrated.

    Raises:
        LedgerUnavailable: the database cannot be read.
    """
    with translate_errors("schema check"):
        async with engines.read.connect() as conn:
            return await conn.run_sync(_current_revision)


def _current_revision(connection: sa.Connection) -> str | None:
    # Read directly rather than through Alembic's MigrationContext, which logs at INFO level.
    if not sa.inspect(connection).has_table(VERSION_TABLE):
        return None
    version = sa.table(VERSION_TABLE, sa.column("version_num", sa.String()))
    revision = connection.execute(sa.select(version.c.version_num)).scalar()
    return None if revision is None else str(revision)


async def upgrade(engines: Engines, revision: str = "head") -> tuple[str | None, str]:
    """Migrate the database to `revision`; return (revision before, revision after).

    Raises:
        LedgerUnavailable: the database cannot be written.
    """

    async def once() -> tuple[str | None, str]:
        with translate_errors("migration"):
            return await _upgrade_once(engines, revision)

    if engines.dialect != "sqlite":
        return await once()
    return await retry_while_locked(once)  # replicas racing on a brand-new file


async def _upgrade_once(engines: Engines, revision: str) -> tuple[str | None, str]:
    async with engines.write.begin() as conn:
        if engines.dialect == "postgresql":
            await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_ADVISORY_LOCK)))
        before = await conn.run_sync(_current_revision)
        if before == HEAD_REVISION and revision == "head":
            return before, before
        await conn.run_sync(lambda sync: _alembic_upgrade(sync, revision))
        after = await conn.run_sync(_current_revision)
    return before, after or ""


def _alembic_upgrade(connection: sa.Connection, revision: str) -> None:
    from alembic import command

    command.upgrade(alembic_config(connection), revision)


async def migrate_ledger(settings: LedgerSettings) -> tuple[str | None, str]:
    """Open the ledger at `settings.url`, migrate it to head, close it: (before, after).

    Raises:
        LedgerUnavailable: the database cannot be reached or written.
        LedgerError: the URL is not usable.
    """
    engines = open_engines(settings)
    try:
        return await upgrade(engines)
    finally:
        await engines.dispose()


def _migrate_from_stdin() -> int:
    """The child's side: settings as JSON on stdin; exit 0 once the ledger is at head."""
    settings = LedgerSettings(**json.loads(sys.stdin.read()))
    try:
        asyncio.run(migrate_ledger(settings))
    except Exception as error:  # noqa: BLE001 - reported to the parent, which decides
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_migrate_from_stdin())

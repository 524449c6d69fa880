"""Engines for the two backends, and the one place database errors become ledger errors.

SQLite runs in WAL mode with `synchronous` FULL (or NORMAL when `durability: normal`), a busy
timeout and foreign keys on. Python's sqlite3 module would open transactions by itself; it is told
not to, and every transaction is begun here instead: `BEGIN IMMEDIATE` for writers, so two
processes never both read and then both try to write (which SQLite answers with an immediate
"database is locked"), plain `BEGIN` for readers, which WAL never blocks.

The SQLite group-commit writer also gets a synchronous engine on the stdlib `sqlite3` driver: it
runs a whole batch in one call on its own thread, instead of one hop to aiosqlite's thread per
statement. Its connections refuse to be used from any other thread (`check_same_thread`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import NullPool, create_engine, event, exc
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ledger.errors import LedgerError, LedgerUnavailable
from policies.model import LedgerSettings

__all__ = [
    "BUSY_TIMEOUT_MS",
    "Engines",
    "async_url",
    "is_retryable",
    "open_engines",
    "sqlite_file",
    "translate_errors",
]

BUSY_TIMEOUT_MS = 5000
_CONNECT_TIMEOUT_S = 5.0
_WRITE_OPTION = "interlock_ledger_write"
_DRIVERS = {"sqlite": "aiosqlite", "postgresql": "asyncpg", "postgres": "asyncpg"}
# PostgreSQL SQLSTATEs after which a whole transaction may simply be run again.
_RETRYABLE_SQLSTATES = {"40001", "40P01"}  # serialization_failure, deadlock_detected


def async_url(url: str) -> URL:
    """The async-driver URL for a configured ledger URL.

    `sqlite:///path` → `sqlite+aiosqlite:///path`, `postgresql://…` → `postgresql+asyncpg://…`;
    URLs that already name these drivers pass through.

    Raises:
        LedgerError: an unsupported scheme, or an in-memory SQLite database (not durable, and not
            shared between connections).
    """
    try:
        parsed = make_url(url)
    except exc.ArgumentError as error:
        raise LedgerError(f"ledger url {url!r} is not a database URL") from error
    backend, _, driver = parsed.drivername.partition("+")
    wanted = _DRIVERS.get(backend)
    if wanted is None or driver not in ("", wanted):
        raise LedgerError(f"ledger url {url!r}: use sqlite:///PATH or postgresql://HOST/DB")
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise LedgerError(f"ledger url {url!r}: the SQLite ledger needs a file path")
    backend = "postgresql" if backend == "postgres" else backend
    return parsed.set(drivername=f"{backend}+{wanted}")


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite ledger URL; None for PostgreSQL."""
    parsed = async_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database is None:
        return None
    return Path(parsed.database)


@dataclass(frozen=True, slots=True)
class Engines:
    """One pool, seen two ways: `write` begins transactions that will write.

    `write_sync` (SQLite only, else None) is the group-commit writer's synchronous engine: every
    transaction it begins is a write, and each connection stays on the thread that opened it.
    """

    read: AsyncEngine
    write: AsyncEngine
    dialect: str
    write_sync: Engine | None = None

    async def dispose(self) -> None:
        await self.read.dispose()
        if self.write_sync is not None:
            self.write_sync.dispose()


def open_engines(settings: LedgerSettings) -> Engines:
    """Engines for `settings.url` (no connection is made yet).

    Raises:
        LedgerError: the URL is not usable (see `async_url`).
    """
    url = async_url(settings.url)
    write_sync: Engine | None = None
    if url.get_backend_name() == "sqlite":
        engine = create_async_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})
        _configure_sqlite(engine.sync_engine, settings.durability)
        # No pool: the writer holds its one connection across batches, on its own thread.
        sync_engine = create_engine(
            url.set(drivername="sqlite+pysqlite"),
            poolclass=NullPool,
            connect_args={"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": True},
        )
        _configure_sqlite(sync_engine, settings.durability)
        write_sync = sync_engine.execution_options(**{_WRITE_OPTION: True})
    else:
        engine = create_async_engine(
            url,
            pool_size=4,
            max_overflow=4,
            connect_args={"timeout": _CONNECT_TIMEOUT_S, "command_timeout": 30},
        )
    return Engines(
        read=engine,
        write=engine.execution_options(**{_WRITE_OPTION: True}),
        dialect=url.get_backend_name(),
        write_sync=write_sync,
    )


def _configure_sqlite(engine: Engine, durability: str) -> None:
    synchronous = "NORMAL" if durability == "normal" else "FULL"

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (see module docstring)
        cursor = dbapi_connection.cursor()
        for pragma in (
            f"busy_timeout={BUSY_TIMEOUT_MS}",
            "journal_mode=WAL",
            f"synchronous={synchronous}",
            "foreign_keys=ON",
        ):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        writes = connection.get_execution_options().get(_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")


def is_retryable(error: exc.DBAPIError) -> bool:
    """Whether a failed transaction may be run again as a whole (deadlock, serialization)."""
    return getattr(error.orig, "sqlstate", None) in _RETRYABLE_SQLSTATES


@contextlib.contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Turn database and connection errors raised inside into `LedgerUnavailable`.

    Raises:
        LedgerUnavailable: the database could not be reached, read or written.
    """
    try:
        yield
    except exc.DBAPIError as error:
        detail = str(error.orig).strip() or type(error.orig).__name__
        raise LedgerUnavailable(f"ledger {what} failed: {detail}") from error
    except OSError as error:  # includes TimeoutError and refused connections
        detail = str(error).strip() or type(error).__name__
        raise LedgerUnavailable(f"ledger {what} failed: {detail}") from error

"""Engines for the two backends, and the one place database errors become ledger errors.

SQLite connections are set up as `ledger.sqlite_connect` sets up its own (WAL, `synchronous` FULL
or NORMAL, a busy timeout, foreign keys on). Python's sqlite3 module would open transactions by
itself; it is told not to, and every transaction is begun here instead: `BEGIN IMMEDIATE` for
writers, so two processes never both read and then both try to write (which SQLite answers with
an immediate "database is locked"), plain `BEGIN` for readers, which WAL never blocks.

On SQLite these engines serve the migrations only: the group-commit writer and every read use the
stdlib driver directly (`ledger.sqlite_transactions`, `ledger.sqlite_reads`), so a proxy on a
SQLite ledger never imports this module. PostgreSQL's writer takes its connection from the
`write` engine, and its reads use the `read` engine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ledger import sqlite_connect
from ledger.errors import LedgerError, LedgerUnavailable
from policies.model import LedgerSettings

__all__ = [
    "Engines",
    "async_url",
    "is_retryable",
    "open_engines",
    "translate_errors",
]

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
            shared between connections; see `ledger.sqlite_connect.sqlite_path`).
    """
    if sqlite_connect.is_sqlite_url(url):
        path = sqlite_connect.sqlite_path(url)
        return URL.create("sqlite+aiosqlite", database=str(path))
    try:
        parsed = make_url(url)
    except exc.ArgumentError as error:
        raise LedgerError(f"ledger url {url!r} is not a database URL") from error
    backend, _, driver = parsed.drivername.partition("+")
    wanted = _DRIVERS.get(backend)
    if wanted is None or driver not in ("", wanted):
        raise LedgerError(f"ledger url {url!r}: use sqlite:///PATH or postgresql://HOST/DB")
    backend = "postgresql" if backend == "postgres" else backend
    return parsed.set(drivername=f"{backend}+{wanted}")


@dataclass(frozen=True, slots=True)
class Engines:
    """One pool, seen two ways: `write` begins transactions that will write."""

    read: AsyncEngine
    write: AsyncEngine
    dialect: str

    async def dispose(self) -> None:
        await self.read.dispose()


def open_engines(settings: LedgerSettings) -> Engines:
    """Engines for `settings.url` (no connection is made yet).

    Raises:
        LedgerError: the URL is not usable (see `async_url`).
    """
    url = async_url(settings.url)
    if url.get_backend_name() == "sqlite":
        timeout_s = sqlite_connect.BUSY_TIMEOUT_MS / 1000
        engine = create_async_engine(url, connect_args={"timeout": timeout_s})
        _configure_sqlite(engine.sync_engine, settings.durability)
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
    )


def _configure_sqlite(engine: Engine, durability: str) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (see module docstring)
        cursor = dbapi_connection.cursor()
        for statement in sqlite_connect.pragmas(durability):
            cursor.execute(statement)
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

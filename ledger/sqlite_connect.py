"""SQLite ledger connections on the stdlib driver alone: what a proxy needs without the toolkit.

A SQLite ledger's every statement runs on connections opened here: the writer's
(`ledger.sqlite_transactions`) and the reader's (`ledger.sqlite_reads`), so SQLAlchemy is imported
only to migrate (`ledger.db`, whose engines set their connections up with the same `pragmas`).

Every connection: autocommit at the driver (the ledger begins its own transactions: `BEGIN
IMMEDIATE` to write, nothing or `BEGIN` to read), a busy timeout, WAL, `synchronous` FULL (NORMAL
with `durability: normal`), foreign keys on.
"""

from __future__ import annotations

import asyncio
import sqlite3
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from ledger.errors import LedgerError, LedgerUnavailable

__all__ = [
    "BUSY_TIMEOUT_MS",
    "configure",
    "connect",
    "is_sqlite_url",
    "pragmas",
    "retry_while_locked",
    "sqlite_path",
]

T = TypeVar("T")
_LOCKED_RETRIES = 6

BUSY_TIMEOUT_MS = 5000
_SCHEMES = ("sqlite", "sqlite+aiosqlite", "sqlite+pysqlite")


def is_sqlite_url(url: str) -> bool:
    """Whether `url` names a SQLite ledger (any of the schemes the ledger accepts for it)."""
    return url.partition("://")[0] in _SCHEMES


def sqlite_path(url: str) -> Path:
    """The database file a SQLite ledger URL names: `sqlite:///relative.db`,
    `sqlite:////absolute.db` (percent-escapes decoded, as SQLAlchemy reads the same URL).

    Raises:
        LedgerError: not a SQLite URL, no file (in-memory databases are neither durable nor
            shared between connections), or connection options in the URL (the ledger sets
            its own).
    """
    scheme, separator, rest = url.partition("://")
    if scheme not in _SCHEMES or not separator:
        raise LedgerError(f"ledger url {url!r}: use sqlite:///PATH or postgresql://HOST/DB")
    if not rest.startswith("/"):
        raise LedgerError(f"ledger url {url!r}: a SQLite URL has no host (sqlite:///PATH)")
    database, _, query = rest[1:].partition("?")
    if query:
        raise LedgerError(
            f"ledger url {url!r}: options after '?' are not supported on a SQLite ledger "
            "(its busy timeout, journal and synchronous mode are the ledger's own)"
        )
    file = urllib.parse.unquote(database)
    if file in ("", ":memory:"):
        raise LedgerError(f"ledger url {url!r}: the SQLite ledger needs a file path")
    return Path(file)


def pragmas(durability: str) -> tuple[str, ...]:
    """The statements every new ledger connection runs (see the module docstring)."""
    synchronous = "NORMAL" if durability == "normal" else "FULL"
    return (
        f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}",
        "PRAGMA journal_mode=WAL",
        f"PRAGMA synchronous={synchronous}",
        "PRAGMA foreign_keys=ON",
    )


def configure(conn: sqlite3.Connection, durability: str) -> None:
    """Set up a new connection as every ledger connection is."""
    conn.isolation_level = None  # the ledger emits BEGIN itself
    for statement in pragmas(durability):
        conn.execute(statement).close()


def connect(path: Path, durability: str) -> sqlite3.Connection:
    """A configured connection to `path`, usable only on the thread that opens it.

    Raises:
        sqlite3.Error: the database cannot be opened or configured.
    """
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=True)
    try:
        configure(conn, durability)
    except BaseException:
        conn.close()
        raise
    return conn


async def retry_while_locked(attempt: Callable[[], Awaitable[T]]) -> T:
    """`attempt()`, tried again a few times, backing off, while it fails with SQLite's "database
    is locked": replicas starting together on a brand-new file race to switch it to WAL, which
    SQLite refuses that way without waiting for the busy timeout. The race is over in moments;
    anything else is a real failure and is raised at once.

    Raises:
        LedgerUnavailable: what the last try raised.
    """
    for tried in range(_LOCKED_RETRIES):
        try:
            return await attempt()
        except LedgerUnavailable as error:
            if "database is locked" not in str(error) or tried == _LOCKED_RETRIES - 1:
                raise
        await asyncio.sleep(0.05 * 2**tried)
    raise AssertionError("unreachable")  # pragma: no cover

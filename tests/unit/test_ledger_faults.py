"""What a failed write transaction means (`ledger.faults.classify`) when the driver's error arrives
bare, as the writer's plain statements raise it, rather than wrapped by SQLAlchemy."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from asyncpg import exceptions as pg

from ledger.errors import LedgerUnavailable
from ledger.faults import Fault, classify
from ledger.sqlite_connect import retry_while_locked


def _sqlite_busy(tmp_path: Path) -> sqlite3.OperationalError:
    """A real "database is locked": another connection holds the write lock."""
    path = tmp_path / "l.db"
    holder = sqlite3.connect(path, isolation_level=None)
    waiter = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as caught:
            waiter.execute("BEGIN IMMEDIATE")
        return caught.value
    finally:
        holder.close()
        waiter.close()


def test_a_bare_sqlite_busy_error_is_retried(tmp_path: Path) -> None:
    """SQLite's bare "database is locked" is a transient fault: the whole batch runs again."""
    error = _sqlite_busy(tmp_path)
    assert classify(error, committing=False) is Fault.RETRY


@pytest.mark.parametrize(
    ("error", "before_commit", "during_commit"),
    [
        (pg.DeadlockDetectedError("deadlock"), Fault.RETRY, Fault.RETRY),
        (pg.SerializationError("serialization"), Fault.RETRY, Fault.RETRY),
        (pg.AdminShutdownError("terminating"), Fault.RETRY, Fault.UNAVAILABLE),
        (pg.ConnectionDoesNotExistError("closed"), Fault.RETRY, Fault.UNAVAILABLE),
        (pg.InterfaceError("connection is closed"), Fault.RETRY, Fault.UNAVAILABLE),
        (
            pg.InternalClientError("another operation is in progress"),
            Fault.RETRY,
            Fault.UNAVAILABLE,
        ),
        (pg.DiskFullError("no space"), Fault.UNAVAILABLE, Fault.UNAVAILABLE),
        (pg.UniqueViolationError("duplicate"), Fault.ISOLATE, Fault.ISOLATE),
        (pg.CharacterNotInRepertoireError("NUL"), Fault.ISOLATE, Fault.ISOLATE),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else value.value,
)
def test_bare_asyncpg_errors_keep_their_meaning(
    error: Exception, before_commit: Fault, during_commit: Fault
) -> None:
    """asyncpg's bare errors: deadlocks and lost connections before COMMIT are retried, a
    connection lost during COMMIT is unavailable (it may have committed), a refused value
    isolates its operation."""
    assert classify(error, committing=False) is before_commit
    assert classify(error, committing=True) is during_commit


def test_a_value_the_driver_cannot_encode_isolates_its_operation() -> None:
    """A lone surrogate the driver cannot encode fails only the operation that carries it."""
    with pytest.raises(UnicodeEncodeError) as caught:
        "bad-\udc80".encode()
    assert classify(caught.value, committing=False) is Fault.ISOLATE


async def test_a_read_racing_a_new_file_to_wal_is_tried_again_and_nothing_else_is() -> None:
    """`retry_while_locked`: "database is locked" is tried again (backing off), any other
    failure is raised at the first try."""
    tries: list[str] = []

    async def locked_twice() -> str:
        tries.append("locked")
        if len(tries) < 3:
            raise LedgerUnavailable("ledger schema check failed: database is locked")
        return "0004"

    assert await retry_while_locked(locked_twice) == "0004"
    assert len(tries) == 3

    async def down() -> str:
        tries.append("down")
        raise LedgerUnavailable("ledger schema check failed: unable to open database file")

    with pytest.raises(LedgerUnavailable, match="unable to open"):
        await retry_while_locked(down)
    assert tries.count("down") == 1

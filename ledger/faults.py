"""What a failed write transaction means for the operations in it (pure: no I/O).

    RETRY      transient, nothing was committed: run the whole batch again (SQLite busy or locked,
               PostgreSQL serialization failure or deadlock, a connection lost before COMMIT)
    UNAVAILABLE the database cannot be written now (disk full, I/O error, refused connections after
               the retries, a connection lost *during* COMMIT, whose outcome nobody knows)
    ISOLATE    the database refused a statement because of what one operation wrote (a NUL byte,
               a lone surrogate, an index row over PostgreSQL's limit, a constraint): nothing was
               committed, and re-running the batch in halves finds the one operation to fail

Only `UNAVAILABLE` fails a whole batch: one bad value can only ever fail its own operation.
"""

from __future__ import annotations

import enum
import sys
from typing import Protocol, cast

__all__ = ["Fault", "classify", "describe"]


class Fault(enum.Enum):
    """What the writer does with a batch whose transaction failed."""

    RETRY = "retry"
    UNAVAILABLE = "unavailable"
    ISOLATE = "isolate"


# PostgreSQL SQLSTATEs (and classes) that say nothing about the data written.
_PG_RETRY = {"40001", "40P01"}  # serialization_failure, deadlock_detected
_PG_LOST = {"08", "57"}  # connection exception; operator intervention (admin shutdown, …)
_PG_DOWN = {"53", "58", "XX"}  # insufficient resources; system error; internal error
# SQLite primary result codes.
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6
_SQLITE_DOWN = {3, 7, 8, 9, 10, 11, 13, 14, 15, 26}  # perm, nomem, readonly, interrupt, ioerr,
# corrupt, full, cantopen, protocol, notadb


def classify(error: BaseException, *, committing: bool) -> Fault:
    """The fault `error` stands for; `committing` says whether it was raised by COMMIT itself.

    A connection lost during COMMIT is `UNAVAILABLE`, never `RETRY`: the transaction may have
    committed, and running it again could decide twice.
    """
    lost = _connection_lost(error)
    if lost:
        return Fault.UNAVAILABLE if committing else Fault.RETRY
    # SQLAlchemy wraps the driver's error; the writer's plain statements raise it bare.
    wrapped = _toolkit_error(error)
    driver = error if wrapped is None else wrapped.orig
    if driver is not None:
        sqlstate = getattr(driver, "sqlstate", None) or getattr(driver, "pgcode", None)
        if isinstance(sqlstate, str) and sqlstate:
            if sqlstate in _PG_RETRY:
                return Fault.RETRY
            if sqlstate[:2] in _PG_DOWN:
                return Fault.UNAVAILABLE
            return Fault.ISOLATE
        code = getattr(driver, "sqlite_errorcode", None)
        if isinstance(code, int):
            primary = code & 0xFF
            if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
                return Fault.RETRY
            if primary in _SQLITE_DOWN:
                return Fault.UNAVAILABLE
    if isinstance(error, OSError):
        return Fault.UNAVAILABLE if committing else Fault.RETRY
    # A value the driver could not send (NUL, lone surrogate) or the server refused.
    return Fault.ISOLATE


def _toolkit_error(error: BaseException) -> _Wrapped | None:
    """`error` as SQLAlchemy's wrapper of a driver's error, or None. (It can only be one once
    SQLAlchemy is loaded, and a SQLite proxy that only serves calls never loads it.)"""
    toolkit = sys.modules.get("sqlalchemy.exc")
    if toolkit is None or not isinstance(error, toolkit.DBAPIError):
        return None
    return cast(_Wrapped, error)


class _Wrapped(Protocol):
    """What this module reads of SQLAlchemy's `DBAPIError`."""

    orig: BaseException | None
    connection_invalidated: bool


def _connection_lost(error: BaseException) -> bool:
    driver: BaseException | None = error
    wrapped = _toolkit_error(error)
    if wrapped is not None:
        if wrapped.connection_invalidated:
            return True
        driver = wrapped.orig
    if driver is None:
        return False
    sqlstate = getattr(driver, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate[:2] in _PG_LOST:
        return True
    # asyncpg's "connection is closed" / "connection was closed in the middle of operation"
    cause = driver.__cause__
    names = {type(driver).__name__, type(cause).__name__ if cause else ""}
    if "InternalClientError" in names:
        # asyncpg's protocol is out of step: e.g. the server's termination notice arrived
        # between two statements. The connection is unusable, nothing of this batch was run.
        return True
    return bool(names & {"ConnectionDoesNotExistError", "InterfaceError"}) and (
        "closed" in str(driver).lower()
    )


def describe(error: BaseException) -> str:
    """One line for a log or a `LedgerUnavailable` message."""
    wrapped = _toolkit_error(error)
    if wrapped is not None:
        return str(wrapped.orig).strip() or type(wrapped.orig).__name__
    return str(error).strip() or type(error).__name__

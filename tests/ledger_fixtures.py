"""Shared fixtures for anything that needs a real ledger database, SQLite and PostgreSQL alike.

Use them by importing the fixtures into a test module (pytest finds fixtures by name there):

    from tests import ledger_fixtures

    ledger_backend = ledger_fixtures.ledger_backend   # module scope: sqlite, then postgres
    ledger_url = ledger_fixtures.ledger_url           # a fresh, empty database per test

(Assignments rather than `from … import`, so that ruff does not read the fixture arguments as
redefinitions of the imports.) Every test that asks for `ledger_url` runs once per backend.

PostgreSQL: the server is `INTERLOCK_TEST_PG_URL` (default
`postgresql+asyncpg://postgres@127.0.0.1:5432/test`). Each test module gets its own database
`interlock_test_<random>`, created on that server and dropped at the end; each test gets an empty
`public` schema in it. Nothing else on the server is touched. Under `CI=true` an unreachable
server fails the tests; otherwise they are skipped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import secrets
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from ledger import ClaimRequest, LedgerStore
from policies.model import LedgerSettings

__all__ = [
    "FakeClock",
    "LedgerBackend",
    "claim_request",
    "ledger_backend",
    "ledger_settings",
    "ledger_store",
    "ledger_url",
    "only_postgres",
    "only_sqlite",
    "pg_admin_dsn",
    "pg_execute",
    "pg_server_url",
    "pg_terminate_backends",
    "read_child_json",
    "run_async",
    "spawn_ledger_child",
    "sqlite_write_lock_in_another_process",
]

T = TypeVar("T")
PG_URL_ENV = "INTERLOCK_TEST_PG_URL"
DEFAULT_PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
_ADMIN_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class LedgerBackend:
    """One backend a test module runs against. `pg_url` is set for PostgreSQL only."""

    name: str
    pg_url: str | None = None

    def url(self, folder: Path) -> str:
        """A ledger URL in the form users write (`sqlite:///…`, `postgresql://…`)."""
        if self.pg_url is None:
            return f"sqlite:///{folder / 'ledger.db'}"
        return self.pg_url


class FakeClock:
    """A clock tests move by hand: `clock()` is now, `clock.advance(s)` moves it forward."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def run_async(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion on a private loop in another thread (bounded).

    For synchronous fixtures: the test's own event loop is left alone.
    """
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _as_coroutine(factory)).result(timeout=_ADMIN_TIMEOUT_S)


async def _as_coroutine(factory: Callable[[], Awaitable[T]]) -> T:
    return await factory()


def pg_server_url() -> str:
    """The PostgreSQL server the tests may use (a database on it that they may connect to)."""
    return os.environ.get(PG_URL_ENV, DEFAULT_PG_URL)


def _dsn(url: str, database: str | None = None) -> str:
    parsed = make_url(url).set(drivername="postgresql")
    if database is not None:
        parsed = parsed.set(database=database)
    return parsed.render_as_string(hide_password=False)


def pg_dsn(url: str) -> str:
    """A plain `postgresql://` DSN of the test ledger at `url`, for asyncpg."""
    return _dsn(url)


def pg_admin_dsn() -> str:
    """A plain `postgresql://` DSN of the server's own database (not a test's), for asyncpg."""
    return _dsn(pg_server_url())


async def pg_execute(dsn: str, *statements: str) -> None:
    """Run `statements` on a connection of their own (asyncpg, outside any ledger engine)."""
    await _pg_execute(dsn, *statements)


async def _pg_execute(dsn: str, *statements: str) -> None:
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def _require_postgres(dsn: str) -> None:
    try:
        run_async(lambda: _pg_execute(dsn, "SELECT 1"))
    except (OSError, asyncpg.PostgresError, TimeoutError) as error:
        message = f"PostgreSQL at {PG_URL_ENV}={pg_server_url()!r} is unreachable: {error!r}"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (CI=true: the PostgreSQL half of the suite must run)")
        pytest.skip(message)


@pytest.fixture(
    scope="module",
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def ledger_backend(request: pytest.FixtureRequest) -> Iterator[LedgerBackend]:
    """Each backend in turn; for PostgreSQL, a database of this module's own."""
    if request.param == "sqlite":
        yield LedgerBackend("sqlite")
        return
    server = _dsn(pg_server_url())
    _require_postgres(server)
    name = f"interlock_test_{secrets.token_hex(6)}"
    run_async(lambda: _pg_execute(server, f'CREATE DATABASE "{name}"'))
    try:
        yield LedgerBackend("postgres", _dsn(pg_server_url(), name))
    finally:
        run_async(lambda: _pg_execute(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


only_sqlite = pytest.mark.parametrize("ledger_backend", ["sqlite"], indirect=True)
"""Mark a test of a module using `ledger_backend` that means SQLite only (a file lock, …)."""
only_postgres = pytest.mark.parametrize(
    "ledger_backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
"""Mark a test of a module using `ledger_backend` that means PostgreSQL only."""


@pytest.fixture
def ledger_url(ledger_backend: LedgerBackend, tmp_path: Path) -> str:
    """The URL of an empty ledger database, never migrated (one per test)."""
    if ledger_backend.pg_url is not None:
        dsn = ledger_backend.pg_url
        run_async(lambda: _pg_execute(dsn, "DROP SCHEMA public CASCADE", "CREATE SCHEMA public"))
    return ledger_backend.url(tmp_path)


@pytest.fixture
def ledger_settings(ledger_url: str) -> LedgerSettings:
    """Default ledger settings on the test's database."""
    return LedgerSettings(url=ledger_url)


@pytest.fixture
async def ledger_store(ledger_settings: LedgerSettings) -> AsyncIterator[LedgerStore]:
    """An open, migrated store owned by replica "test-replica"."""
    store = await LedgerStore.open(ledger_settings, owner="test-replica")
    try:
        yield store
    finally:
        await store.close()


def claim_request(key: str | None = "key-1", **overrides: Any) -> ClaimRequest:
    """A claim for tool `send` on upstream `mail` by tenant `acme`, overridable field by field."""
    fields: dict[str, Any] = {
        "tenant": "acme",
        "upstream": "mail",
        "tool": "send",
        "idempotency_key": key,
        "key_source": "explicit" if key is not None else "none",
        "fingerprint": "a" * 64,
        "arguments": '{"to": "ops@example.com"}',
    }
    fields.update(overrides)
    return ClaimRequest(**fields)


async def pg_terminate_backends(url: str) -> int:
    """Kill every server connection to the database of ledger `url` (its stores' writers and
    pools included) with `pg_terminate_backend`; return how many were killed."""
    database = make_url(url).database
    conn = await asyncpg.connect(_dsn(pg_server_url()), timeout=5)
    try:
        killed = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()",
            database,
        )
    finally:
        await conn.close()
    return int(killed)


@contextlib.asynccontextmanager
async def sqlite_write_lock_in_another_process(url: str) -> AsyncIterator[Callable[[], None]]:
    """Another process holds the SQLite write lock (BEGIN IMMEDIATE) of ledger `url` from when
    this is entered until the yielded `release()` is called; leaving waits for it to exit."""
    path = url.removeprefix("sqlite:///")
    script = (
        "import sqlite3, sys\n"
        f"c = sqlite3.connect({path!r}, isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "print('locked', flush=True)\n"
        "sys.stdin.readline()\n"
        "c.execute('ROLLBACK')\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    stdin, stdout = proc.stdin, proc.stdout
    assert stdin is not None
    assert stdout is not None
    try:
        line = await asyncio.wait_for(stdout.readline(), _ADMIN_TIMEOUT_S)
        assert line == b"locked\n", line
        yield lambda: stdin.write(b"release\n")
        await asyncio.wait_for(proc.wait(), _ADMIN_TIMEOUT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


_REPO = Path(__file__).resolve().parents[1]
_CHILD_DEADLINE_S = 60


async def spawn_ledger_child(*args: str) -> asyncio.subprocess.Process:
    """Start `python -m tests.ledger_child ARGS…` (its commands are described there) with pipes
    on stdin and stdout, for a race or crash test to drive."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.ledger_child",
        *args,
        cwd=_REPO,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def read_child_json(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    """The next JSON line a ledger child reports; fails if it exits first."""
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), _CHILD_DEADLINE_S)
    assert line, f"child exited with {await proc.wait()}"
    decoded: dict[str, Any] = json.loads(line)
    return decoded

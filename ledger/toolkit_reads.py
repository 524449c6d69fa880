"""A PostgreSQL ledger's reads through the query toolkit: the same questions as
`ledger.sqlite_reads` asks a SQLite ledger (`ledger.reads.Reads`), with the same answers.

Each read takes its own short connection from the `read` engine (never the writer's); a database
that cannot be read raises `LedgerUnavailable` (`ledger.db.translate_errors`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from ledger import deferred_queries, queries
from ledger.batch import EntryRow
from ledger.db import Engines, translate_errors
from ledger.views import Candidate, EntryFilter, TransitionView

__all__ = ["ToolkitReads"]


class ToolkitReads:
    """The reads of `ledger.reads.Reads` on the toolkit's `engines` (the store disposes of them)."""

    def __init__(self, engines: Engines) -> None:
        self._engines = engines

    async def ping(self) -> None:
        async with self._reading("ping") as conn:
            await queries.ping(conn)

    async def count_by_state(self) -> dict[str, int]:
        async with self._reading("stats") as conn:
            return await queries.count_by_state(conn)

    async def oldest_change(self, state: str) -> datetime | None:
        async with self._reading("stats") as conn:
            return await queries.oldest_change(conn, state)

    async def stats(self) -> dict[tuple[str, str], int]:
        async with self._reading("stats") as conn:
            return await queries.stats(conn)

    async def entry(self, reference: str) -> tuple[EntryRow, list[TransitionView]]:
        async with self._reading("read") as conn:
            row = await queries.find_entry(conn, reference)
            return row, await queries.history(conn, row.id)

    async def find_entry(self, reference: str) -> EntryRow:
        async with self._reading("lookup") as conn:
            return await queries.find_entry(conn, reference)

    async def list_entries(self, wanted: EntryFilter) -> list[EntryRow]:
        async with self._reading("list") as conn:
            return await queries.list_entries(
                conn,
                states=wanted.states,
                upstream=wanted.upstream,
                tenant=wanted.tenant,
                since=wanted.since,
                limit=wanted.limit,
            )

    async def candidates(self, limit: int, *, per_group: int) -> list[Candidate]:
        async with self._reading("candidates") as conn:
            return await deferred_queries.candidates(conn, limit, per_group=per_group)

    async def task_owner(self, task_id: str) -> str | None:
        async with self._reading("task") as conn:
            return await deferred_queries.task_owner(conn, task_id)

    async def find_task(self, task_id: str, tenant: str) -> EntryRow | None:
        async with self._reading("task") as conn:
            return await deferred_queries.find_task(conn, task_id, tenant)

    async def list_tasks(
        self, tenant: str, limit: int, before: tuple[datetime, str] | None, upstream: str | None
    ) -> list[EntryRow]:
        async with self._reading("tasks") as conn:
            return await deferred_queries.list_tasks(
                conn, tenant, limit=limit, before=before, upstream=upstream
            )

    async def close(self) -> None:
        """Nothing of its own to release: the engines are the store's."""

    @contextlib.asynccontextmanager
    async def _reading(self, what: str) -> AsyncIterator[AsyncConnection]:
        with translate_errors(what):
            async with self._engines.read.connect() as conn:
                yield conn

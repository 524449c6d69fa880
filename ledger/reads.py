"""The ledger's reads for operators and health: an entry and its history, filtered lists, counts.

`LedgerStore` is built on `LedgerReads`: no read uses the writer's connection, and a database
that cannot be read raises `LedgerUnavailable`.

On SQLite every read goes to `ledger.sqlite_reads` (the stdlib driver); on PostgreSQL through
the query toolkit (`ledger.queries`), whose engines the store opens at start.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from ledger.sqlite_reads import SQLiteReads
from ledger.states import EntryState
from ledger.views import EntryView, TransitionView

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from ledger.db import Engines

__all__ = ["LedgerReads"]


class LedgerReads:
    """The read side of `LedgerStore`: `_sqlite` is its plain reader on SQLite (else None),
    `_engines()` its toolkit engines on PostgreSQL."""

    _sqlite: SQLiteReads | None

    def _engines(self) -> Engines:
        raise NotImplementedError

    async def ping(self) -> None:
        """Return if the ledger can be read.

        Raises:
            LedgerUnavailable: it cannot.
        """
        if self._sqlite is not None:
            await self._sqlite.ping()
            return
        from ledger import queries

        async with self._reading("ping") as conn:
            await queries.ping(conn)

    async def get(self, entry_or_key: str) -> tuple[EntryView, list[TransitionView]]:
        """An entry (by id, idempotency key, or unique id prefix) and its history.

        Raises:
            EntryNotFound, AmbiguousReference, LedgerUnavailable.
        """
        if self._sqlite is not None:
            row, history = await self._sqlite.entry(entry_or_key)
            return row.view(), history
        from ledger import queries

        async with self._reading("read") as conn:
            row = await queries.find_entry(conn, entry_or_key)
            history = await queries.history(conn, row.id)
        return row.view(), history

    async def list_entries(
        self,
        *,
        state: EntryState | str | Sequence[EntryState | str] | None = None,
        upstream: str | None = None,
        tenant: str | None = None,
        since: datetime | None = None,
        limit: int = 100,
    ) -> list[EntryView]:
        """Entries matching every given filter, newest first."""
        given = [] if state is None else [state] if isinstance(state, str) else list(state)
        states = [EntryState(s).value for s in given]
        if self._sqlite is not None:
            rows = await self._sqlite.list_entries(states, upstream, tenant, since, limit)
            return [row.view() for row in rows]
        from ledger import queries

        async with self._reading("list") as conn:
            rows = await queries.list_entries(
                conn, states=states, upstream=upstream, tenant=tenant, since=since, limit=limit
            )
        return [row.view() for row in rows]

    async def stats(self) -> dict[tuple[str, str], int]:
        """Entry counts by (state, upstream)."""
        if self._sqlite is not None:
            return await self._sqlite.stats()
        from ledger import queries

        async with self._reading("stats") as conn:
            return await queries.stats(conn)

    async def count_by_state(self) -> dict[str, int]:
        """Entry counts by state; every state is present, zero when empty."""
        if self._sqlite is not None:
            counts = await self._sqlite.count_by_state()
        else:
            from ledger import queries

            async with self._reading("stats") as conn:
                counts = await queries.count_by_state(conn)
        return {state.value: counts.get(state.value, 0) for state in EntryState}

    async def oldest_in_state(self, state: EntryState | str) -> datetime | None:
        """When the longest-waiting entry in `state` entered it (e.g. the oldest `unknown`)."""
        if self._sqlite is not None:
            return await self._sqlite.oldest_change(EntryState(state).value)
        from ledger import queries

        async with self._reading("stats") as conn:
            return await queries.oldest_change(conn, EntryState(state).value)

    @contextlib.asynccontextmanager
    async def _reading(self, what: str) -> AsyncIterator[AsyncConnection]:
        from ledger.db import translate_errors

        with translate_errors(what):
            async with self._engines().read.connect() as conn:
                yield conn

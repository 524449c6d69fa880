"""The ledger's reads for operators, health and deferred work: an entry and its history, filtered
lists, counts, task lookups.

`LedgerStore` is built on `LedgerReads`, which asks its backend's `Reads`: `ledger.sqlite_reads`
on SQLite (the stdlib driver, on a thread of its own), `ledger.toolkit_reads` on PostgreSQL (the
query toolkit's engines). No read uses the writer's connection, and a database that cannot be
read raises `LedgerUnavailable`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from ledger.batch import EntryRow
from ledger.states import EntryState
from ledger.views import Candidate, EntryFilter, EntryView, TransitionView

__all__ = ["LedgerReads", "Reads"]


class Reads(Protocol):
    """A backend's reads (each raises `LedgerUnavailable` when the database cannot be read)."""

    async def ping(self) -> None:
        """Return if the ledger's table can be read."""
        ...

    async def count_by_state(self) -> dict[str, int]:
        """Entry counts by state (only the states that have entries)."""
        ...

    async def oldest_change(self, state: str) -> datetime | None:
        """When the entry in `state` that changed least recently last changed."""
        ...

    async def stats(self) -> dict[tuple[str, str], int]:
        """Entry counts by (state, upstream)."""
        ...

    async def entry(self, reference: str) -> tuple[EntryRow, list[TransitionView]]:
        """The entry an id, an idempotency key or a unique id prefix names, and its history
        (raises `EntryNotFound`, `AmbiguousReference`)."""
        ...

    async def find_entry(self, reference: str) -> EntryRow:
        """The entry an id, an idempotency key or a unique id prefix names."""
        ...

    async def list_entries(self, wanted: EntryFilter) -> list[EntryRow]:
        """The entries `wanted` asks for, newest first."""
        ...

    async def candidates(self, limit: int, *, per_group: int) -> list[Candidate]:
        """Waiting deferred work, oldest first, at most `per_group` per (tenant, upstream)."""
        ...

    async def task_owner(self, task_id: str) -> str | None:
        """The tenant whose entry holds task `task_id`."""
        ...

    async def find_task(self, task_id: str, tenant: str) -> EntryRow | None:
        """The entry of task `task_id` if tenant `tenant` created it."""
        ...

    async def list_tasks(
        self, tenant: str, limit: int, before: tuple[datetime, str] | None, upstream: str | None
    ) -> list[EntryRow]:
        """Tenant `tenant`'s own tasks, newest first, created before `before`."""
        ...

    async def close(self) -> None:
        """Release what the reads hold."""
        ...


class LedgerReads:
    """The read side of `LedgerStore`, on the store's `_reads`."""

    _reads: Reads

    async def ping(self) -> None:
        """Return if the ledger can be read.

        Raises:
            LedgerUnavailable: it cannot.
        """
        await self._reads.ping()

    async def get(self, entry_or_key: str) -> tuple[EntryView, list[TransitionView]]:
        """An entry (by id, idempotency key, or unique id prefix) and its history.

        Raises:
            EntryNotFound, AmbiguousReference, LedgerUnavailable.
        """
        row, history = await self._reads.entry(entry_or_key)
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
        states = tuple(EntryState(s).value for s in given)
        rows = await self._reads.list_entries(EntryFilter(states, upstream, tenant, since, limit))
        return [row.view() for row in rows]

    async def stats(self) -> dict[tuple[str, str], int]:
        """Entry counts by (state, upstream)."""
        return await self._reads.stats()

    async def count_by_state(self) -> dict[str, int]:
        """Entry counts by state; every state is present, zero when empty."""
        counts = await self._reads.count_by_state()
        return {state.value: counts.get(state.value, 0) for state in EntryState}

    async def oldest_in_state(self, state: EntryState | str) -> datetime | None:
        """When the longest-waiting entry in `state` entered it (e.g. the oldest `unknown`)."""
        return await self._reads.oldest_change(EntryState(state).value)

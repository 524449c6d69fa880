"""`DeferredWork`: the ledger's interface for deferred work (`LedgerStore.deferred`).

Deferred work is a call the proxy admitted and recorded whole (`accepted`, with its request and a
task id) to run later, when admission allows; the caller polls the task for its result. Writes
are group-committed with every other write of the store (`ledger.deferred_ops`); reads use short
connections of their own (the store's `ledger.reads.Reads`).
Task lookups always name the tenant: a task id read by another tenant is not found.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Literal, TypeVar

from ledger.deferred_input import AwaitInput, InputResult, ProvideInput
from ledger.deferred_ops import (
    CancelDeferred,
    CancelResult,
    ClaimDeferred,
    Defer,
    DeferResult,
    FinishDeferred,
    NoteUpstreamTask,
    Requeue,
)
from ledger.operations import Operation
from ledger.reads import Reads
from ledger.views import UPSTREAM_TASK_PREFIX, Candidate, ClaimRequest, EntryView, Outcome

__all__ = ["Candidate", "DeferredWork", "TaskPage", "upstream_task_id"]

T = TypeVar("T")
_TASK_ID_CHARS = 64  # ledger_entries.task_id is VARCHAR(64)
Submit = Callable[[Operation[T]], Awaitable[T]]


def upstream_task_id(upstream: str, task_id: str) -> str:
    """How the ledger names a task that `upstream` itself created: `up:<upstream>:<id>`, or, when
    that would not fit the column (an upstream chooses its ids' length), `up:sha256:` and 54 hex
    digits of the digest of upstream and id."""
    named = f"{UPSTREAM_TASK_PREFIX}{upstream}:{task_id}"
    if len(named) <= _TASK_ID_CHARS:
        return named
    digest = hashlib.sha256(f"{upstream}\0{task_id}".encode()).hexdigest()
    prefix = f"{UPSTREAM_TASK_PREFIX}sha256:"
    return prefix + digest[: _TASK_ID_CHARS - len(prefix)]


class TaskPage:
    """One page of a tenant's tasks and the cursor of the next (None: the last page)."""

    __slots__ = ("entries", "next_cursor")

    def __init__(self, entries: list[EntryView], next_cursor: str | None) -> None:
        self.entries = entries
        self.next_cursor = next_cursor


def _cursor(entry: EntryView) -> str:
    raw = f"{entry.created_at.isoformat()}|{entry.id}".encode()
    return base64.urlsafe_b64encode(raw).decode()


def _parse_cursor(cursor: str) -> tuple[datetime, str]:
    """Raises ValueError for a cursor this ledger did not give out (those name their time's
    zone: a time without one would compare with no stored time)."""
    try:
        created, entry_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|", 1)
        moment = datetime.fromisoformat(created)
    except (UnicodeDecodeError, ValueError, TypeError) as exc:
        raise ValueError(f"not a task list cursor: {cursor[:64]!r}") from exc
    if moment.utcoffset() is None:
        raise ValueError(f"not a task list cursor: {cursor[:64]!r}")
    return moment, entry_id


class DeferredWork:
    """Deferred work in one `LedgerStore` (get it as `store.deferred`)."""

    def __init__(self, submit: Submit[Any], reads: Reads) -> None:
        self._submit = submit
        self._reads = reads

    # -- writes ---------------------------------------------------------------------------

    async def defer(
        self, req: ClaimRequest, request: bytes, *, max_per_tenant: int, max_per_upstream: int
    ) -> DeferResult:
        """Record `request` as accepted work (a new task), unless the key's entry answers for it
        or the accepted work of the tenant or upstream is at its bound ("full").

        Raises:
            LedgerUnavailable: nothing was recorded; the call must not be accepted.
        """
        op = Defer(req, request, max_per_tenant, max_per_upstream)
        result: DeferResult = await self._submit(op)
        return result

    async def claim(self, entry_id: str) -> EntryView | None:
        """Write-ahead of waiting work: accepted → running under a lease of this replica,
        committed before this returns (the entry carries the request). None: it is no longer
        waiting (another replica took it, it was cancelled or finished).

        Raises:
            LedgerUnavailable: nothing was decided; the work must not run.
        """
        claimed: EntryView | None = await self._submit(ClaimDeferred(entry_id))
        return claimed

    async def requeue(
        self,
        entry_id: str,
        token: int,
        *,
        reason: str,
        retry_after_s: float | None,
        give_up: bool = False,
    ) -> EntryView:
        """The attempt certainly did not run: back in line (running → rejected → accepted), or
        with `give_up` refused for good (rejected, its request forgotten).

        Raises:
            StaleToken, IllegalTransition, EntryNotFound, LedgerUnavailable: as `finish`.
        """
        op = Requeue(entry_id, token, reason, retry_after_s, give_up)
        entry: EntryView = await self._submit(op)
        return entry

    async def finish(
        self,
        entry_id: str,
        token: int,
        *,
        state: Literal["succeeded", "failed"],
        outcome: Outcome,
        error: str | None,
        max_bytes: int,
    ) -> EntryView:
        """Record the result (kept up to `max_bytes`, else as its sha256) and forget the request.

        Raises:
            StaleToken, IllegalTransition, EntryNotFound, LedgerUnavailable: as `finish`.
        """
        op = FinishDeferred(entry_id, token, state, outcome, error, max_bytes)
        entry: EntryView = await self._submit(op)
        return entry

    async def await_input(
        self, entry_id: str, token: int, *, question: bytes, max_bytes: int
    ) -> EntryView:
        """The attempt's tool asked for input (nothing ran): running → rejected, keeping the
        request and `question` (kept up to `max_bytes`) until `provide_input`.

        Raises:
            StaleToken, IllegalTransition, EntryNotFound, LedgerUnavailable: as `finish`.
        """
        entry: EntryView = await self._submit(AwaitInput(entry_id, token, question, max_bytes))
        return entry

    async def provide_input(
        self, entry_id: str, token: int, *, request: bytes, actor: str
    ) -> InputResult:
        """The answers of work waiting for input (read at fencing token `token`): `request`
        replaces its request and it goes back in line (rejected → accepted).

        Raises:
            EntryNotFound, LedgerUnavailable.
        """
        result: InputResult = await self._submit(ProvideInput(entry_id, token, request, actor))
        return result

    async def cancel(self, entry_id: str, *, actor: str, reason: str) -> CancelResult:
        """Refuse waiting work for good (a caller's cancel, or a request that cannot run any
        more), or work waiting for input; work that started or finished is left as it is.

        Raises:
            EntryNotFound, LedgerUnavailable.
        """
        result: CancelResult = await self._submit(CancelDeferred(entry_id, actor, reason))
        return result

    async def note_upstream_task(self, entry_id: str, upstream: str, task_id: str) -> EntryView:
        """The call of `entry_id` was answered with the upstream's own task `task_id`.

        Raises:
            EntryNotFound, LedgerUnavailable.
        """
        op = NoteUpstreamTask(entry_id, upstream_task_id(upstream, task_id))
        entry: EntryView = await self._submit(op)
        return entry

    # -- reads ----------------------------------------------------------------------------

    async def task_owner(self, task_id: str) -> str | None:
        """The tenant of task `task_id` as the ledger names it (None: unknown).

        Raises:
            LedgerUnavailable.
        """
        return await self._reads.task_owner(task_id)

    async def upstream_task_owner(self, upstream: str, task_id: str) -> str | None:
        """The tenant whose call got `upstream`'s own task `task_id` (None: not recorded).

        Raises:
            LedgerUnavailable.
        """
        return await self.task_owner(upstream_task_id(upstream, task_id))

    async def task(self, task_id: str, tenant: str) -> EntryView | None:
        """Task `task_id` of tenant `tenant` (None: no such task for this tenant).

        Raises:
            LedgerUnavailable.
        """
        row = await self._reads.find_task(task_id, tenant)
        return None if row is None else row.view()

    async def tasks(
        self,
        tenant: str,
        *,
        limit: int = 50,
        cursor: str | None = None,
        upstream: str | None = None,
    ) -> TaskPage:
        """A page of tenant `tenant`'s tasks (on `upstream` only, if given), newest first.

        Raises:
            ValueError: `cursor` is not one this ledger gave out.
            LedgerUnavailable.
        """
        before = None if cursor is None else _parse_cursor(cursor)
        rows = await self._reads.list_tasks(tenant, limit + 1, before, upstream)
        entries = [row.view() for row in rows[:limit]]
        more = len(rows) > limit
        return TaskPage(entries, _cursor(entries[-1]) if more and entries else None)

    async def candidates(self, limit: int, *, per_group: int = 1000) -> list[Candidate]:
        """Waiting work, oldest first (without requests), at most `per_group` calls of each
        tenant and upstream, for the dispatcher.

        Raises:
            LedgerUnavailable.
        """
        return await self._reads.candidates(limit, per_group=per_group)

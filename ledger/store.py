"""`LedgerStore`: the ledger's one interface for the proxy and the CLI.

Writes go through the group-commit writer (one transaction and one fsync per batch); reads
(`ledger.reads`) never use the writer's connection. Every method that touches the database raises
`LedgerUnavailable` when it cannot, so callers fail closed on one exception type.

On SQLite every statement goes through the stdlib driver (`ledger.sqlite_transactions`,
`ledger.sqlite_reads`): the query toolkit (SQLAlchemy, SQLModel, aiosqlite: about 26 MB resident
once imported) is loaded only to migrate in-process. PostgreSQL opens the toolkit's engines at
once (its writer's connection comes from them; its reads use them).

Times the ledger decides with (leases, their expiry, the dedup window, retention) come from the
database's clock, read inside each write transaction: replicas whose own clocks disagree still
agree on when a lease ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal

from ledger.batch import OpContext, new_entry_id
from ledger.deferred import DeferredWork
from ledger.errors import LedgerError, LedgerUnavailable
from ledger.finishing import BackgroundFinishes
from ledger.in_flight import CallsInFlight
from ledger.operations import (
    DEFAULT_MAX_ATTEMPTS,
    Claim,
    Finish,
    MarkUnknown,
    RecordRejection,
    ReleaseUnsent,
    Renew,
)
from ledger.reads import LedgerReads, Reads
from ledger.reconcile_ops import Purge, Resolve, Sweep
from ledger.schema_check import schema_at_head
from ledger.sqlite_connect import is_sqlite_url, sqlite_path
from ledger.sqlite_reads import SQLiteReads
from ledger.sqlite_transactions import SQLiteTransactions
from ledger.transactions import Transactions
from ledger.views import ClaimRequest, ClaimResult, EntryView, Outcome
from ledger.writer import GroupCommitWriter, WriterStats
from policies.model import LedgerSettings

if TYPE_CHECKING:
    from ledger.db import Engines

__all__ = ["LedgerStore", "utcnow"]

_GROUP_COMMIT_MAX_BATCH = 256
_FINISH_DRAIN_S = 10.0  # how long close() lets background finishes land
_PURGE_BATCH = 500  # rows deleted per transaction: the write lock is never held for long


def utcnow() -> datetime:
    """The current time, timezone-aware UTC (the default clock)."""
    return datetime.now(UTC)


class LedgerStore(LedgerReads):
    """The durable side-effect ledger. Open with `await LedgerStore.open(...)`; close when done."""

    def __init__(
        self,
        settings: LedgerSettings,
        *,
        owner: str,
        sqlite: SQLiteReads | None,
        engines: Engines | None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        """Use `open`. `sqlite`: the SQLite ledger's reader (None: PostgreSQL, on `engines`)."""
        self._settings = settings
        self._owner = owner
        self._toolkit = engines
        transactions: Transactions
        if sqlite is not None:
            self._reads: Reads = sqlite
            transactions = SQLiteTransactions(
                sqlite.path, settings.durability, self._context, clock
            )
        else:
            from ledger.pg_transactions import PostgresTransactions
            from ledger.toolkit_reads import ToolkitReads

            assert engines is not None
            self._reads = ToolkitReads(engines)
            transactions = PostgresTransactions(engines.write, self._context, clock)
        max_batch = _GROUP_COMMIT_MAX_BATCH if settings.group_commit else 1
        self._in_flight = CallsInFlight(settings.lease_s) if settings.commit_delay_ms else None
        self._writer = GroupCommitWriter(
            transactions,
            max_batch=max_batch,
            commit_delay_s=settings.commit_delay_ms / 1000,
            in_flight=self._in_flight.count if self._in_flight is not None else None,
        )
        self._finishing = BackgroundFinishes()
        self._closed = False
        self.deferred = DeferredWork(self._writer.submit, self._reads)
        """Deferred work: accepted calls with their requests, claimed later (`ledger.deferred`)."""

    @classmethod
    async def open(
        cls,
        settings: LedgerSettings,
        *,
        owner: str,
        migrate: bool = True,
        migrate_in_child: bool = False,
        clock: Callable[[], datetime] | None = None,
    ) -> LedgerStore:
        """Connect, migrate the schema to head (or with `migrate=False` check it is there).

        `migrate_in_child`: a schema that is behind is migrated by a child process first, so
        that the migration tool never loads here (a long-lived proxy); if the child fails, the
        migration runs here as it would have.

        With `migrate=False` a SQLite file that does not exist is not created.

        `owner` is this replica's id: it owns the leases of the entries it claims.

        `clock` stands in for the database's clock (tests); by default every write takes its
        time from the database, never from this replica's wall clock.

        Raises:
            LedgerUnavailable: the database cannot be reached, or its schema is not current.
            LedgerError: the URL is not usable.
        """
        if clock is not None and clock().utcoffset() is None:
            raise LedgerError("the ledger clock must return timezone-aware datetimes")
        sqlite, engines = None, None
        if is_sqlite_url(settings.url):
            file = sqlite_path(settings.url)
            if not migrate and not file.exists():
                raise LedgerUnavailable(
                    f"no ledger database at {file} (run `interlock ledger migrate`)"
                )
            sqlite = SQLiteReads(file, settings.durability)
        else:
            from ledger.db import open_engines

            engines = open_engines(settings)
        try:
            engines = await schema_at_head(
                settings, sqlite, engines, migrate=migrate, in_child=migrate_in_child
            )
        except BaseException:
            if sqlite is not None:
                await sqlite.close()
            if engines is not None:
                await engines.dispose()
            raise
        return cls(settings, owner=owner, sqlite=sqlite, engines=engines, clock=clock)

    async def close(self) -> None:
        """Let background finishes land (bounded), commit what is queued, then release every
        connection."""
        if self._closed:
            return
        await self._finishing.drain(_FINISH_DRAIN_S)
        self._closed = True
        try:
            await self._writer.close()
        finally:
            await self._reads.close()
            if self._toolkit is not None:
                await self._toolkit.dispose()

    @property
    def owner(self) -> str:
        """This replica's id."""
        return self._owner

    @property
    def writer_stats(self) -> WriterStats:
        """Group commits so far and the write operations they carried."""
        return self._writer.stats

    @property
    def settings(self) -> LedgerSettings:
        """The settings this store was opened with."""
        return self._settings

    # -- writes (group-committed) -------------------------------------------------------------

    async def claim(self, req: ClaimRequest) -> ClaimResult:
        """Check the idempotency key and, for a new attempt, write `running` ahead of the call.

        "new": the entry is running, owned by this replica under a fresh lease and fencing
        token, committed before this returns. "replay": finished with the same fingerprint;
        the entry carries the stored outcome. "in_progress": running (or the proxy's own
        accepted work). "mismatch": the key was used with other arguments. "needs_reconciliation":
        unknown or blocked.

        Raises:
            LedgerUnavailable: nothing was decided; the call must not be forwarded.
        """
        result = await self._writer.submit(Claim(req))
        if self._in_flight is not None and result.kind == "new":
            self._in_flight.started(result.entry.id)
        return result

    async def finish(
        self,
        entry_id: str,
        token: int,
        *,
        state: Literal["succeeded", "failed"],
        outcome: Outcome,
        error: str | None = None,
    ) -> EntryView:
        """Record the confirmed outcome of a running entry this token owns.

        Outcomes over `max_outcome_bytes` keep only their sha256 (`outcome_retained=False`).

        Raises:
            StaleToken: the lease was taken away (the report is kept in the history).
            IllegalTransition: the entry is not running.
            EntryNotFound: no such entry.
            LedgerUnavailable: the outcome could not be recorded.
        """
        if state not in ("succeeded", "failed"):
            raise ValueError(f"finish state must be succeeded or failed, not {state!r}")
        self._ended(entry_id)
        return await self._writer.submit(Finish(entry_id, token, state, outcome, error))

    def finish_in_background(
        self,
        entry_id: str,
        token: int,
        *,
        state: Literal["succeeded", "failed"],
        outcome: Outcome,
        error: str | None = None,
        until: float,
    ) -> asyncio.Future[EntryView]:
        """`finish`, retried in the background while the ledger cannot be written, until it
        commits or the event loop's time passes `until` (when the lease would lapse): the caller
        need not wait for it. A finish that never lands is logged at ERROR with the entry id.

        The future's result is the finished entry; it raises what `finish` raises (after the
        retries, `LedgerUnavailable`). `close()` waits for these, within a bound. The first try
        goes straight to the writer; only a retry takes a task of its own.
        """
        if state not in ("succeeded", "failed"):
            raise ValueError(f"finish state must be succeeded or failed, not {state!r}")
        op = Finish(entry_id, token, state, outcome, error)

        async def attempt() -> EntryView:
            return await self._writer.submit(op)

        async def landed() -> EntryView | None:
            entry, _ = await self.get(entry_id)
            return entry if (entry.state, entry.fencing_token) == (state, token) else None

        self._ended(entry_id)
        first = self._writer.enqueue(op)
        return self._finishing.start_after(first, attempt, landed, entry_id=entry_id, until=until)

    async def mark_unknown(self, entry_id: str, token: int, *, reason: str) -> EntryView:
        """The owner no longer knows whether the call took effect: running → unknown.

        Raises:
            StaleToken, IllegalTransition, EntryNotFound, LedgerUnavailable: as for `finish`.
        """
        self._ended(entry_id)
        return await self._writer.submit(MarkUnknown(entry_id, token, reason))

    async def release_unsent(
        self, entry_id: str, token: int, *, reason: str, retry_after_s: float | None
    ) -> EntryView:
        """The call was certainly not executed (refused before sending, or answered "not
        processed", e.g. 429/503 before processing): running → rejected. The key stays usable:
        the next send with it runs the next attempt.

        Raises:
            StaleToken, IllegalTransition, EntryNotFound, LedgerUnavailable: as for `finish`.
        """
        self._ended(entry_id)
        return await self._writer.submit(ReleaseUnsent(entry_id, token, reason, retry_after_s))

    async def renew(self, entry_id: str, token: int) -> bool:
        """Extend the lease by `lease_s` from now; False if it is no longer this token's."""
        return await self._writer.submit(Renew(entry_id, token))

    async def record_rejection(
        self,
        req: ClaimRequest,
        *,
        reason: str,
        scope: str,
        retry_after_s: float,
        entry_id: str | None = None,
    ) -> EntryView | None:
        """Record a refusal as a `rejected` entry (batched with other writes).

        A new entry takes `entry_id` when one is given (from `new_entry_id()`, e.g. named in the
        refusal's answer before this write); a key that already names an entry keeps its own id.
        Returns None, writing nothing, when the key already names an entry in another state or
        with another fingerprint: a refusal never overwrites a live or finished entry.
        """
        op = RecordRejection(req, reason, scope, retry_after_s, entry_id)
        return await self._writer.submit(op)

    @staticmethod
    def new_entry_id() -> str:
        """A fresh entry id (time-ordered, then random), for a write that names it in advance."""
        return new_entry_id(utcnow())

    async def resolve(
        self,
        entry_or_key: str,
        *,
        as_: Literal["succeeded", "failed", "retry"],
        note: str | None,
        actor: str,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> EntryView:
        """An operator's reconciliation of an unknown or blocked entry (retry: also failed).

        `retry` makes the entry `accepted`; the caller's next send with the same key and
        fingerprint runs it as the next attempt. When the entry has already used
        `max_attempts` attempts, `retry` blocks it instead.

        Raises:
            EntryNotFound, AmbiguousReference: the reference names no single entry.
            IllegalTransition: the entry's state does not allow this resolution.
            LedgerUnavailable: nothing was changed.
        """
        if as_ not in ("succeeded", "failed", "retry"):
            raise ValueError(f"resolve as succeeded, failed or retry, not {as_!r}")
        row = await self._reads.find_entry(entry_or_key)
        return await self._writer.submit(Resolve(row.id, as_, note, actor, max_attempts))

    async def sweep_expired(self, limit: int = 500) -> int:
        """Turn running entries whose lease expired into unknown; return how many.

        Safe with several processes on one database: rows are locked (PostgreSQL) or the
        database is (SQLite) while the decision is made, and another replica's locked rows
        are skipped.
        """
        return await self._writer.submit(Sweep(limit))

    async def purge(
        self, *, older_than: timedelta | None = None, batch_size: int = _PURGE_BATCH
    ) -> int:
        """Delete succeeded, failed and rejected entries unchanged for `older_than`.

        The default is `retention_h`. Their keys become free again. Open entries (accepted,
        running, unknown, blocked) are never purged. Deletes `batch_size` entries per write
        transaction, queued with every other write, so claims and finishes go on meanwhile.
        Returns the number deleted.

        Raises:
            LedgerUnavailable: a batch could not be deleted (those before it were).
        """
        age = older_than if older_than is not None else timedelta(hours=self._settings.retention_h)
        total = 0
        while True:
            deleted = await self._writer.submit(Purge(age, batch_size))
            total += deleted
            if deleted < batch_size:
                return total

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def writer_restarts(self) -> int:
        """How many times the group-commit writer died and was started again."""
        return self._writer.restarts

    def _ended(self, entry_id: str) -> None:
        """The call of `entry_id` reports its end: the commit delay no longer waits for it."""
        if self._in_flight is not None:
            self._in_flight.ended(entry_id)

    def _context(self, now: datetime) -> OpContext:
        return OpContext(
            now=now,
            owner=self._owner,
            lease_s=self._settings.lease_s,
            max_outcome_bytes=self._settings.max_outcome_bytes,
            max_argument_bytes=self._settings.max_argument_bytes,
        )

"""The in-memory working set of one write transaction (pure: no I/O).

The group-commit writer loads every row a batch of operations needs, lets each operation decide
against these rows in order, and then writes back the new rows, the changed rows and the history
rows in one transaction. Operations see each other's effects, so fifty claims of one key in one
batch still yield exactly one "new".
"""

from __future__ import annotations

import base64
import hashlib
import json
import operator
import os
import secrets
import threading
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from ledger.states import EntryState
from ledger.views import EntryView, Outcome, OutcomeDigest, new_entry_view

if TYPE_CHECKING:
    import sqlite3

__all__ = [
    "ROW_FIELDS",
    "EntryRow",
    "Needs",
    "OpContext",
    "WorkingSet",
    "archived_key",
    "cap_text",
    "describe_report",
    "internal_key",
    "new_entry_id",
    "stored_outcome",
]

_INTERNAL_KEY_PREFIX = "none:"
_ARCHIVED_KEY_PREFIX = "past:"
_STATES: dict[str, EntryState] = {state.value: state for state in EntryState}


@dataclass(slots=True)
class EntryRow:
    """A mutable copy of one `ledger_entries` row, living only inside one batch."""

    id: str
    tenant: str
    upstream: str
    tool: str
    idempotency_key: str
    key_source: str
    fingerprint: str
    arguments: str | None
    state: str
    attempt: int
    owner: str | None
    lease_expires_at: datetime | None
    fencing_token: int
    work_class: str
    run_id: str | None
    trace_id: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    outcome: bytes | None
    outcome_hash: str | None
    outcome_retained: bool
    error: str | None
    retry_after_s: float | None
    note: str | None
    operator_retries: int
    """`resolve --as retry` moves so far: the operator's retry budget counts these only."""
    task_id: str | None = None
    request: bytes | None = None
    """Deferred work's whole request while it waits (see `ledger.deferred`)."""

    def values(self) -> dict[str, Any]:
        """The row as column values."""
        return dict(zip(ROW_FIELDS, _row_tuple(self), strict=True))

    def view(self) -> EntryView:
        """The row as the plain value callers see."""
        stored = self.idempotency_key
        key: str | None = stored
        superseded = False
        if stored.startswith(_INTERNAL_KEY_PREFIX) and stored == internal_key(self.id):
            key = None
        elif stored.startswith(_ARCHIVED_KEY_PREFIX) and stored.startswith(
            prefix := archived_key(self.id, "")
        ):
            key, superseded = stored[len(prefix) :], True
        return new_entry_view(  # every field of `EntryView`, in its order
            self.id,
            self.tenant,
            self.upstream,
            self.tool,
            key,
            self.key_source,
            self.fingerprint,
            _STATES[self.state],
            self.attempt,
            self.fencing_token,
            self.owner,
            self.lease_expires_at,
            self.work_class,
            self.run_id,
            self.trace_id,
            self.created_at,
            self.updated_at,
            self.started_at,
            self.finished_at,
            self.outcome,
            self.outcome_hash,
            self.outcome_retained,
            self.error,
            self.retry_after_s,
            self.note,
            self.arguments,
            self.operator_retries,
            superseded,
            self.task_id,
            self.request,
        )


ROW_FIELDS = tuple(f.name for f in fields(EntryRow))
_row_tuple = operator.attrgetter(*ROW_FIELDS)  # all column values at C speed (a hot path)


@dataclass(frozen=True, slots=True)
class OpContext:
    """What every operation of one batch shares: the transaction's time and the settings."""

    now: datetime
    owner: str
    lease_s: float
    max_outcome_bytes: int
    max_argument_bytes: int


class Loader(Protocol):
    """More reads of an operation's own (deferred work's: `ledger.deferred_rows`), run last."""

    def on_postgres(self, conn: Any, ws: WorkingSet) -> None:
        """Read (and lock) through the PostgreSQL writer's toolkit connection `conn`."""

    def on_sqlite(self, conn: sqlite3.Connection, ws: WorkingSet) -> None:
        """Read through the SQLite writer's own connection."""


@dataclass(slots=True)
class Needs:
    """The rows a batch must load (and lock, on PostgreSQL) before its operations decide."""

    ids: set[str] = field(default_factory=set)
    keys: set[tuple[str, str, str]] = field(default_factory=set)
    """(tenant, upstream, idempotency key) triples."""
    sweep_limit: int = 0
    purge: tuple[timedelta, int] | None = None
    """(age, limit): up to `limit` closed rows unchanged for `age` may be deleted."""
    loaders: list[Loader] = field(default_factory=list)
    """More reads of an operation's own, run last (see `Loader`)."""


@dataclass(slots=True)
class WorkingSet:
    """Rows loaded for one batch, plus what the batch will write back."""

    rows: dict[str, EntryRow] = field(default_factory=dict)
    expired: list[str] = field(default_factory=list)
    """Ids of running rows whose lease had expired when the batch loaded them."""
    new_ids: list[str] = field(default_factory=list)
    """Rows this batch creates, in creation order."""
    dirty: set[str] = field(default_factory=set)
    """Loaded rows this batch changes."""
    history: list[dict[str, Any]] = field(default_factory=list)
    purgeable: list[str] = field(default_factory=list)
    """Ids of closed rows old enough to purge (not loaded as rows)."""
    deleted: set[str] = field(default_factory=set)
    """Ids of rows this batch deletes."""
    loaded: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    """Column values of each loaded row as read, to write back only what changed."""
    facts: dict[str, Any] = field(default_factory=dict)
    """What `Needs.loaders` read besides rows (e.g. counts), by the name the loader gives it."""
    _by_key: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def load(self, row: EntryRow) -> None:
        """Add a row read from the database."""
        self._add(row)
        self.loaded[row.id] = _row_tuple(row)

    def _add(self, row: EntryRow) -> None:
        self.rows[row.id] = row
        self._by_key[(row.tenant, row.upstream, row.idempotency_key)] = row.id

    def find(self, tenant: str, upstream: str, key: str) -> EntryRow | None:
        """The row holding this key in this scope, if any."""
        row_id = self._by_key.get((tenant, upstream, key))
        return None if row_id is None else self.rows[row_id]

    def insert(self, row: EntryRow) -> None:
        """Add a row this batch creates."""
        self._add(row)
        self.new_ids.append(row.id)

    def new_rows(self) -> list[EntryRow]:
        """The rows this batch inserts, in key order: two batches inserting the same keys then
        wait for each other rather than deadlock."""
        return sorted(
            (self.rows[i] for i in self.new_ids),
            key=lambda r: (r.idempotency_key, r.tenant, r.upstream),
        )

    def touch(self, row: EntryRow, now: datetime) -> None:
        """Mark a row as changed by this batch."""
        row.updated_at = now
        if row.id in self.loaded:
            self.dirty.add(row.id)

    def release_key(self, row: EntryRow) -> None:
        """Take `row`'s key out of its scope (the entry stays, unchanged otherwise): the next
        claim of that key in this batch starts a new entry."""
        scope = (row.tenant, row.upstream, row.idempotency_key)
        if self._by_key.get(scope) == row.id:
            del self._by_key[scope]
        row.idempotency_key = archived_key(row.id, row.idempotency_key)
        if row.id in self.loaded:
            self.dirty.add(row.id)

    def changes(self, row_id: str) -> dict[str, Any]:
        """The columns of a dirty row whose values differ from those loaded."""
        before = self.loaded[row_id]
        after = _row_tuple(self.rows[row_id])
        return {
            name: new
            for name, new, old in zip(ROW_FIELDS, after, before, strict=True)
            if new != old
        }

    def record(
        self,
        row: EntryRow,
        from_state: str | None,
        *,
        at: datetime,
        actor: str,
        reason: str,
        evidence: dict[str, Any] | None = None,
    ) -> None:
        """Append a history row for `row`, whose state is already the new one."""
        self.history.append(
            {
                "entry_id": row.id,
                "from_state": from_state,
                "to_state": row.state,
                "at": at,
                "actor": actor,
                "reason": reason,
                "attempt": row.attempt,
                "fencing_token": row.fencing_token,
                "evidence": None if evidence is None else json.dumps(evidence, sort_keys=True),
            }
        )


_COUNTER_START = 1 << 15  # a millisecond's first count is below it: room to count up after
_RECENT_MS = 64  # milliseconds whose last count is remembered (a batch's time may lag the clock)
_RANDOM_BYTES = 4096  # drawn from the system's random source at once: 512 ids' random parts
_ids = threading.Lock()
_last_count: dict[int, int] = {}  # by millisecond, the count of the last id made here for it
_random = bytearray()  # random bytes not yet used by an id (taken from the end)


def _forget_random() -> None:
    """A forked child must not make the ids its parent makes next from the same bytes (nor find
    the ids' lock held by a thread that was not forked with it)."""
    global _ids
    _ids = threading.Lock()
    _random.clear()
    _last_count.clear()


os.register_at_fork(after_in_child=_forget_random)


def new_entry_id(now: datetime) -> str:
    """A 32-hex-digit id: the creation time in milliseconds (12 digits), a count (4 digits), then
    random (16 digits). Ids sort by creation time, and those this process makes within one
    millisecond in the order they were made: the millisecond's first count is random (15 bits),
    the next ones count up from it (for the last `_RECENT_MS` milliseconds ids were made for; a
    clock that steps back past them loses that order, never uniqueness, which the 64 random bits
    carry). A 20-digit prefix names one entry among those this process made in one millisecond;
    between processes it holds the first count's 15 random bits and 16 more. The random bits
    come from the system's source (`os.urandom`), drawn a few thousand bytes at a time: one
    system call per 512 ids, not one per id."""
    ms = int(now.timestamp() * 1000)
    with _ids:
        count = _last_count.pop(ms, None)
        if count is None or count + 1 > 0xFFFF:
            count = secrets.randbelow(_COUNTER_START)
        else:
            count += 1
        _last_count[ms] = count  # re-inserted last: the most recently used
        if len(_last_count) > _RECENT_MS:
            del _last_count[next(iter(_last_count))]
        if len(_random) < 8:
            _random[:] = os.urandom(_RANDOM_BYTES)
        tail = _random[-8:]
        del _random[-8:]
    return f"{ms:012x}{count:04x}{tail.hex()}"


def internal_key(entry_id: str) -> str:
    """The unique key stored for a call without an idempotency key (key mode "none")."""
    return f"{_INTERNAL_KEY_PREFIX}{entry_id}"


def archived_key(entry_id: str, key: str) -> str:
    """The key stored for an entry that no longer answers for `key` (its dedup window passed
    and a later entry took the key): out of the unique index, `key` still readable from it."""
    return f"{_ARCHIVED_KEY_PREFIX}{entry_id}:{key}"


def cap_text(text: str | None, max_bytes: int) -> str | None:
    """`text` cut to at most `max_bytes` UTF-8 bytes, with a marker saying how long it was."""
    if text is None:
        return None
    raw = text.encode()
    if len(raw) <= max_bytes:
        return text
    marker = f"…[truncated, {len(raw)} bytes]"
    room = max(0, max_bytes - len(marker.encode()))
    return raw[:room].decode(errors="ignore") + marker


def stored_outcome(outcome: Outcome, max_bytes: int) -> tuple[bytes | None, str | None, bool]:
    """(bytes to keep, sha256 hex, retained): over `max_bytes` only the hash is kept."""
    if outcome is None:
        return None, None, True
    if isinstance(outcome, OutcomeDigest):
        return None, outcome.sha256, False
    digest = hashlib.sha256(outcome).hexdigest()
    if len(outcome) > max_bytes:
        return None, digest, False
    return outcome, digest, True


def describe_report(outcome: Outcome, error: str | None, max_bytes: int) -> dict[str, Any]:
    """Evidence describing a report the ledger refused: the outcome itself when small enough."""
    evidence: dict[str, Any] = {"error": error}
    if isinstance(outcome, OutcomeDigest):
        evidence["outcome_sha256"] = outcome.sha256
        evidence["outcome_bytes"] = outcome.size
    elif outcome is not None:
        evidence["outcome_sha256"] = hashlib.sha256(outcome).hexdigest()
        evidence["outcome_bytes"] = len(outcome)
        if len(outcome) <= max_bytes:
            evidence["outcome_b64"] = base64.b64encode(outcome).decode()
    return evidence

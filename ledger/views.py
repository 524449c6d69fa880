"""Plain values that cross the ledger's boundary; no ORM object ever leaves `ledger/`."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

from ledger.errors import AmbiguousReference
from ledger.states import EntryState

__all__ = [
    "FIND_LIMIT",
    "UPSTREAM_TASK_PREFIX",
    "Candidate",
    "ClaimKind",
    "ClaimRequest",
    "ClaimResult",
    "EntryFilter",
    "EntryView",
    "Outcome",
    "OutcomeDigest",
    "ReferenceKind",
    "TransitionView",
    "entry_json",
    "new_entry_view",
    "one_entry",
    "positional_builder",
    "reference_lookups",
    "transition_json",
]

T = TypeVar("T")

ClaimKind = Literal["new", "replay", "in_progress", "mismatch", "needs_reconciliation"]


@dataclass(frozen=True, slots=True)
class OutcomeDigest:
    """An outcome the caller saw but the proxy did not keep (larger than `max_outcome_bytes`):
    only its sha256 and size, computed as it streamed through. Recorded like an outcome too large
    to keep: no bytes, the hash, `outcome_retained=False`."""

    sha256: str
    size: int


Outcome = bytes | OutcomeDigest | None
"""What a finish reports: the outcome's bytes, its digest only, or nothing."""


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """A side-effecting call that wants to run (or that admission refused)."""

    tenant: str
    upstream: str
    tool: str
    """MCP tool name, or "POST /v1/..." for HTTP upstreams."""
    idempotency_key: str | None
    """`None` = key mode "none": always a new entry."""
    key_source: str
    """"explicit" | "derived" | "none"."""
    fingerprint: str
    """sha256 hex of the canonical arguments."""
    arguments: str | None = None
    """Redacted JSON text; the ledger caps its size (`LedgerSettings.max_argument_bytes`)."""
    work_class: str = "interactive"
    run_id: str | None = None
    trace_id: str | None = None
    dedup_window_s: float | None = None
    """`None`: the key answers for as long as its entry is kept (explicit keys). A number (derived
    keys): a `succeeded`, `failed` or `rejected` entry whose last transition is older than this,
    by the database's clock, no longer answers; the claim starts a new entry for the key and the
    old one stays in the history. `running`, `unknown`, `blocked` and `accepted` entries answer
    for their key whatever the window."""


@dataclass(frozen=True, slots=True)
class EntryView:
    """One ledger entry as plain values. Datetimes are timezone-aware UTC."""

    id: str
    tenant: str
    upstream: str
    tool: str
    idempotency_key: str | None
    """`None` for key_source "none" (the row holds a unique internal key instead)."""
    key_source: str
    fingerprint: str
    state: EntryState
    attempt: int
    fencing_token: int
    owner: str | None
    lease_expires_at: datetime | None
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
    """False when the outcome was over `max_outcome_bytes` and only its sha256 was kept."""
    error: str | None
    retry_after_s: float | None
    note: str | None
    arguments: str | None
    operator_retries: int = 0
    """How many times an operator retried it (`resolve --as retry`); the proxy's own
    hand-overs of attempts that certainly did not run are not counted."""
    superseded: bool = False
    """A later entry answers for this key (a derived key's dedup window had passed)."""
    task_id: str | None = None
    """Deferred work's handle (or `up:<upstream>:<id>` for a task the upstream created)."""
    request: bytes | None = None
    """Deferred work's whole request while it waits; never shown (it may carry secrets)."""


def positional_builder(cls: type[T]) -> Callable[..., T]:
    """A constructor of the frozen, slotted dataclass `cls` that takes every field positionally,
    in declaration order, and sets each slot through its own descriptor.

    The frozen dataclass's generated `__init__` goes through `object.__setattr__` field by field;
    this costs about half as much, which matters for `EntryView` (30 fields, built for every
    claim and every finish on the writer's thread). Compiled once, as `dataclasses` compiles
    `__init__`. No defaults and no `__post_init__`: every value must be given.
    """
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    scope.update({f"_set_{name}": getattr(cls, name).__set__ for name in names})
    lines = [f"def build({', '.join(names)}):", "    obj = _new(_cls)"]
    lines += [f"    _set_{name}(obj, {name})" for name in names]
    lines.append("    return obj")
    exec("\n".join(lines), scope)  # our own field names only: nothing from outside
    build: Callable[..., T] = scope["build"]
    return build


new_entry_view: Callable[..., EntryView] = positional_builder(EntryView)
"""`EntryView(...)` with every field given positionally, at half the cost."""


@dataclass(frozen=True, slots=True)
class TransitionView:
    """One row of an entry's append-only history. `from_state == to_state` marks a note."""

    id: int
    entry_id: str
    from_state: EntryState | None
    to_state: EntryState
    at: datetime
    actor: str
    reason: str
    attempt: int
    fencing_token: int
    evidence: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """The answer to a claim. For "new" the entry is `running`, committed, owned by the caller."""

    kind: ClaimKind
    entry: EntryView


def entry_json(entry: EntryView) -> dict[str, Any]:
    """The entry as JSON-ready values: ISO 8601 times; the outcome as `outcome_b64`, and also
    as `outcome` text when it is UTF-8."""
    data: dict[str, Any] = {}
    for f in dataclasses.fields(entry):
        value = getattr(entry, f.name)
        data[f.name] = value.isoformat() if isinstance(value, datetime) else value
    request = data.pop("request")
    data["request_bytes"] = None if request is None else len(request)
    outcome = entry.outcome
    data["outcome"] = None
    data["outcome_b64"] = None if outcome is None else base64.b64encode(outcome).decode()
    if outcome is not None:
        with contextlib.suppress(UnicodeDecodeError):  # binary: only outcome_b64
            data["outcome"] = outcome.decode()
    return data


def transition_json(transition: TransitionView) -> dict[str, Any]:
    """A history row as JSON-ready values."""
    data = dataclasses.asdict(transition)
    data["at"] = transition.at.isoformat()
    return data


UPSTREAM_TASK_PREFIX = "up:"
"""Task ids the ledger keeps for tasks an upstream created (`up:<upstream>:<its id>`); the
proxy's own are URL-safe base64, which never contains ':'."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """Waiting deferred work as the dispatcher sees it (without its request)."""

    entry_id: str
    tenant: str
    upstream: str
    tool: str
    work_class: str
    run_id: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class EntryFilter:
    """The entries a list asks for: those matching every filter given, newest first, at most
    `limit`."""

    states: tuple[str, ...] = ()
    upstream: str | None = None
    tenant: str | None = None
    since: datetime | None = None
    limit: int = 100


FIND_LIMIT = 6
"""Rows a reference's look-up reads: one names the entry, more than one lists a few of them."""
_MIN_PREFIX = 6  # an id prefix names an entry from six hex digits on
ReferenceKind = Literal["id", "key", "prefix"]


def reference_lookups(reference: str) -> list[tuple[ReferenceKind, str]]:
    """How an operator's reference is looked up, in order: as an entry id, as an idempotency key,
    then (six hex digits or more) as a lowercased id prefix."""
    lookups: list[tuple[ReferenceKind, str]] = [("id", reference), ("key", reference)]
    lowered = reference.lower()
    if len(lowered) >= _MIN_PREFIX and all(ch in "0123456789abcdef" for ch in lowered):
        lookups.append(("prefix", lowered))
    return lookups


class _Identified(Protocol):
    @property
    def id(self) -> str: ...


R = TypeVar("R", bound=_Identified)


def one_entry(reference: str, rows: list[R]) -> R | None:
    """The one row a look-up found, None for none (the next look-up is tried).

    Raises:
        AmbiguousReference: the look-up found several.
    """
    if len(rows) > 1:
        raise AmbiguousReference(reference, [row.id for row in rows])
    return rows[0] if rows else None

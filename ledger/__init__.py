"""The durable side-effect ledger: write-ahead claims keyed by idempotency key, leases with
fencing tokens, an append-only history, and group commit (see DESIGN.md, "Ledger states").

Importing the package loads no query toolkit: a proxy on a SQLite ledger never needs it
(`ledger.store`)."""

from __future__ import annotations

from ledger.deferred_ops import waits_for_input
from ledger.errors import (
    AmbiguousReference,
    EntryNotFound,
    IllegalTransition,
    LedgerError,
    LedgerUnavailable,
    StaleToken,
)
from ledger.operations import DEFAULT_MAX_ATTEMPTS
from ledger.states import EntryState
from ledger.store import LedgerStore, utcnow
from ledger.views import (
    ClaimKind,
    ClaimRequest,
    ClaimResult,
    EntryView,
    Outcome,
    OutcomeDigest,
    TransitionView,
    entry_json,
    transition_json,
)
from policies.model import LedgerSettings

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "AmbiguousReference",
    "ClaimKind",
    "ClaimRequest",
    "ClaimResult",
    "EntryNotFound",
    "EntryState",
    "EntryView",
    "IllegalTransition",
    "LedgerError",
    "LedgerStore",
    "LedgerUnavailable",
    "Outcome",
    "OutcomeDigest",
    "StaleToken",
    "TransitionView",
    "entry_json",
    "migrate_ledger",
    "transition_json",
    "utcnow",
    "waits_for_input",
]


async def migrate_ledger(settings: LedgerSettings) -> tuple[str | None, str]:
    """Migrate the ledger at `settings.url` to head: (revision before, revision after).

    `ledger.migrate.migrate_ledger`, imported only when a migration is asked for.

    Raises:
        LedgerUnavailable: the database cannot be reached or written.
        LedgerError: the URL is not usable.
    """
    from ledger import migrate

    return await migrate.migrate_ledger(settings)

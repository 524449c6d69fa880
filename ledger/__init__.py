"""The durable side-effect ledger: write-ahead claims keyed by idempotency key, leases with
fencing tokens, an append-only history, and group commit (see DESIGN.md, "Ledger states")."""

from ledger.deferred_ops import waits_for_input
from ledger.errors import (
    AmbiguousReference,
    EntryNotFound,
    IllegalTransition,
    LedgerError,
    LedgerUnavailable,
    StaleToken,
)
from ledger.migrate import migrate_ledger
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

"""The ledger's exceptions: one rooted tree, so callers catch what they can act on.

    LedgerError                 anything the ledger refuses or cannot do
    ├── LedgerUnavailable       the database cannot be read or written (refused connection, disk
    │                           full, locked past the busy timeout, schema not migrated); the proxy
    │                           fails closed on it
    ├── StaleToken              a fencing token that no longer owns the entry (the report is kept as
    │                           evidence in the entry's history)
    ├── IllegalTransition       the state machine does not allow this move from the entry's state
    ├── EntryNotFound           no entry has this id or idempotency key
    └── AmbiguousReference      an id prefix or key names more than one entry

Database errors are translated into `LedgerUnavailable` in one place (`ledger.db.translate_errors`),
always `raise … from exc`.
"""

from __future__ import annotations

__all__ = [
    "AmbiguousReference",
    "EntryNotFound",
    "IllegalTransition",
    "LedgerError",
    "LedgerUnavailable",
    "StaleToken",
]


class LedgerError(Exception):
    """Root of the ledger's exceptions."""


class LedgerUnavailable(LedgerError):
    """The ledger database cannot be read or written."""


class StaleToken(LedgerError):
    """A fencing token that no longer owns the entry: a newer decision has been made."""

    def __init__(self, entry_id: str, token: int, current_token: int, state: str) -> None:
        super().__init__(
            f"entry {entry_id}: token {token} is stale "
            f"(current token {current_token}, state {state}); the report was kept as evidence"
        )
        self.entry_id = entry_id
        self.token = token
        self.current_token = current_token
        self.state = state


class IllegalTransition(LedgerError):
    """A move the ledger's state machine does not allow."""

    def __init__(self, entry_id: str | None, from_state: str | None, to_state: str, why: str = ""):
        entry = f"entry {entry_id or '(new)'}"
        if why:
            super().__init__(f"{entry} is {from_state or 'new'}: {why}")
        else:
            super().__init__(f"{entry}: {from_state or '(new)'} → {to_state} is not allowed")
        self.entry_id = entry_id
        self.from_state = from_state
        self.to_state = to_state


class EntryNotFound(LedgerError):
    """No entry has this id, id prefix or idempotency key."""

    def __init__(self, reference: str) -> None:
        super().__init__(f"no ledger entry matches {reference!r}")
        self.reference = reference


class AmbiguousReference(LedgerError):
    """An id prefix or an idempotency key that names more than one entry."""

    def __init__(self, reference: str, candidates: list[str]) -> None:
        shown = ", ".join(candidates[:5]) + (" …" if len(candidates) > 5 else "")
        super().__init__(
            f"{reference!r} names {len(candidates)} entries ({shown}); give the entry id"
        )
        self.reference = reference
        self.candidates = candidates

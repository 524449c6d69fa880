"""The ledger's states and the only moves allowed between them (DESIGN.md, "Ledger states").

    (new) ──claim──► running ──finish──► succeeded | failed
      │                 ├── lease expiry / mark_unknown ──► unknown
      │                 └── release_unsent (certainly not sent) ──► rejected
      └──refusal──► rejected ──same key sent again──► running (attempt + 1)
    unknown | blocked ──operator──► succeeded | failed
    unknown | failed | blocked ──operator retry──► accepted ──next send──► running (attempt + 1)
    unknown | failed ──operator retry past the retry budget──► blocked
    (new) | rejected ──deferred──► accepted ──the dispatcher claims it──► running
    accepted ──cancelled before it ran, or refused for good──► rejected

Deferred work (an accepted entry carrying its request) whose attempt certainly did not run goes
running → rejected → accepted: back in line, never straight from running to accepted.

A history row whose `from_state` equals its `to_state` is a note, not a move: a repeated refusal of
a rejected key, or a stale owner's report kept as evidence.
"""

from __future__ import annotations

from enum import StrEnum

from ledger.errors import IllegalTransition

__all__ = [
    "NEEDS_RECONCILIATION",
    "PURGEABLE",
    "TERMINAL",
    "EntryState",
    "check_transition",
    "is_legal",
]


class EntryState(StrEnum):
    """Where a side effect stands."""

    ACCEPTED = "accepted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"
    BLOCKED = "blocked"
    REJECTED = "rejected"


_S = EntryState
_LEGAL: dict[EntryState | None, frozenset[EntryState]] = {
    None: frozenset({_S.RUNNING, _S.REJECTED, _S.ACCEPTED}),
    _S.ACCEPTED: frozenset({_S.RUNNING, _S.REJECTED}),
    _S.RUNNING: frozenset({_S.SUCCEEDED, _S.FAILED, _S.UNKNOWN, _S.REJECTED}),
    _S.REJECTED: frozenset({_S.RUNNING, _S.ACCEPTED}),
    _S.UNKNOWN: frozenset({_S.SUCCEEDED, _S.FAILED, _S.ACCEPTED, _S.BLOCKED}),
    _S.FAILED: frozenset({_S.ACCEPTED, _S.BLOCKED}),
    _S.BLOCKED: frozenset({_S.SUCCEEDED, _S.FAILED, _S.ACCEPTED}),
    _S.SUCCEEDED: frozenset(),
}

TERMINAL = frozenset({_S.SUCCEEDED, _S.FAILED})
"""Finished: a same-key, same-fingerprint call replays the stored outcome."""
NEEDS_RECONCILIATION = frozenset({_S.UNKNOWN, _S.BLOCKED})
"""Left only by an operator (or a probe): never replayed, never re-sent automatically."""
PURGEABLE = frozenset({_S.SUCCEEDED, _S.FAILED, _S.REJECTED})
"""Closed facts that retention may delete; open ones (running, unknown, …) are never purged."""


def is_legal(from_state: EntryState | None, to_state: EntryState) -> bool:
    """Whether the state machine allows `from_state → to_state` (`None` = a new entry)."""
    return to_state in _LEGAL[from_state]


def check_transition(
    entry_id: str | None, from_state: EntryState | None, to_state: EntryState, why: str = ""
) -> None:
    """Return if the move is legal.

    Raises:
        IllegalTransition: the state machine does not allow it.
    """
    if not is_legal(from_state, to_state):
        raise IllegalTransition(entry_id, from_state, to_state, why)

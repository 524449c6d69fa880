"""The side-effecting calls this store has let run and not yet heard the end of (the commit delay's
measure of writes still to come: `ledger.writer`).

A call is in flight from its claim's "new" until its finish, its `unknown` or its release is
submitted. One that never reports (its caller died without a word) stops counting once its
lease would have lapsed: the sweeper then marks it `unknown`, and it must not hold writes back.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["CallsInFlight"]


class CallsInFlight:
    """Entry ids in flight, oldest first, each with the time its attempt was claimed."""

    def __init__(self, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._lease_s = lease_s
        self._clock = clock
        self._since: dict[str, float] = {}

    def started(self, entry_id: str) -> None:
        self._since.pop(entry_id, None)  # a next attempt of the same entry counts from now
        self._since[entry_id] = self._clock()

    def ended(self, entry_id: str) -> None:
        self._since.pop(entry_id, None)

    def count(self) -> int:
        """How many are in flight; those older than a lease are forgotten first."""
        since = self._since
        if since:
            horizon = self._clock() - self._lease_s
            stale = []
            for entry_id, started in since.items():  # oldest first: stop at the first fresh one
                if started >= horizon:
                    break
                stale.append(entry_id)
            for entry_id in stale:
                del since[entry_id]
        return len(since)

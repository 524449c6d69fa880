"""A clock a test moves by hand, for code that takes a `clock: Callable[[], float]`."""

from __future__ import annotations

__all__ = ["ManualClock"]


class ManualClock:
    """Monotonic seconds: `now` until the test changes it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

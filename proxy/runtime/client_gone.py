"""How a call learns that its client went away (`ClientGone`), and how a task waiting for
something else is cancelled when that happens (`cancelled_when`): the transport sets the event,
the pipeline and the upstream exchanges wait under it, and none of them imports the others.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

__all__ = ["ClientGone", "Trip", "cancelled_when"]


class ClientGone(asyncio.Event):
    """The "client went away" event of one call, which can also run callbacks when set.

    `cancelled_when` uses the callbacks to cancel a waiting task without a helper task per call.
    """

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], object]] = []

    def set(self) -> None:
        if self.is_set():
            return
        super().set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def add_callback(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Call `callback` when set; returns a function that unregisters it."""
        self._callbacks.append(callback)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(callback)

        return remove


class Trip:
    """Whether `cancelled_when` cancelled the task (and undoing that cancellation)."""

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.fired = False

    def fire(self) -> None:
        if not self.fired:
            self.fired = True
            self.task.cancel()

    def absorb(self) -> bool:
        """Take back our cancellation; True if no other cancellation is pending on the task."""
        return self.fired and self.task.uncancel() == 0


class cancelled_when:  # lower case: used like a function, `with cancelled_when(event) as trip`
    """Cancel the current task if `event` gets set while inside the block.

    Catch `CancelledError` outside and ask `trip.absorb()` whether it was this event (then turn
    it into an answer) or a real cancellation (then re-raise). A class rather than a generator:
    it runs once per proxied call.
    """

    __slots__ = ("_event", "_release")

    def __init__(self, event: asyncio.Event | None) -> None:
        self._event = event
        self._release: Callable[[], object] | None = None

    def __enter__(self) -> Trip | None:
        event = self._event
        if event is None:
            return None
        task = asyncio.current_task()
        assert task is not None
        trip = Trip(task)
        if event.is_set():
            trip.fire()
        elif isinstance(event, ClientGone):
            self._release = event.add_callback(trip.fire)
        else:
            waiter = asyncio.ensure_future(event.wait())
            waiter.add_done_callback(lambda done: None if done.cancelled() else trip.fire())
            self._release = waiter.cancel
        return trip

    def __exit__(self, *exc_info: object) -> None:
        if self._release is not None:
            self._release()
            self._release = None

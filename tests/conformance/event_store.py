"""An in-memory `EventStore` for the reference upstream (the SDK ships the interface only).

Resumability (SEP-1699) needs every message a server sends on a stream kept under an event id, so
that a client that lost the connection can `GET` with `Last-Event-ID` and get what came after.
The SDK hands the store no session id and names POST streams by their JSON-RPC request id, so
stream ids repeat across sessions: event ids carry a store-wide counter (globally unique) and a
replay only walks events recorded *after* the given one, on that event's stream. Bounded: the
oldest events are forgotten beyond `max_events`.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage

__all__ = ["MemoryEventStore"]


class MemoryEventStore(EventStore):
    """Events of all sessions in insertion order; ids `<stream>_<n>`, `n` unique in the store."""

    def __init__(self, max_events: int = 10_000) -> None:
        self._max = max_events
        self._counter = itertools.count(1)
        self._events: OrderedDict[EventId, tuple[StreamId, JSONRPCMessage | None]] = OrderedDict()

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = f"{stream_id}_{next(self._counter)}"
        self._events[event_id] = (stream_id, message)
        while len(self._events) > self._max:
            self._events.popitem(last=False)
        return event_id

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        if last_event_id not in self._events:
            return None
        stream_id = self._events[last_event_id][0]
        after = False
        for event_id, (stream, message) in list(self._events.items()):
            if after and stream == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
            after = after or event_id == last_event_id
        return stream_id

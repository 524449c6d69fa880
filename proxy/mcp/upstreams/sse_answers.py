"""One request's answer read from a Streamable HTTP upstream's event stream (SEP-1699 aware).

`SseAnswer` relays every event before the response as the upstream framed it (priming events and
ids included) and, when the server ends the stream after an event id without the response,
follows it with `GET` + `Last-Event-ID` as a client would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from policies.model import UpstreamSpec
from proxy.errors import UpstreamAnswerTooLarge, UpstreamLost
from proxy.mcp.upstreams.http_pool import send
from proxy.mcp.upstreams.relay import Relay
from proxy.mcp.wire.jsonrpc import WireMessage, id_key, read_upstream_message
from proxy.mcp.wire.sse import SseEvent, SseParser
from proxy.runtime.http1 import Pool, Response

__all__ = ["SseAnswer"]


class SseAnswer:
    """Reads one request's event stream up to its response, resuming it when the server closes it.

    Every event before the response is relayed as the upstream framed it (priming events and ids
    included). When the stream ends without the response after an event id, the request is
    resumed as a client would: after the server's `retry` delay, `GET` with `Last-Event-ID`.
    """

    def __init__(
        self, spec: UpstreamSpec, request_id: Any, relay: Relay, *, max_bytes: int
    ) -> None:
        self._spec = spec
        self._wanted = id_key(request_id)
        self._relay = relay
        self._max_bytes = max_bytes
        self.last_event_id: str | None = None
        self._retry_ms: int | None = None

    async def read(self, upstream: Response) -> WireMessage | None:
        """The response, or None when the stream ended resumably without it.

        Raises:
            UpstreamLost: the stream ended without the response and without an event id.
        """
        parser = SseParser(max_event_bytes=self._max_bytes)
        while chunk := await upstream.readany():
            try:
                events = parser.feed(chunk)
            except ValueError:  # one event larger than the proxy holds
                raise UpstreamAnswerTooLarge(self._spec.name, self._max_bytes) from None
            for event in events:
                answer = await self._take(event)
                if answer is not None:
                    return answer
        if self.last_event_id is None:
            raise UpstreamLost(f"{self._spec.name}: the event stream ended without the response")
        return None

    async def _take(self, event: SseEvent) -> WireMessage | None:
        if event.comment:
            await self._relay.comment(event.raw)
            return None
        if event.id is not None:
            self.last_event_id = event.id
        if event.retry is not None:
            self._retry_ms = event.retry
        # Events are relayed as their bytes; the response's tool output stays `RawJson`.
        message = read_upstream_message(event.data, lazy_output=True) if event.data else None
        if message is not None and self._is_answer(message):
            message.frame, message.event_id = event.raw, event.id
            return message
        if event.data and message is None:
            return None  # not JSON-RPC: nothing a client could use
        await self._relay.event(event.raw, event.id)
        return None

    def _is_answer(self, message: WireMessage) -> bool:
        return "method" not in message and id_key(message.get("id")) == self._wanted

    async def resume(self, pool: Pool, headers: Mapping[str, str]) -> WireMessage:
        """Follow the stream with `GET` + `Last-Event-ID` until the response arrives.

        Raises:
            UpstreamLost: the server refused the resumption or ended it without any new event.
        """
        assert self._spec.url is not None
        get_headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        get_headers["accept"] = "text/event-stream"
        while True:
            await asyncio.sleep((self._retry_ms if self._retry_ms is not None else 1000) / 1000)
            assert self.last_event_id is not None
            get_headers["last-event-id"] = self.last_event_id
            before = self.last_event_id
            upstream = await send(pool, self._spec, "GET", get_headers)
            try:
                if upstream.status != 200 or not upstream.event_stream:
                    raise UpstreamLost(
                        f"{self._spec.name}: resuming the event stream was refused "
                        f"(HTTP {upstream.status})"
                    )
                answer = await self.read(upstream)
            finally:
                upstream.release()
            if answer is not None:
                return answer
            if self.last_event_id == before:
                raise UpstreamLost(
                    f"{self._spec.name}: the resumed event stream ended without new events"
                )

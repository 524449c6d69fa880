"""The upstream as one client request sees it: a Streamable HTTP upstream (`HttpChannel`, carrying
the client's allowed headers) or a stdio process (`StdioChannel`).

Both offer `exchange` (a request and its final response, relaying what comes before it: one
upstream attempt; the pipeline wraps each in its CLIENT span) and `post` (a notification or a
response, no answer expected).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from policies.model import UpstreamSpec
from proxy.errors import UpstreamError, UpstreamNotReached
from proxy.mcp.catalog import ParamHeaders
from proxy.mcp.upstreams.http_pool import send
from proxy.mcp.upstreams.relay import Relay
from proxy.mcp.upstreams.stdio import StdioProcess
from proxy.mcp.upstreams.streamable_http import exchange_http
from proxy.mcp.wire.headers import (
    modern_routing_headers,
    routing_changed,
    upstream_request_headers,
)
from proxy.mcp.wire.jsonrpc import JsonObject, WireMessage, dumps, wire_bytes
from proxy.runtime.http1 import Pool
from proxy.telemetry.tracing import inject_headers

__all__ = ["HttpChannel", "StdioChannel", "UpstreamChannel"]

_ANSWER_CAP = 64 * 1024  # read of the answer to a notification (read to keep its connection)


class UpstreamChannel(Protocol):
    """One client request's way to its upstream."""

    async def exchange(
        self,
        message: JsonObject,
        *,
        original: JsonObject | None,
        relay: Relay,
        timeout_s: float,
        cancel: asyncio.Event | None = None,
    ) -> WireMessage:
        """Send a request, return its response (raises the `proxy.errors` tree).

        `original` is the client's message as it arrived (`message` may be the pipeline's
        changed copy of it); when it is a `WireMessage` saying what `message` says, its bytes
        are sent.
        """

    async def post(self, message: JsonObject, raw: bytes | None) -> None:
        """Send a notification or a response (raises `UpstreamError` if it cannot be sent)."""


def _client_bytes(message: JsonObject, original: JsonObject | None) -> bytes | None:
    """The client's own bytes, when `message` says what the client's `original` said.

    The pipeline changes a message by copying the part it changes (`params._meta` for the
    trace context) and shares the rest, so this comparison stops at the shared values.
    """
    if isinstance(original, WireMessage) and (message is original or message == original):
        return wire_bytes(original)
    return None


class HttpChannel:
    """A Streamable HTTP upstream, with the client's allowed headers."""

    def __init__(
        self,
        pool: Pool,
        spec: UpstreamSpec,
        client_headers: Mapping[str, str],
        *,
        modern: bool,
        forward_authorization: bool,
        param_headers: Mapping[str, ParamHeaders],
        max_response_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self._spec = spec
        self._max_response_bytes = max_response_bytes
        self._modern = modern
        self._pool = pool
        self._param_headers = param_headers
        self._headers = upstream_request_headers(
            client_headers, spec.headers, forward_authorization=forward_authorization
        )

    def _request_headers(self, message: JsonObject, original: JsonObject | None) -> dict[str, str]:
        headers = dict(self._headers)
        headers["accept"] = "application/json, text/event-stream"
        headers["content-type"] = "application/json"
        if self._modern and original is not None and routing_changed(original, message):
            tool = message.get("params", {}).get("name")
            headers = modern_routing_headers(
                headers, original, message, self._param_headers.get(tool)
            )
        inject_headers(headers)
        return headers

    async def exchange(
        self,
        message: JsonObject,
        *,
        original: JsonObject | None,
        relay: Relay,
        timeout_s: float,
        cancel: asyncio.Event | None = None,
    ) -> WireMessage:
        sent = _client_bytes(message, original)
        return await exchange_http(
            self._pool,
            self._spec,
            request_id=message.get("id"),
            body=sent if sent is not None else dumps(message),
            headers=self._request_headers(message, original if sent is None else None),
            relay=relay,
            timeout_s=timeout_s,
            max_bytes=self._max_response_bytes,
            cancel=cancel,
        )

    async def post(self, message: JsonObject, raw: bytes | None) -> None:
        body = raw if raw is not None else dumps(message)
        headers = self._request_headers(message, None)
        try:
            answer = await send(self._pool, self._spec, "POST", headers, body)
            try:
                await answer.read(_ANSWER_CAP)  # a notification's answer: 202, no body
            finally:
                answer.release()
        except UpstreamError as exc:
            raise UpstreamNotReached(f"{self._spec.name}: {exc!r}") from exc


class StdioChannel:
    """A stdio process (a session's own, or the shared modern one)."""

    def __init__(self, process: StdioProcess) -> None:
        self._process = process

    async def exchange(
        self,
        message: JsonObject,
        *,
        original: JsonObject | None,
        relay: Relay,
        timeout_s: float,
        cancel: asyncio.Event | None = None,
    ) -> WireMessage:
        return await self._process.exchange(
            message,
            raw=_client_bytes(message, original),
            relay=relay,
            timeout_s=timeout_s,
            cancel=cancel,
        )

    async def post(self, message: JsonObject, raw: bytes | None) -> None:
        await self._process.send(message, raw)

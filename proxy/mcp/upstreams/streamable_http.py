"""Streamable HTTP upstreams: raw relays and exchanges over the pooled connections
(`proxy.mcp.upstreams.http_pool`).

Two ways to forward a client POST:

- `relay_http` streams the upstream's answer to the client as it comes (status, allowed headers,
  body chunks unchanged), optionally tapping the bytes to read the JSON-RPC responses inside
  (`tools/list` annotations, the session a handshake opened). Used for everything that is not
  `tools/call`, and for GET streams and DELETE.
- `exchange_http` sends one request and returns its final JSON-RPC response as a `WireMessage`,
  relaying the upstream's intermediate messages meanwhile. Used for `tools/call` (the pipeline's
  `send_upstream`) and for batch elements; an event-stream answer is read by
  `proxy.mcp.upstreams.sse_answers.SseAnswer` (which resumes a stream the server closed). It
  raises the `proxy.errors` tree (the HTTP client's own, named after the upstream).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from policies.model import UpstreamSpec
from proxy.errors import (
    UpstreamAnswerTooLarge,
    UpstreamError,
    UpstreamLost,
    UpstreamNotReached,
    UpstreamPressure,
    UpstreamRefused,
    UpstreamTimeout,
)
from proxy.mcp.upstreams.http_pool import named_errors, send
from proxy.mcp.upstreams.relay import Relay
from proxy.mcp.upstreams.sse_answers import SseAnswer
from proxy.mcp.wire.headers import client_response_headers
from proxy.mcp.wire.jsonrpc import WireMessage, id_key, read_upstream_message
from proxy.mcp.wire.sse import SSE_HEADERS, SseParser
from proxy.runtime.client_gone import cancelled_when
from proxy.runtime.http1 import Pool, Response

__all__ = ["PRESSURE_STATUSES", "ResponseTap", "exchange_http", "relay_http"]

PRESSURE_STATUSES = frozenset({429, 503, 529})
_ERROR_BODY_CAP = 64 * 1024
_JSON_BODY_CAP = 64 * 1024 * 1024
_WHOLE_ANSWER_MAX = 256 * 1024
"""A relayed answer of known length up to this is read whole and sent with its head in one
write; a longer one streams through (it is never held: resources can be large)."""


class ResponseTap:
    """Reads the JSON-RPC responses inside bytes that are being relayed, without changing them."""

    def __init__(self, on_response: Callable[[WireMessage], None], *, sse: bool) -> None:
        self._on_response = on_response
        self._parser = SseParser() if sse else None
        self._json = bytearray()
        self._overflow = False

    def feed(self, chunk: bytes) -> None:
        if self._parser is not None:
            for event in self._parser.feed(chunk):
                if not event.comment and event.data:
                    self._offer(event.data)
        elif not self._overflow:
            self._json += chunk
            self._overflow = len(self._json) > _JSON_BODY_CAP

    def close(self) -> None:
        if self._parser is None and self._json and not self._overflow:
            self._offer(bytes(self._json))

    def _offer(self, data: bytes | str) -> None:
        message = read_upstream_message(data)
        if message is not None and ("result" in message or "error" in message):
            self._on_response(message)


async def relay_http(
    request: web.Request,
    pool: Pool,
    spec: UpstreamSpec,
    *,
    method: str,
    headers: Mapping[str, str],
    body: bytes | None = None,
    tap: Callable[[WireMessage], None] | None = None,
    on_start: Callable[[int, Mapping[str, str]], None] | None = None,
    gone: asyncio.Event | None = None,
) -> web.StreamResponse:
    """Forward one HTTP request and stream the upstream's answer back unchanged.

    `tap` sees each JSON-RPC response inside the answer, `on_start` its status and headers. When
    `gone` is set (the client left) the upstream request is aborted.

    Raises:
        UpstreamNotReached: the upstream could not be connected to (nothing was sent).
        UpstreamLost: the connection broke before the upstream's answer started.
    """
    upstream = await send(pool, spec, method, headers, body)
    try:
        if on_start is not None:
            on_start(upstream.status, upstream.headers)
        out_headers = client_response_headers(upstream.headers, keep_encoding=True)
        tapper = ResponseTap(tap, sse=upstream.event_stream) if tap is not None else None
        length = upstream.content_length
        if not upstream.event_stream and length is not None and length <= _WHOLE_ANSWER_MAX:
            with named_errors(spec):
                data = await upstream.read(length)
            if tapper is not None:
                tapper.feed(data)
                tapper.close()
            return web.Response(status=upstream.status, body=data, headers=out_headers)
        if upstream.event_stream:
            out_headers.update(SSE_HEADERS)
        response = web.StreamResponse(status=upstream.status, headers=out_headers)
        await response.prepare(request)
        try:
            with cancelled_when(gone) as trip:
                delivered = await _pump(upstream, response, tapper)
        except asyncio.CancelledError:
            if trip is not None and trip.absorb():
                return response  # the client left: the upstream request is closed on exit
            raise
        if not delivered and gone is not None:
            gone.set()
        return response
    finally:
        upstream.release()  # closes the connection unless the answer was read to its end


async def _pump(
    upstream: Response, response: web.StreamResponse, tapper: ResponseTap | None
) -> bool:
    """Copy the upstream body to the client as it arrives; False if either side broke off."""
    try:
        while chunk := await upstream.readany():
            if tapper is not None:
                tapper.feed(chunk)
            await response.write(chunk)
        if tapper is not None:
            tapper.close()
        await response.write_eof()
    except (UpstreamError, ConnectionError, RuntimeError, aiohttp.ClientError, ValueError):
        return False
    return True


async def exchange_http(
    pool: Pool,
    spec: UpstreamSpec,
    *,
    request_id: Any,
    body: bytes,
    headers: Mapping[str, str],
    relay: Relay,
    timeout_s: float,
    cancel: asyncio.Event | None = None,
    max_bytes: int = 16 * 1024 * 1024,
) -> WireMessage:
    """POST one JSON-RPC request; return its final response, relaying what comes before it.

    An answer larger than `max_bytes` is never held: `UpstreamAnswerTooLarge`.

    `cancel` (the client went away, modern era) aborts the upstream request: closing the stream
    is the cancellation signal of the 2026-07-28 protocol. Already set, nothing is sent.

    The response's tool output (a result's `content` and `structuredContent`) stays `RawJson`:
    the proxy relays it, and stores it, as the upstream's bytes and never reads it.

    Raises:
        UpstreamNotReached, UpstreamPressure, UpstreamRefused, UpstreamLost, UpstreamTimeout.
    """
    assert spec.url is not None
    if cancel is not None and cancel.is_set():
        raise UpstreamNotReached(f"{spec.name}: the client went away before the request was sent")
    try:
        with cancelled_when(cancel) as trip:
            async with asyncio.timeout(timeout_s):
                return await _exchange(pool, spec, request_id, body, headers, relay, max_bytes)
    except TimeoutError:
        raise UpstreamTimeout(f"{spec.name}: no answer within {timeout_s:g} s") from None
    except asyncio.CancelledError:
        if trip is not None and trip.absorb():
            raise UpstreamLost(
                f"{spec.name}: the client went away; the upstream request was aborted"
            ) from None
        raise


async def _exchange(
    pool: Pool,
    spec: UpstreamSpec,
    request_id: Any,
    body: bytes,
    headers: Mapping[str, str],
    relay: Relay,
    max_bytes: int,
) -> WireMessage:
    upstream = await send(pool, spec, "POST", headers, body)
    try:
        if upstream.status in PRESSURE_STATUSES or upstream.status >= 300:
            with named_errors(spec):
                data = await upstream.read(_ERROR_BODY_CAP)
            error = UpstreamPressure if upstream.status in PRESSURE_STATUSES else UpstreamRefused
            raise error(upstream.status, upstream.headers, data)
        if upstream.status == 202:
            raise UpstreamLost(f"{spec.name}: the request was accepted (202) but never answered")
        relay_start = getattr(relay, "upstream_headers", None)
        if relay_start is not None:
            relay_start(upstream.headers)
        with named_errors(spec):
            if not upstream.event_stream:
                data = await _read_within(upstream, spec, max_bytes)
                return _json_answer(spec, data, request_id)
            stream = SseAnswer(spec, request_id, relay, max_bytes=max_bytes)
            if (answer := await stream.read(upstream)) is not None:
                return answer
    finally:
        upstream.release()
    # The stream ended after giving an event id: the request arrived and the server let go of the
    # connection (SEP-1699 polling). The answer is not lost; the stream goes on from that id.
    await relay.let_go()
    try:
        with named_errors(spec):
            return await stream.resume(pool, headers)
    except UpstreamNotReached as exc:
        # The request itself arrived (it was given an event id): whatever breaks now, it may
        # have run, so it is lost, never "not sent".
        raise UpstreamLost(f"{spec.name}: the request arrived; resuming its stream failed") from exc


async def _read_within(upstream: Response, spec: UpstreamSpec, limit: int) -> bytes:
    """The whole body, or `UpstreamAnswerTooLarge` as soon as it passes `limit` bytes."""
    length = upstream.content_length
    if length is not None and length > limit:
        raise UpstreamAnswerTooLarge(spec.name, limit)
    parts: list[bytes] = []
    size = 0
    while chunk := await upstream.readany():
        size += len(chunk)
        if size > limit:
            raise UpstreamAnswerTooLarge(spec.name, limit)
        parts.append(chunk)
    return b"".join(parts)


def _json_answer(spec: UpstreamSpec, data: bytes, request_id: Any) -> WireMessage:
    message = read_upstream_message(data, lazy_output=True)
    if message is None or id_key(message.get("id")) != id_key(request_id):
        raise UpstreamLost(f"{spec.name}: the JSON answer is not the response to this request")
    return message

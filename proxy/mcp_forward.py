"""Forwarding one JSON-RPC message to an MCP upstream, whatever its transport.

An `UpstreamChannel` is the upstream as one client request sees it: an HTTP upstream
(`HttpChannel`, carrying the client's allowed headers) or a stdio process (`StdioChannel`). Both
offer `exchange` (a request and its final response, relaying what comes before it: one upstream
attempt; the pipeline wraps each in its CLIENT span) and `post` (a notification or a response,
no answer expected).

`run_tools_call` hands a `tools/call` to the pipeline (`proxy.mcp_calls.handle_tools_call`) with
`send_upstream` bound to a channel and `notify` bound to the client's reply; `traced` wraps every
proxied request in its SERVER span and duration metric; `failure_reply` turns an upstream error
that reached the transport into what the client gets.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from policies.answers import outcome_unknown, refused
from policies.model import UpstreamSpec
from policies.retry import server_delay_s
from proxy import metrics
from proxy.errors import (
    UpstreamError,
    UpstreamLost,
    UpstreamNotReached,
    UpstreamPressure,
    UpstreamRefused,
)
from proxy.jsonrpc import JsonObject, Message, WireMessage, dumps, error_response
from proxy.mcp_calls import McpCallContext, handle_tools_call
from proxy.mcp_headers import (
    client_response_headers,
    modern_routing_headers,
    upstream_request_headers,
)
from proxy.mcp_http_upstream import exchange_http
from proxy.mcp_reply import ClientReply, Relay
from proxy.mcp_state import MCP_TRANSPORT
from proxy.mcp_stdio import StdioProcess
from proxy.state import CONFIG, RUNTIME
from proxy.telemetry import Attr, call_span, inject_headers, mark_error, mcp_span_name

__all__ = [
    "HttpChannel",
    "StdioChannel",
    "UpstreamChannel",
    "failure_message",
    "failure_reply",
    "run_tools_call",
    "traced",
]

_INTERNAL_ERROR = -32603


class UpstreamChannel(Protocol):
    """One client request's way to its upstream."""

    async def exchange(
        self,
        message: JsonObject,
        *,
        raw: bytes | None,
        relay: Relay,
        timeout_s: float,
        cancel: asyncio.Event | None = None,
    ) -> WireMessage:
        """Send a request, return its response (raises the `proxy.errors` tree)."""

    async def post(self, message: JsonObject, raw: bytes | None) -> None:
        """Send a notification or a response (raises `UpstreamError` if it cannot be sent)."""


def _unchanged(message: JsonObject, raw: bytes | None) -> bool:
    # Compared with a fresh parse: the pipeline may have edited the client's dict in place.
    return raw is not None and json.loads(raw) == message


class HttpChannel:
    """A Streamable HTTP upstream, with the client's allowed headers."""

    def __init__(
        self,
        app: web.Application,
        spec: UpstreamSpec,
        client_headers: Mapping[str, str],
        *,
        modern: bool,
    ) -> None:
        self._app = app
        self._spec = spec
        self._modern = modern
        self._session = app[MCP_TRANSPORT].http.session(spec)
        forward_auth = not app[CONFIG].tenant_api_keys
        self._headers = upstream_request_headers(
            client_headers, spec.headers, forward_authorization=forward_auth
        )

    def _request_headers(self, message: JsonObject, original: JsonObject | None) -> dict[str, str]:
        headers = dict(self._headers)
        headers["accept"] = "application/json, text/event-stream"
        headers["content-type"] = "application/json"
        if self._modern and original is not None and original != message:
            tool = message.get("params", {}).get("name")
            param_map = self._app[MCP_TRANSPORT].param_headers.get(self._spec.name, {})
            headers = modern_routing_headers(headers, original, message, param_map.get(tool))
        inject_headers(headers)
        return headers

    async def exchange(
        self,
        message: JsonObject,
        *,
        raw: bytes | None,
        relay: Relay,
        timeout_s: float,
        cancel: asyncio.Event | None = None,
    ) -> WireMessage:
        # Compared with a fresh parse: the pipeline may have edited the client's dict in place.
        original = json.loads(raw) if raw is not None else None
        body = raw if raw is not None and original == message else dumps(message)
        return await exchange_http(
            self._session,
            self._spec,
            request_id=message.get("id"),
            body=body,
            headers=self._request_headers(message, original),
            relay=relay,
            timeout_s=timeout_s,
            cancel=cancel,
        )

    async def post(self, message: JsonObject, raw: bytes | None) -> None:
        body = raw if raw is not None else dumps(message)
        headers = self._request_headers(message, None)
        assert self._spec.url is not None
        try:
            post = self._session.post(
                self._spec.url, data=body, headers=headers, allow_redirects=False
            )
            async with post as answer:
                await answer.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise UpstreamNotReached(f"{self._spec.name}: {exc!r}") from exc


class StdioChannel:
    """A stdio process (a session's own, or the shared modern one)."""

    def __init__(self, process: StdioProcess) -> None:
        self._process = process

    async def exchange(
        self,
        message: JsonObject,
        *,
        raw: bytes | None,
        relay: Relay,
        timeout_s: float,
        cancel: asyncio.Event | None = None,
    ) -> WireMessage:
        return await self._process.exchange(
            message,
            raw=raw if raw is not None and _unchanged(message, raw) else None,
            relay=relay,
            timeout_s=timeout_s,
            cancel=cancel,
        )

    async def post(self, message: JsonObject, raw: bytes | None) -> None:
        await self._process.send(message, raw)


@dataclass
class CallOutcome:
    """Filled in by the code inside `traced`: the error type of the call, if it failed."""

    error_type: str | None = None

    def response(self, message: Mapping[str, Any]) -> None:
        """Note a JSON-RPC error response as the call's error."""
        error = message.get("error")
        if isinstance(error, dict):
            data = error.get("data")
            reason = data.get("reason") if isinstance(data, dict) else None
            self.error_type = str(reason or error.get("code"))


@functools.lru_cache(maxsize=256)
def _address(url: str) -> tuple[str | None, int | None]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


@contextmanager
def traced(
    message: Message,
    spec: UpstreamSpec,
    headers: Mapping[str, str],
    *,
    session_id: str | None,
    protocol_version: str | None,
) -> Iterator[CallOutcome]:
    """The SERVER span and duration metric of one proxied request or notification."""
    method = message.method or "response"
    tool = message.params.get("name") if method == "tools/call" else None
    target = tool if isinstance(tool, str) else spec.name
    attributes: dict[str, Any] = {
        Attr.MCP_METHOD: method,
        Attr.MCP_SESSION_ID: session_id,
        Attr.MCP_PROTOCOL_VERSION: protocol_version,
        Attr.JSONRPC_REQUEST_ID: None if message.id is None else str(message.id),
        Attr.UPSTREAM: spec.name,
        Attr.NETWORK_TRANSPORT: "pipe" if spec.kind == "mcp_stdio" else "tcp",
    }
    if spec.url:
        attributes[Attr.SERVER_ADDRESS], attributes[Attr.SERVER_PORT] = _address(spec.url)
    if method == "tools/call":
        attributes[Attr.GEN_AI_OPERATION] = "execute_tool"
        attributes[Attr.GEN_AI_TOOL] = target
    outcome = CallOutcome()
    started = time.perf_counter()
    with call_span(
        mcp_span_name(method, target), attributes=attributes, headers=headers, meta=message.meta
    ) as span:
        try:
            yield outcome
        except BaseException as exc:
            outcome.error_type = type(exc).__qualname__
            raise
        finally:
            if outcome.error_type is not None:
                mark_error(span, outcome.error_type)
            metrics.operation_duration(
                method, spec.name, time.perf_counter() - started, outcome.error_type
            )


async def run_tools_call(
    request: web.Request,
    *,
    spec: UpstreamSpec,
    channel: UpstreamChannel,
    message: Message,
    raw: bytes | None,
    reply: ClientReply,
    gone: asyncio.Event,
    session_id: str | None,
    protocol_version: str | None,
    modern: bool,
) -> JsonObject:
    """Run one `tools/call` through the pipeline; return the response message for the client.

    The pipeline runs as its own task: if the handler is cancelled (the client left and the
    server cancels handlers) the call still finishes and is recorded; `gone` tells it the client
    is not listening. The task is listed in `RUNTIME.in_flight` so shutdown can drain it.

    Raises:
        UpstreamError: the pipeline let an upstream failure through (see `failure_reply`).
    """
    app = request.app
    ctx = McpCallContext(
        app,
        spec,
        headers=request.headers,
        session_id=session_id,
        protocol_version=protocol_version,
        client_gone=gone,
    )

    async def send_upstream(outgoing: JsonObject, timeout_s: float) -> JsonObject:
        return await channel.exchange(
            outgoing,
            raw=raw,
            relay=reply,
            timeout_s=timeout_s,
            cancel=gone if modern else None,
        )

    async def notify(note: JsonObject) -> None:
        await reply.message(dumps(note))

    task = asyncio.create_task(handle_tools_call(ctx, message.body, send_upstream, notify))
    runtime = app.get(RUNTIME)
    if runtime is not None:
        runtime.in_flight.add(task)
        task.add_done_callback(runtime.in_flight.discard)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        gone.set()
        raise


def failure_message(request_id: Any, exc: UpstreamError, spec: UpstreamSpec) -> JsonObject:
    """The JSON-RPC error of the proxy's own for an upstream failure.

    Unreachable → refused (-32050, `upstream_unreachable`); lost or timed out after sending →
    outcome unknown (-32053); an HTTP refusal by the upstream → internal error naming the status.
    """
    if isinstance(exc, UpstreamPressure):
        delay = server_delay_s(exc.headers, now=time.time())
        retry_after = max(delay if delay is not None else 1.0, 1.0)
        answer = refused("upstream", f"upstream:{spec.name}", retry_after, upstream_down=True)
        return answer.jsonrpc_error(request_id)
    if isinstance(exc, UpstreamRefused):
        return error_response(
            request_id,
            _INTERNAL_ERROR,
            f"The upstream {spec.name} answered HTTP {exc.status}.",
            {"reason": "upstream_http_status", "status": exc.status},
        )
    if isinstance(exc, UpstreamNotReached):
        answer = refused("upstream_unreachable", f"upstream:{spec.name}", 1.0, upstream_down=True)
        return answer.jsonrpc_error(request_id)
    if isinstance(exc, UpstreamLost):
        return outcome_unknown(None, None, str(exc)).jsonrpc_error(request_id)
    raise exc  # pragma: no cover - the tree has no other leaves


async def failure_reply(
    reply: ClientReply, request_id: Any, exc: UpstreamError, spec: UpstreamSpec
) -> web.StreamResponse:
    """What the client gets when an upstream failure reaches the transport.

    An upstream's own HTTP refusal (429/503, 404 "session gone", other 4xx) is passed on as it
    came (status, retry hints, body) unless the reply is already a stream; anything else is
    `failure_message`.
    """
    if isinstance(exc, UpstreamPressure | UpstreamRefused) and not reply.streaming:
        return web.Response(
            status=exc.status, body=exc.body, headers=client_response_headers(exc.headers)
        )
    return await reply.finish(dumps(failure_message(request_id, exc, spec)))

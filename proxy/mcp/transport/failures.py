"""What the client gets when an upstream failure reaches the transport."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from policies.answers import outcome_unknown, refused
from policies.model import UpstreamSpec
from policies.retry import server_delay_s
from proxy.errors import (
    UpstreamError,
    UpstreamLost,
    UpstreamNotReached,
    UpstreamPressure,
    UpstreamRefused,
)
from proxy.mcp.transport.reply import ClientReply
from proxy.mcp.wire.headers import client_response_headers
from proxy.mcp.wire.jsonrpc import JsonObject, dumps, error_response

__all__ = ["failure_message", "failure_reply"]

_INTERNAL_ERROR = -32603


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

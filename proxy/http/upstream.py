"""Talking to an HTTP upstream: one attempt (`open_upstream`: send, wait for the response head)
and its body piece by piece (`read_chunk`).

The connections are Interlock's own HTTP/1.1 client (`proxy.runtime.http1`), one pool per
upstream; it raises `proxy.errors` itself, so the pipeline only ever sees our exception tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy.errors import UpstreamError, UpstreamPressure
from proxy.runtime.http1 import Pool, Response

__all__ = [
    "HTTP_POOLS",
    "PRESSURE_STATUSES",
    "Opened",
    "open_upstream",
    "read_chunk",
]

HTTP_POOLS = web.AppKey("http_pools", dict[str, Pool])
"""One pool of kept-alive connections per HTTP upstream."""
PRESSURE_STATUSES = frozenset({429, 503, 529})
_PRESSURE_BODY_CAP = 64 * 1024


@dataclass
class Opened:
    """An attempt that got a response head and the first piece of its body."""

    response: Response
    first: bytes


async def open_upstream(
    pool: Pool,
    method: str,
    url: URL,
    headers: CIMultiDict[str],
    body: bytes | aiohttp.StreamReader | None,
    *,
    connect_s: float,
    read_s: float,
) -> Response:
    """Send one attempt and wait for the response head; the body is left to `read_chunk`.

    Redirects are never followed (the proxy contacts only the configured upstream). `connect_s`
    bounds the wait for a connection (a free one, or a new one); `read_s` each wait for a byte.

    Raises:
        UpstreamNotReached: nothing was sent (connection refused, connect timeout).
        UpstreamPressure: the upstream answered 429/503/529 (its body is read, bounded).
        UpstreamTimeout, UpstreamLost: sent, and no response head came back.
    """
    response = await pool.request(
        method, url, headers.items(), body, connect_s=connect_s, read_s=read_s
    )
    if response.status in PRESSURE_STATUSES:
        try:
            content = await response.read(_PRESSURE_BODY_CAP)
        except UpstreamError:
            content = b""
        finally:
            response.release()
        raise UpstreamPressure(response.status, response.headers, content)
    return response


async def read_chunk(response: Response) -> bytes:
    """The next piece of the response body as soon as any is there; `b""` at the end.

    Raises:
        UpstreamTimeout, UpstreamLost: the body stalled past the read timeout or was cut off.
    """
    return await response.readany()

"""Talking to an HTTP upstream: one attempt (`open_upstream`: send, wait for the response head)
and its body piece by piece (`read_chunk`).

Both translate aiohttp's errors into `proxy.errors` in one place, `_translate`, so the pipeline
only ever sees our own exception tree.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy.errors import (
    UpstreamError,
    UpstreamLost,
    UpstreamNotReached,
    UpstreamPressure,
    UpstreamTimeout,
)

__all__ = [
    "HTTP_SESSIONS",
    "PRESSURE_STATUSES",
    "Opened",
    "is_sse",
    "open_upstream",
    "read_chunk",
]

HTTP_SESSIONS = web.AppKey("http_sessions", dict[str, aiohttp.ClientSession])
"""One pooled `ClientSession` per HTTP upstream."""
PRESSURE_STATUSES = frozenset({429, 503, 529})
_PRESSURE_BODY_CAP = 64 * 1024


@dataclass
class Opened:
    """An attempt that got a response head and the first piece of its body."""

    response: aiohttp.ClientResponse
    first: bytes


def is_sse(opened: Opened) -> bool:
    return opened.response.headers.get("Content-Type", "").startswith("text/event-stream")


def _translate(exc: BaseException) -> UpstreamError:
    """aiohttp's and the OS's transport errors as our exception tree (call with `from exc`).

    The message reaches callers, so it names what failed but never the upstream's address (the
    cause, kept as `__cause__`, has it for the log)."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamNotReached("upstream not reached (connect timeout)")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamNotReached(f"upstream not reached ({_os_error(exc.os_error)})")
    if isinstance(exc, aiohttp.ServerTimeoutError | asyncio.TimeoutError):
        return UpstreamTimeout("upstream did not answer within the attempt timeout")
    if isinstance(exc, OSError):
        return UpstreamLost(f"upstream connection lost ({_os_error(exc)})")
    return UpstreamLost(f"upstream connection lost ({exc.__class__.__name__})")


def _os_error(error: OSError) -> str:
    """An OS error by its name (ECONNREFUSED), without the address its text carries."""
    if isinstance(error, socket.gaierror):
        return "name lookup failed"
    return errno.errorcode.get(error.errno or 0, type(error).__name__)


_TRANSPORT_ERRORS = (aiohttp.ClientError, OSError, asyncio.TimeoutError)


async def open_upstream(
    session: aiohttp.ClientSession,
    method: str,
    url: URL,
    headers: CIMultiDict[str],
    body: bytes | aiohttp.StreamReader | None,
    timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 - aiohttp's per-request timeouts, not a wait
) -> aiohttp.ClientResponse:
    """Send one attempt and wait for the response head; the body is left to `read_chunk`.

    Redirects are never followed (the proxy contacts only the configured upstream).

    Raises:
        UpstreamNotReached: nothing was sent (connection refused, connect timeout).
        UpstreamPressure: the upstream answered 429/503/529 (its body is read, bounded).
        UpstreamTimeout, UpstreamLost: sent, and no response head came back.
    """
    try:
        response = await session.request(
            method, url, headers=headers, data=body, timeout=timeout, allow_redirects=False
        )
    except _TRANSPORT_ERRORS as exc:
        raise _translate(exc) from exc
    if response.status in PRESSURE_STATUSES:
        try:
            content = await response.content.read(_PRESSURE_BODY_CAP)
        except _TRANSPORT_ERRORS:
            content = b""
        finally:
            response.release()
        raise UpstreamPressure(response.status, dict(response.headers), content)
    return response


async def read_chunk(response: aiohttp.ClientResponse) -> bytes:
    """The next piece of the response body as soon as any is there; `b""` at the end.

    Raises:
        UpstreamTimeout, UpstreamLost: the body stalled past the read timeout or was cut off.
    """
    try:
        return await response.content.readany()
    except _TRANSPORT_ERRORS as exc:
        raise _translate(exc) from exc

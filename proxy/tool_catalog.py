"""What the proxy knows of each upstream tool's annotations, and how it learns them.

Annotations arrive for free when a client lists tools through the proxy (the transport records
them). A proxy that restarted, or a client that cached its tool list, would otherwise leave a tool
unclassified — and an unclassified tool counts as side-effecting: safe, but it is ledgered and it is
refused when the ledger is down. So before deciding on a default, the proxy lists the tools of a
Streamable HTTP upstream itself, once per `_REFRESH_S`, with a short timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx2
from aiohttp import web
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from policies.model import UpstreamSpec
from proxy.mcp_state import learn_tools
from proxy.state import ANNOTATIONS

__all__ = ["learn_annotations", "setup", "tool_annotations"]

log = logging.getLogger("interlock.tools")

_REFRESH_S = 60.0
_TIMEOUT_S = 3.0
_MAX_PAGES = 20


@dataclass
class _Learning:
    """When each upstream's tools were last listed by the proxy itself, one lock per upstream."""

    attempts: dict[str, float] = field(default_factory=dict)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)


_LEARNING = web.AppKey("tool_learning", _Learning)


def setup(app: web.Application) -> None:
    app[_LEARNING] = _Learning()


def tool_annotations(app: web.Application, upstream: str, tool: str) -> dict[str, Any] | None:
    """The annotations known for `tool` (an empty dict: listed without annotations)."""
    return app[ANNOTATIONS].get(upstream, {}).get(tool)


async def learn_annotations(app: web.Application, spec: UpstreamSpec) -> None:
    """List the upstream's tools ourselves (Streamable HTTP upstreams; at most once a minute)."""
    if spec.kind != "mcp_http" or spec.url is None:
        return
    learning = app[_LEARNING]
    lock = learning.locks.setdefault(spec.name, asyncio.Lock())
    async with lock:
        last = learning.attempts.get(spec.name)
        if last is not None and time.monotonic() - last < _REFRESH_S:
            return
        learning.attempts[spec.name] = time.monotonic()
        try:
            async with asyncio.timeout(_TIMEOUT_S):
                await _list_all(app, spec)
        except Exception as exc:  # noqa: BLE001 - learning is best effort; the default is safe
            log.warning("%s: could not list tools to learn annotations: %s", spec.name, exc)


async def _list_all(app: web.Application, spec: UpstreamSpec) -> None:
    assert spec.url is not None
    async with httpx2.AsyncClient(headers=dict(spec.headers), timeout=_TIMEOUT_S) as http:
        transport = streamable_http_client(spec.url, http_client=http)
        async with Client(transport, mode="auto") as client:
            cursor: str | None = None
            for _ in range(_MAX_PAGES):
                page = await client.list_tools(cursor=cursor)
                learn_tools(app, spec.name, page.model_dump(by_alias=True, exclude_none=True))
                cursor = page.next_cursor
                if not cursor:
                    break

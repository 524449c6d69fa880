"""Calls to the HTTP proxy as a test makes them: one JSON POST with its answer read whole
(`post`), and a ledger entry read once its outcome has been recorded (`settled`)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from yarl import URL

from ledger import EntryNotFound
from tests.integration.proxy_harness import RunningProxy

__all__ = ["BOUNDED_S", "post", "settled"]

BOUNDED_S = 10.0


async def settled(proxy: RunningProxy, key: str, state: str) -> Any:
    """The entry once it reaches `state`: the outcome is recorded right after the last byte is
    relayed, so a test reading the ledger the moment its response ends may be a little early."""
    deadline = asyncio.get_running_loop().time() + BOUNDED_S
    while True:
        try:
            entry, _ = await proxy.store.get(key)
        except EntryNotFound:  # a refusal's record is written behind its answer
            if asyncio.get_running_loop().time() > deadline:
                raise
        else:
            if entry.state == state or asyncio.get_running_loop().time() > deadline:
                return entry
        await asyncio.sleep(0.01)


async def post(
    proxy: RunningProxy,
    body: Any,
    key: str | None = None,
    path: str = "/http/fake/v1/actions",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """POST `body` as JSON (with `Idempotency-Key: key` if given); status, headers, body.

    `path` is sent exactly as written (percent-escapes are not normalised on the way).
    """
    all_headers = {"Idempotency-Key": key} if key else {}
    all_headers.update(headers or {})
    url = URL(f"{proxy.base}{path}", encoded=True)
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers=all_headers) as response,
    ):
        async with asyncio.timeout(BOUNDED_S):
            content = await response.read()
        return response.status, dict(response.headers), content

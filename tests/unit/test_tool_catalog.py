"""How a call waits for the proxy's own listing of an upstream's tools (`proxy.mcp.catalog`):
within its own bound, never failed by the listing's own end, and cancelled only by its own
cancellation. The listing here is a stand-in task; the real one runs a child process
(`tests/integration/test_mcp_annotations.py`)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from policies.model import UpstreamSpec
from proxy.mcp import catalog

SPEC = UpstreamSpec(name="up", kind="mcp_http", url="http://127.0.0.1:9/mcp")


def _app_listing(listing: asyncio.Task[None]) -> web.Application:
    """An application whose catalog has `listing` running for SPEC's upstream."""
    app = web.Application()
    catalog.setup(app)
    app[catalog.CATALOG].listings[SPEC.name] = listing
    return app


async def test_a_listing_cancelled_by_someone_else_lets_the_waiting_call_go_on() -> None:
    """The cleanup ends a listing a call is waiting for: the call goes on (to classify the tool
    by the default), it is not cancelled with the listing."""
    listing = asyncio.create_task(asyncio.sleep(60))
    waiting = asyncio.create_task(catalog.learn_annotations(_app_listing(listing), SPEC, wait_s=30))
    await asyncio.sleep(0.05)
    listing.cancel()
    async with asyncio.timeout(5):
        await waiting  # returns: no CancelledError from the listing's end
    assert not waiting.cancelled()


async def test_the_waiting_call_stops_at_its_bound_and_the_listing_runs_on() -> None:
    listing = asyncio.create_task(asyncio.sleep(60))
    async with asyncio.timeout(5):
        await catalog.learn_annotations(_app_listing(listing), SPEC, wait_s=0.05)
    assert not listing.done()
    listing.cancel()


@pytest.mark.parametrize("steps", range(3))
async def test_a_cancelled_call_is_cancelled_even_when_the_listing_ends_at_that_moment(
    steps: int,
) -> None:
    """The call's own cancellation is never lost, even when the listing it waits for ends
    around the same turn of the loop (`steps` turns after the listing was told to end): a
    3.11 `wait_for` then returns the listing's result, and the call would go on through the
    shutdown that cancelled it."""
    ending = asyncio.get_running_loop().create_future()

    async def listing_body() -> None:
        await ending

    listing = asyncio.create_task(listing_body())
    waiting = asyncio.create_task(catalog.learn_annotations(_app_listing(listing), SPEC, wait_s=30))
    for _ in range(3):
        await asyncio.sleep(0)
    ending.set_result(None)
    for _ in range(steps):
        await asyncio.sleep(0)
    assert not waiting.done()  # the listing's end has not reached the call yet
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await listing

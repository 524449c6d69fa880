"""A caller's messages from a stdio process: in order, never making the reader wait, bounded."""

from __future__ import annotations

import asyncio

from proxy.mcp.upstreams.delivery import Backlog, Delivery


class GatedRelay:
    """A client whose writes wait at a gate (a client that is not reading)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.gate = asyncio.Event()

    async def message(self, data: bytes) -> None:
        await self.gate.wait()
        self.sent.append(data)

    async def event(self, frame: bytes, event_id: str | None) -> None:
        raise AssertionError("not used")

    async def comment(self, raw: bytes) -> None:
        raise AssertionError("not used")

    async def let_go(self) -> None:
        raise AssertionError("not used")


async def test_messages_go_out_in_order_and_flush_waits_for_them() -> None:
    relay = GatedRelay()
    delivery = Delivery(relay, "up", max_bytes=1000)
    for number in range(5):
        delivery.put(b"m%d" % number)  # returns at once: the client is not reading yet
    assert relay.sent == []
    flushed = asyncio.create_task(delivery.flush())
    await asyncio.sleep(0)
    assert not flushed.done()
    relay.gate.set()
    await asyncio.wait_for(flushed, 5)
    assert relay.sent == [b"m0", b"m1", b"m2", b"m3", b"m4"]


async def test_a_caller_that_falls_behind_loses_what_is_past_the_bound() -> None:
    relay = GatedRelay()
    delivery = Delivery(relay, "up", max_bytes=250)
    for number in range(10):
        delivery.put(b"%03d" % number + b"x" * 97)
    assert delivery.dropped == 8  # two 100-byte messages fit in 250 bytes
    relay.gate.set()
    await asyncio.wait_for(delivery.flush(), 5)
    assert [data[:3] for data in relay.sent] == [b"000", b"001"]


async def test_close_stops_the_writing() -> None:
    relay = GatedRelay()
    delivery = Delivery(relay, "up")
    delivery.put(b"a")
    delivery.put(b"b")
    delivery.close()
    relay.gate.set()
    await asyncio.wait_for(delivery.flush(), 5)
    assert relay.sent == []


def test_the_backlog_keeps_the_newest_messages_within_count_and_bytes() -> None:
    backlog = Backlog(max_count=3, max_bytes=250)
    for number in range(5):
        backlog.append(b"%d" % number + b"x" * 99)
    assert len(backlog) == 2  # 250 bytes hold two 100-byte messages
    assert [backlog.popleft()[:1] for _ in range(2)] == [b"3", b"4"]
    for number in range(5):
        backlog.append(b"%d" % number)
    assert [backlog.popleft() for _ in range(len(backlog))] == [b"2", b"3", b"4"]
    backlog.append(b"z" * 1000)  # one message over the byte bound is still kept, alone
    assert len(backlog) == 1

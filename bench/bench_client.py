"""The upstream client alone: CPU per request of Interlock's HTTP/1.1 client against aiohttp's.

Both proxied paths reach their HTTP upstreams through `proxy.runtime.http1` (they used aiohttp's
`ClientSession` before). This table prices that choice in isolation, in one process on uvloop:
N tasks send the model API's JSON chat request back to back to the fake provider (its own
process, as in `bench_http`) and read each answer whole, through each client in turn; the CPU is
this process's (`time.process_time`) per request, best of the interleaved rounds. Both keep their
connections alive (fresh connections per 1,000 requests are printed, from the provider's count).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
import uvloop
from yarl import URL

from bench.common import Table, bench_process, connections_seen, free_port
from proxy.runtime.http1 import Pool

__all__ = ["run"]

_BODY = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "hello"}]}).encode()
_HEADERS = {"Content-Type": "application/json"}
_CONCURRENCY = (1, 32)

Send = Callable[[], Awaitable[bytes]]


async def _measure(
    send: Send, concurrency: int, seconds: float, base: str
) -> tuple[int, float, int]:
    """Requests done, CPU seconds and connections opened, after a warm-up that opens them."""
    done = 0

    async def client(stop_at: float) -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            await send()
            done += 1

    await asyncio.gather(*(client(time.monotonic() + 0.2) for _ in range(concurrency)))
    done = 0
    opened = await connections_seen(base)
    cpu = time.process_time()
    started = time.monotonic()
    await asyncio.gather(*(client(started + seconds) for _ in range(concurrency)))
    cpu = time.process_time() - cpu
    return done, cpu, await connections_seen(base) - opened


async def _run(quick: bool) -> list[Table]:
    seconds, rounds = (0.5, 1) if quick else (2.0, 3)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    url = URL(f"{base}/v1/chat/completions")
    best: dict[tuple[str, int], tuple[float, float]] = {}  # (µs per request, fresh per 1k)
    argv = [sys.executable, "-m", "bench.bench_http", "--provider", str(port)]
    async with bench_process(argv, f"{base}/v1/models"):
        for concurrency in _CONCURRENCY:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=concurrency),
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            )
            pool = Pool(url, limit=concurrency)

            async def with_aiohttp(session: aiohttp.ClientSession = session) -> bytes:
                async with session.post(url, data=_BODY, headers=_HEADERS) as answer:
                    return await answer.read()

            async def with_ours(pool: Pool = pool) -> bytes:
                answer = await pool.request(
                    "POST", url, _HEADERS.items(), _BODY, connect_s=10, read_s=30
                )
                try:
                    return await answer.read(1 << 20)
                finally:
                    answer.release()

            clients: dict[str, Send] = {
                "aiohttp ClientSession": with_aiohttp,
                "interlock http1": with_ours,
            }
            for _ in range(rounds):
                for name, send in clients.items():
                    done, cpu, opened = await _measure(send, concurrency, seconds, base)
                    fresh = opened * 1000 / max(done, 1)
                    got = (cpu / max(done, 1) * 1e6, fresh)
                    if (name, concurrency) not in best or got[0] < best[(name, concurrency)][0]:
                        best[(name, concurrency)] = got
            await session.close()
            await pool.close()
    table = Table(
        title="upstream client: CPU per request (in-process, fake model provider on 127.0.0.1)",
        columns=["client", "concurrency", "CPU µs/request", "vs aiohttp", "fresh conns/1k"],
    )
    for concurrency in _CONCURRENCY:
        floor = best[("aiohttp ClientSession", concurrency)][0]
        for name in ("aiohttp ClientSession", "interlock http1"):
            us, fresh = best[(name, concurrency)]
            table.rows.append(
                [name, str(concurrency), f"{us:,.0f}", f"{us / floor:.2f}×", f"{fresh:.1f}"]
            )
    table.note = (
        f"Each cell: {seconds:g} s after a 0.2 s warm-up, best of {rounds} interleaved round(s); "
        "this process's CPU (the load and the client share it) per request. The provider's CPU "
        "is not counted."
    )
    return [table]


def run(quick: bool = False) -> list[Table]:
    return uvloop.run(_run(quick))

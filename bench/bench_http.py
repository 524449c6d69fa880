"""The model-API proxy's cost: req/s and CPU per request through Interlock vs direct vs bare.

Three routes to the same fake provider (`tests/integration/fake_provider.py`, its own process):
- direct: the load generator calls the provider itself;
- bare: through a minimal aiohttp pass-through (its own process, below: forwards method, path,
  headers and body bytes, streams the answer back, parses nothing) — the floor any proxy pays;
- interlock: through `interlock serve` (`python -m proxy serve`, its own process; telemetry
  disabled so this table shows the proxy's own work — `bench_telemetry` prices the spans);
- asyncio loop: the same on the standard asyncio event loop (`--loop asyncio`; a diagnostic row:
  the default is uvloop where installed).

Bodies: a JSON chat completion, and a streamed one (SSE, 20 content chunks and a usage chunk).
Concurrency 1 and 32. CPU is the middle process's CPU time (all threads, /proc schedstat), divided
by the requests it served; the load generator and the provider are not counted. The provider
counts the TCP connections opened to it (`bench.common.count_connections`): fresh connections per
1,000 requests show whether the middle process reuses keep-alive connections. All traffic stays
on 127.0.0.1. Each cell runs for a fixed time; req/s depends on the machine (2 shared cores here:
the load generator, the provider and the middle process compete), CPU/request much less so.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import tempfile
import textwrap
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil
from aiohttp import web

from bench.common import (
    RoundRatios,
    Table,
    bench_process,
    connections_seen,
    count_connections,
    cpu_s,
    free_port,
    round_ratios,
)

__all__ = ["run"]

_CONCURRENCY = (1, 32)
_STREAM_CHUNKS = 20
_CHAT = {"model": "bench", "messages": [{"role": "user", "content": "hello"}]}
_STREAM = {**_CHAT, "stream": True, "stream_options": {"include_usage": True}}
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}
)
_GOALS = {"json": 1.5, "stream": 1.3}


@dataclass
class Cell:
    requests: int
    errors: int
    seconds: float
    cpu_s: float | None
    fresh: int = 0

    @property
    def fresh_per_1k(self) -> float:
        return self.fresh * 1000 / max(self.requests, 1)

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def cpu_ms(self) -> float | None:
        return None if self.cpu_s is None else self.cpu_s / max(self.requests, 1) * 1e3


# ---------------------------------------------------------------------------- processes


def _process(args: list[str], ready_url: str) -> AbstractAsyncContextManager[psutil.Process]:
    return bench_process([sys.executable, *args], ready_url)


def _proxy_config(folder: Path, port: int, provider: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / "interlock.yaml"
    text = f"""
        listen: "127.0.0.1:{port}"
        ledger: {{url: "sqlite:///ledger.db", durability: normal}}
        telemetry: {{enabled: false}}
        limits:
          global: {{max_running: 512, max_pending: 1024}}
          tenant: {{max_running: 256, max_pending: 1024}}
        upstreams:
          llm: {{http: "{provider}", kind: openai}}
    """
    path.write_text(textwrap.dedent(text))
    return path


# ------------------------------------------------------------------------------- load


async def _drive(
    url: str,
    body: bytes,
    concurrency: int,
    seconds: float,
    proc: psutil.Process | None,
    provider: str,
) -> Cell:
    """`concurrency` clients sending `body` back to back for `seconds`."""
    done = errors = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"Content-Type": "application/json", "X-Interlock-Class": "background"}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def client(stop_at: float) -> None:
            nonlocal done, errors
            while time.monotonic() < stop_at:
                async with session.post(url, data=body) as response:
                    await response.read()
                    done += 1
                    errors += response.status != 200

        await asyncio.gather(*(client(time.monotonic() + 0.2) for _ in range(concurrency)))
        done = errors = 0  # the warm-up above opened the connections
        opened = await connections_seen(provider)
        before = cpu_s(proc) if proc else None
        started = time.monotonic()
        await asyncio.gather(*(client(started + seconds) for _ in range(concurrency)))
        elapsed = time.monotonic() - started
        after = cpu_s(proc) if proc else None
        fresh = await connections_seen(provider) - opened
    cpu = None
    if before is not None and after is not None:
        cpu = after - before
    return Cell(requests=done, errors=errors, seconds=elapsed, cpu_s=cpu, fresh=fresh)


async def _run(quick: bool) -> list[Table]:
    seconds = 0.4 if quick else 2.0
    rounds = 1 if quick else 3
    concurrency = _CONCURRENCY
    bodies = {"json": json.dumps(_CHAT).encode(), "stream": json.dumps(_STREAM).encode()}
    provider_port, bare_port, proxy_port = free_port(), free_port(), free_port()
    asyncio_port = free_port()
    provider_url = f"http://127.0.0.1:{provider_port}"
    routes: dict[str, str] = {
        "direct": f"{provider_url}/v1/chat/completions",
        "bare": f"http://127.0.0.1:{bare_port}/v1/chat/completions",
        "asyncio loop": f"http://127.0.0.1:{asyncio_port}/http/llm/v1/chat/completions",
        "interlock": f"http://127.0.0.1:{proxy_port}/http/llm/v1/chat/completions",
    }
    seen: dict[tuple[str, str, int], list[Cell]] = {}
    with tempfile.TemporaryDirectory(prefix="interlock-bench-http-") as tmp:
        config = _proxy_config(Path(tmp), proxy_port, provider_url)
        asyncio_config = _proxy_config(Path(tmp) / "asyncio", asyncio_port, provider_url)
        module = "bench.bench_http"
        async with (
            _process(["-m", module, "--provider", str(provider_port)], f"{provider_url}/v1/models"),
            _process(
                ["-m", module, "--bare", str(bare_port), provider_url],
                f"http://127.0.0.1:{bare_port}/v1/models",
            ) as bare,
            _process(
                ["-m", "proxy", "serve", "--config", str(config)],
                f"http://127.0.0.1:{proxy_port}/healthz",
            ) as proxy,
            _process(
                ["-m", "proxy", "serve", "--config", str(asyncio_config), "--loop", "asyncio"],
                f"http://127.0.0.1:{asyncio_port}/healthz",
            ) as on_asyncio,
        ):
            middle = {"direct": None, "bare": bare, "asyncio loop": on_asyncio, "interlock": proxy}
            # Rounds interleave the routes; the least disturbed run of each cell counts (lowest
            # CPU per request, else highest rate), since other work may share the machine.
            for _ in range(rounds):
                for kind, body in bodies.items():
                    for n in concurrency:
                        for route, url in routes.items():
                            got = await _drive(url, body, n, seconds, middle[route], provider_url)
                            seen.setdefault((kind, route, n), []).append(got)
    cells = {key: min(runs, key=_disturbance) for key, runs in seen.items()}
    return [_table(cells, seen, concurrency, seconds, rounds)]


def _disturbance(cell: Cell) -> tuple[float, float]:
    """Orders a cell's runs, least disturbed first: by CPU per request, then (a route with no
    CPU figure: direct) by rate."""
    return (math.inf if cell.cpu_ms is None else cell.cpu_ms, -cell.rate)


def _table(
    cells: dict[tuple[str, str, int], Cell],
    seen: dict[tuple[str, str, int], list[Cell]],
    concurrency: tuple[int, ...],
    seconds: float,
    rounds: int,
) -> Table:
    rows: list[list[str]] = []
    verdicts: list[str] = []
    for kind in ("json", "stream"):
        for n in concurrency:
            bare_ms = cells[(kind, "bare", n)].cpu_ms
            for route in ("direct", "bare", "asyncio loop", "interlock"):
                cell = cells[(kind, route, n)]
                ratio = "—"
                if cell.cpu_ms is not None and bare_ms:
                    ratio = f"{cell.cpu_ms / bare_ms:.2f}×"
                cpu = "—" if cell.cpu_ms is None else f"{cell.cpu_ms:.3f}"
                fresh = f"{cell.fresh_per_1k:.0f}"
                each = (
                    "—" if route in ("direct", "bare") else _each_round(seen, kind, route, n).text
                )
                rows.append(
                    [
                        kind,
                        str(n),
                        route,
                        f"{cell.rate:.0f}",
                        cpu,
                        ratio,
                        each,
                        fresh,
                        str(cell.errors),
                    ]
                )
            mine = cells[(kind, "interlock", n)].cpu_ms
            if mine is not None and bare_ms:
                times = mine / bare_ms
                verdict = "meets" if times <= _GOALS[kind] else "misses"
                each_round = _each_round(seen, kind, "interlock", n)
                verdicts.append(
                    f"{kind}@{n}: {times:.2f}× ({verdict} ≤{_GOALS[kind]}×; each round "
                    f"{each_round.text}, {each_round.verdict})"
                )
        verdicts.extend(_growth(cells, kind, concurrency))
    note = (
        f"Each cell: {seconds:g} s after a 0.2 s warm-up, best of {rounds} interleaved round(s); "
        "'each round' is the lowest and highest of the ratios to bare measured in the same round. "
        "CPU ms/req is the middle process's "
        "CPU time per request (none for direct). fresh conns/1k = TCP connections the provider saw "
        "opened per 1,000 requests (direct: the load generator's own). asyncio loop = interlock on "
        "the standard event loop (diagnostic). Goal: Interlock ≤ 1.5× bare "
        "for JSON, ≤ 1.3× for streaming, the c=32 ratio no worse than c=1. " + "; ".join(verdicts)
    )
    return Table(
        title="HTTP proxy: req/s and CPU per request (fake model provider on 127.0.0.1)",
        columns=[
            "body",
            "concurrency",
            "route",
            "req/s",
            "CPU ms/req",
            "vs bare",
            "each round",
            "fresh conns/1k",
            "errors",
        ],
        rows=rows,
        note=note,
    )


def _each_round(
    seen: dict[tuple[str, str, int], list[Cell]], kind: str, route: str, n: int
) -> RoundRatios:
    """`route`'s CPU per request over bare's, round by round."""
    mine = [c.cpu_ms for c in seen.get((kind, route, n), [])]
    bare = [c.cpu_ms for c in seen.get((kind, "bare", n), [])]
    return round_ratios(mine, bare, goal=_GOALS[kind])


def _growth(
    cells: dict[tuple[str, str, int], Cell], kind: str, concurrency: tuple[int, ...]
) -> list[str]:
    """The ratio at the top concurrency over the ratio at 1 (per-call work growing with load)."""
    ratios: list[float] = []
    for n in (concurrency[0], concurrency[-1]):
        mine, bare = cells[(kind, "interlock", n)].cpu_ms, cells[(kind, "bare", n)].cpu_ms
        if mine is None or not bare:
            return []
        ratios.append(mine / bare)
    growth = ratios[1] / ratios[0]
    verdict = "meets" if growth <= 1.1 else "misses"
    return [
        f"{kind} c={concurrency[-1]}/c={concurrency[0]}: {growth:.2f} ({verdict} ≤1, ±10% noise)"
    ]


def run(quick: bool = False) -> list[Table]:
    """req/s and CPU/request through Interlock, direct, and a bare pass-through."""
    return asyncio.run(_run(quick))


# ------------------------------------------------------------------- child processes


def _serve_provider(port: int) -> None:
    from tests.integration.fake_provider import FakeProvider, make_app

    provider = FakeProvider(stream_chunks=_STREAM_CHUNKS, keep_received=False)
    app = make_app(provider)
    count_connections(app)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def _bare_app(target: str) -> web.Application:
    """The floor: forward bytes both ways with one pooled session, and parse nothing."""
    sessions: list[aiohttp.ClientSession] = []

    async def session_ctx(_app: web.Application) -> AsyncIterator[None]:
        sessions.append(aiohttp.ClientSession(auto_decompress=False))
        yield
        await sessions[0].close()

    def keep(headers: Mapping[str, str]) -> dict[str, str]:
        return {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with sessions[0].request(
            request.method,
            target + request.raw_path,
            headers=keep(request.headers),
            data=body,
            allow_redirects=False,
        ) as upstream:
            headers = keep(upstream.headers)
            headers.pop("Content-Length", None)
            response = web.StreamResponse(status=upstream.status, headers=headers)
            await response.prepare(request)
            while chunk := await upstream.content.readany():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application()
    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--provider":
        _serve_provider(int(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "--bare":
        web.run_app(
            _bare_app(sys.argv[3]),
            host="127.0.0.1",
            port=int(sys.argv[2]),
            access_log=None,
            print=None,
        )
    else:
        raise SystemExit("usage: make bench (runs python -m bench http)")

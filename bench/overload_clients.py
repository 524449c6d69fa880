"""The overload benchmark's clients: stateless MCP `tools/call`s of the `hold` tool, each with a
new idempotency key and new arguments, sorted by what came back (`Outcomes`).

`closed_loop` sends each client's next call when its last one is answered (calibration);
`paced` shares one send schedule among 48 clients (40 interactive, 8 background) that ignore
`retry_after`; `LoopLag` measures the load generator's own event-loop lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import ClientSession, ClientTimeout, TCPConnector

__all__ = ["BACKGROUND", "CLIENTS", "LoopLag", "Outcomes", "closed_loop", "paced", "pct"]

_MODERN = "2026-07-28"
_ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": _MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "bench-overload", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": _MODERN,
    "Mcp-Method": "tools/call",
    "Mcp-Name": "hold",
}
_SERVICE_S = 0.05
CLIENTS = 48
BACKGROUND = 8  # of the clients; the rest are interactive
_CALL_TIMEOUT_S = 60.0
_REFUSED = -32050


@dataclass
class Outcomes:
    """What the clients saw, by outcome and class."""

    sent: int = 0
    completed: dict[str, list[float]] = field(default_factory=dict)  # class → latencies
    refused_latency_s: list[float] = field(default_factory=list)
    refused_tags: set[str] = field(default_factory=set)
    completed_tags: set[str] = field(default_factory=set)
    other: dict[str, int] = field(default_factory=dict)

    @property
    def completions(self) -> int:
        return sum(len(v) for v in self.completed.values())


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


_tags = itertools.count(1)


async def _send(session: ClientSession, url: str, work_class: str, seen: Outcomes) -> None:
    number = next(_tags)
    tag = f"t{number}"
    meta = dict(_ENVELOPE)
    meta["interlock/idempotency-key"] = f"k-{number}"
    meta["interlock/class"] = work_class
    body = {
        "jsonrpc": "2.0",
        "id": number,
        "method": "tools/call",
        "params": {"name": "hold", "arguments": {"seconds": _SERVICE_S, "tag": tag}, "_meta": meta},
    }
    seen.sent += 1
    started = time.perf_counter()
    try:
        async with session.post(url, data=json.dumps(body), headers=_HEADERS) as response:
            data = await response.read()
            status = response.status
    except (TimeoutError, OSError) as exc:
        kind = type(exc).__name__
        seen.other[kind] = seen.other.get(kind, 0) + 1
        return
    elapsed = time.perf_counter() - started
    kind = _kind(status, data)
    if kind == "ok":
        seen.completed.setdefault(work_class, []).append(elapsed)
        seen.completed_tags.add(tag)
    elif kind == "refused":
        seen.refused_latency_s.append(elapsed)
        seen.refused_tags.add(tag)
    else:
        seen.other[kind] = seen.other.get(kind, 0) + 1


def _kind(status: int, data: bytes) -> str:
    if status != 200:
        return f"http {status}"
    text = data.decode(errors="replace")
    if text.startswith(("event:", ":")):
        text = next((line[5:] for line in text.splitlines() if line.startswith("data:")), "{}")
    try:
        message = json.loads(text)
    except ValueError:
        return "unparsed"
    if "result" in message and not message["result"].get("isError"):
        return "ok"
    code = message.get("error", {}).get("code")
    return "refused" if code == _REFUSED else f"error {code}"


async def closed_loop(url: str, clients: int, duration_s: float) -> Outcomes:
    """`clients` callers, each sending its next call when the last one is answered."""
    seen = Outcomes()
    end = time.monotonic() + duration_s

    async def client(session: ClientSession) -> None:
        while time.monotonic() < end:
            await _send(session, url, "interactive", seen)

    async with _session(clients) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return seen


async def paced(url: str, rate_per_s: float, duration_s: float) -> tuple[Outcomes, float]:
    """48 clients sharing one send schedule at `rate_per_s`; returns what they saw and the wall
    time until the last answer."""
    seen = Outcomes()
    started = time.monotonic()
    end = started + duration_s
    gap = 1.0 / rate_per_s
    next_slot = started

    async def client(session: ClientSession, work_class: str) -> None:
        nonlocal next_slot
        while True:
            now = time.monotonic()
            slot = next_slot = max(next_slot, now) + gap  # no catch-up burst after a lag
            if slot >= end:
                return
            if slot > now:
                await asyncio.sleep(slot - now)
            await _send(session, url, work_class, seen)

    classes = ["background"] * BACKGROUND + ["interactive"] * (CLIENTS - BACKGROUND)
    async with _session(CLIENTS) as session:
        await asyncio.gather(*(client(session, c) for c in classes))
    return seen, time.monotonic() - started


@contextlib.asynccontextmanager
async def _session(limit: int) -> AsyncIterator[ClientSession]:
    connector = TCPConnector(limit=limit)
    timeout = ClientTimeout(total=_CALL_TIMEOUT_S)
    async with ClientSession(connector=connector, timeout=timeout) as session:
        yield session


class LoopLag:
    """How late the load generator's own event loop wakes up (its share of client latency)."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(0.001)
            self.lags.append(time.perf_counter() - asked - 0.001)

    def stop(self) -> None:
        self._task.cancel()

    @property
    def p99_s(self) -> float:
        return pct(self.lags, 0.99)

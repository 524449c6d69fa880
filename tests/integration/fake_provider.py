"""A fake model API (OpenAI- and Anthropic-shaped) for the HTTP proxy's tests and benchmark.

Start it in the test's event loop with `async with running_provider() as provider:`; its base URL
is `provider.url` (`http://127.0.0.1:PORT`). It counts every request it receives
(`provider.received`) and answers by a script: `provider.script(...)` queues behaviours that the
next requests consume in order; with an empty script every request is answered normally.

Behaviours (`Behaviour` values, or the shorthand strings of `behaviour()`):
- `ok`: a normal answer (a stream when the request body says `"stream": true`);
- `pressure`: status 429/503/529 with one header style: `retry-after` (seconds), `retry-after-date`
  (HTTP-date), `retry-after-ms`, `openai` (`x-ratelimit-reset-requests: 2s`), `anthropic`
  (`anthropic-ratelimit-requests-reset: <RFC 3339>`), `none`; optionally `x-should-retry`;
- `stall`: accept the request and never answer (until the test ends);
- `die`: for a stream, send the first chunk and then drop the connection; otherwise drop it
  before answering;
- `error`: status 500 with an OpenAI-style error body.

Routes: `POST /v1/chat/completions` (OpenAI), `POST /v1/messages` (Anthropic), `POST /v1/exports`
(a side effect answering `?bytes=N` streamed bytes), `POST /v1/actions`
(a side-effecting JSON endpoint counting executions per `Idempotency-Key` in
`provider.executions`; `POST /v1/threads/{id}/messages` and `POST /send-mail` are the same
endpoint under names that look like inference or like a rule's glob), `POST /v1/transfers` (a
gateway whose backend acts, counted like an action, and then answers 503), `GET /v1/models`,
`PUT /v1/blobs/{name}` (echoes the upload's size and sha256; sets `provider.blob_started` at its
first bytes), `GET /v1/redirect` (302 to another host), and anything else → 404.

Streams honour `provider.first_chunk_seen`: when `provider.gate_streams` is true, a stream sends
its first chunk, then waits (bounded) until the test sets that event before sending the rest, so a
test can prove chunks reach the client as they are produced; `provider.gate_timeouts` counts
gates that timed out (a proxy that buffers the stream makes it non-zero).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import hashlib
import json
import time
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest
from aiohttp import web

from tests.integration.waiting import wait_until

__all__ = [
    "Behaviour",
    "FakeProvider",
    "Received",
    "behaviour",
    "running_provider",
    "wait_until",
]

Kind = Literal["ok", "pressure", "stall", "die", "error"]
Style = Literal["retry-after", "retry-after-date", "retry-after-ms", "openai", "anthropic", "none"]
GATE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Behaviour:
    kind: Kind = "ok"
    status: int = 429
    style: Style = "retry-after"
    delay_s: float = 2.0
    should_retry: bool | None = None


def behaviour(spec: str) -> Behaviour:
    """Shorthand: "ok", "stall", "die", "error", or "429:retry-after:2" (status:style:delay)."""
    if spec in ("ok", "stall", "die", "error"):
        return Behaviour(kind=spec)  # type: ignore[arg-type]
    status, style, delay = [*spec.split(":"), "retry-after", "2"][:3]
    return Behaviour(kind="pressure", status=int(status), style=style, delay_s=float(delay))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class FakeProvider:
    url: str = ""
    received: list[Received] = field(default_factory=list)
    executions: Counter[str] = field(default_factory=Counter)
    answers: dict[str, bytes] = field(default_factory=dict)
    """The body `POST /v1/actions` sent back, by `Idempotency-Key` (the latest)."""
    plan: deque[Behaviour] = field(default_factory=deque)
    gate_streams: bool = False
    first_chunk_seen: asyncio.Event = field(default_factory=asyncio.Event)
    gate_timeouts: int = 0
    action_gate: asyncio.Event | None = None
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    """`POST /v1/actions` whose `Idempotency-Key` starts with a prefix named here waits (after
    counting its execution) until that prefix's event is set."""
    stream_chunks: int = 3
    chunk_delay_s: float = 0.0
    blob_started: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when `PUT /v1/blobs/...` has received the first bytes of its body."""
    keep_received: bool = True
    """False (benchmarks): only count requests, do not keep them."""
    total: int = 0

    def script(self, *items: Behaviour | str) -> None:
        """Queue behaviours for the next requests, in order."""
        self.plan.extend(behaviour(i) if isinstance(i, str) else i for i in items)

    def count(self, path: str | None = None) -> int:
        """Requests received so far (to `path` only, if given)."""
        if path is None:
            return self.total
        return sum(1 for r in self.received if r.path == path)

    def _next(self) -> Behaviour:
        return self.plan.popleft() if self.plan else Behaviour()


# -------------------------------------------------------------------------------- answers


def _pressure_headers(b: Behaviour) -> dict[str, str]:
    if b.style == "retry-after":
        headers = {"Retry-After": f"{b.delay_s:g}"}
    elif b.style == "retry-after-date":
        when = time.time() + b.delay_s
        headers = {"Retry-After": email.utils.formatdate(when, usegmt=True)}
    elif b.style == "retry-after-ms":
        headers = {"retry-after-ms": f"{int(b.delay_s * 1000)}"}
    elif b.style == "openai":
        headers = {
            "x-ratelimit-limit-requests": "60",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": f"{b.delay_s:g}s",
        }
    elif b.style == "anthropic":
        reset = datetime.now(UTC) + timedelta(seconds=b.delay_s)
        headers = {
            "anthropic-ratelimit-requests-limit": "60",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": reset.isoformat().replace("+00:00", "Z"),
        }
    else:
        headers = {}
    if b.should_retry is not None:
        headers["x-should-retry"] = "true" if b.should_retry else "false"
    return headers


def _error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _chat_json(model: str, n: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
    }


def _chat_chunks(model: str, n: int, parts: int, include_usage: bool) -> list[bytes]:
    base = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 1, "model": model}
    chunks = []
    for i in range(parts):
        choice = {"index": 0, "delta": {"content": f"part{i} "}, "finish_reason": None}
        chunks.append({**base, "choices": [choice]})
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if include_usage:
        usage = {"prompt_tokens": 11, "completion_tokens": parts, "total_tokens": 11 + parts}
        chunks.append({**base, "choices": [], "usage": usage})
    out = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
    return [*out, b"data: [DONE]\n\n"]


def _message_json(model: str, n: int) -> dict[str, Any]:
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": "Hello there."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 9, "output_tokens": 4},
    }


def _message_events(model: str, n: int, parts: int) -> list[bytes]:
    def ev(name: str, data: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

    message = {**_message_json(model, n), "content": [], "stop_reason": None}
    message["usage"] = {"input_tokens": 9, "output_tokens": 1}
    events = [
        ev("message_start", {"type": "message_start", "message": message}),
        ev(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
    ]
    for i in range(parts):
        delta = {"type": "text_delta", "text": f"part{i} "}
        events.append(
            ev("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        )
    events += [
        ev("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ev(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": parts + 1},
            },
        ),
        ev("message_stop", {"type": "message_stop"}),
    ]
    return events


# -------------------------------------------------------------------------------- handlers


class _Handlers:
    def __init__(self, provider: FakeProvider) -> None:
        self.p = provider

    async def record(self, request: web.Request) -> tuple[Received, Behaviour]:
        body = await request.read()
        received = Received(
            method=request.method,
            path=request.path,
            query=request.rel_url.raw_query_string,
            headers=dict(request.headers),
            body=body,
            at=time.monotonic(),
        )
        self.p.total += 1
        if self.p.keep_received:
            self.p.received.append(received)
        return received, self.p._next()

    async def misbehave(self, request: web.Request, b: Behaviour) -> web.StreamResponse | None:
        """Answer a non-`ok` behaviour, or None to answer normally (or with a dying stream)."""
        if b.kind == "pressure":
            kind = "rate_limit_error" if b.status == 429 else "overloaded_error"
            return web.json_response(
                _error_body(kind, f"fake {b.status}"), status=b.status, headers=_pressure_headers(b)
            )
        if b.kind == "error":
            return web.json_response(_error_body("server_error", "fake 500"), status=500)
        if b.kind == "stall":
            await asyncio.Event().wait()  # until the server shuts down and cancels us
        return None

    async def chat(self, request: web.Request) -> web.StreamResponse:
        received, b = await self.record(request)
        if (answer := await self.misbehave(request, b)) is not None:
            return answer
        payload = json.loads(received.body or b"{}")
        model = payload.get("model", "fake-model")
        n = self.p.total
        if not payload.get("stream"):
            if b.kind == "die":
                return self._drop(request)
            return web.json_response(_chat_json(model, n))
        include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
        chunks = _chat_chunks(model, n, self.p.stream_chunks, include_usage)
        return await self.stream(request, chunks, die=b.kind == "die")

    async def messages(self, request: web.Request) -> web.StreamResponse:
        received, b = await self.record(request)
        if (answer := await self.misbehave(request, b)) is not None:
            return answer
        payload = json.loads(received.body or b"{}")
        model = payload.get("model", "fake-claude")
        n = self.p.total
        if not payload.get("stream"):
            if b.kind == "die":
                return self._drop(request)
            return web.json_response(_message_json(model, n))
        events = _message_events(model, n, self.p.stream_chunks)
        return await self.stream(request, events, die=b.kind == "die")

    async def actions(self, request: web.Request) -> web.StreamResponse:
        received, b = await self.record(request)
        if (answer := await self.misbehave(request, b)) is not None:
            return answer
        key = request.headers.get("Idempotency-Key", "")
        self.p.executions[key] += 1
        if self.p.action_gate is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(GATE_TIMEOUT_S):
                    await self.p.action_gate.wait()
        for prefix, gate in self.p.gates.items():
            if key.startswith(prefix):
                await gate.wait()  # until the test opens it (or the server shuts down)
        if b.kind == "die":
            return self._drop(request)
        record = {
            "id": f"act_{self.p.total}",
            "executed": self.p.executions[key],
            "echo": json.loads(received.body or b"null"),
        }
        self.p.answers[key] = json.dumps(record).encode()  # what json_response sends
        return web.json_response(record, status=201, headers={"X-Fake-Action": "done"})

    async def exports(self, request: web.Request) -> web.StreamResponse:
        """A side effect with a large answer: `?bytes=N` streamed in 64 KB chunks of a pattern
        whose sha256 is `export_digest(N)`; executions counted per `Idempotency-Key`."""
        await self.record(request)
        self.p.executions[request.headers.get("Idempotency-Key", "")] += 1
        size = int(request.query.get("bytes", "0"))
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        for offset in range(0, size, EXPORT_CHUNK):
            await response.write(_export_chunk(min(EXPORT_CHUNK, size - offset)))
        await response.write_eof()
        return response

    async def gateway(self, request: web.Request) -> web.StreamResponse:
        """A gateway in front of a backend that acted, then answered 503 (not proof of nothing)."""
        await self.record(request)
        self.p.executions[request.headers.get("Idempotency-Key", "")] += 1
        body = _error_body("overloaded_error", "backend timed out after accepting the transfer")
        return web.json_response(body, status=503, headers={"Retry-After": "1"})

    async def blobs(self, request: web.Request) -> web.StreamResponse:
        """Echo an upload's size and digest; tells the test when the first bytes arrived."""
        first = await request.content.readany()
        self.p.blob_started.set()
        body = first + await request.content.read()
        self.p.total += 1
        if self.p.keep_received:
            self.p.received.append(
                Received(
                    request.method,
                    request.path,
                    request.query_string,
                    dict(request.headers),
                    body,
                    time.monotonic(),
                )
            )
        return web.json_response({"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()})

    async def redirect(self, request: web.Request) -> web.StreamResponse:
        """A redirect to another host, which a proxy must relay, never follow."""
        await self.record(request)
        return web.Response(status=302, headers={"Location": "http://127.0.0.2:9/elsewhere"})

    async def models(self, request: web.Request) -> web.StreamResponse:
        _, b = await self.record(request)
        if (answer := await self.misbehave(request, b)) is not None:
            return answer
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def other(self, request: web.Request) -> web.StreamResponse:
        await self.record(request)
        return web.json_response(_error_body("not_found", "no such route"), status=404)

    async def stream(
        self, request: web.Request, chunks: list[bytes], *, die: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        for i, chunk in enumerate(chunks):
            await response.write(chunk)
            if i == 0 and die:
                return self._drop(request, response)
            if i == 0 and self.p.gate_streams:
                try:
                    async with asyncio.timeout(GATE_TIMEOUT_S):
                        await self.p.first_chunk_seen.wait()
                except TimeoutError:
                    self.p.gate_timeouts += 1
            elif self.p.chunk_delay_s:
                await asyncio.sleep(self.p.chunk_delay_s)
        await response.write_eof()
        return response

    @staticmethod
    def _drop(
        request: web.Request, response: web.StreamResponse | None = None
    ) -> web.StreamResponse:
        """Close the connection abruptly (no complete answer ever reaches the proxy)."""
        if request.transport is not None:
            request.transport.close()
        return response or web.Response()


EXPORT_CHUNK = 64 * 1024


def _export_chunk(size: int) -> bytes:
    return (b"0123456789abcdef" * (EXPORT_CHUNK // 16))[:size]


def export_digest(size: int) -> str:
    """The sha256 of what `POST /v1/exports?bytes=size` answers."""
    digest = hashlib.sha256()
    for offset in range(0, size, EXPORT_CHUNK):
        digest.update(_export_chunk(min(EXPORT_CHUNK, size - offset)))
    return digest.hexdigest()


def make_app(provider: FakeProvider) -> web.Application:
    handlers = _Handlers(provider)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handlers.chat)
    app.router.add_post("/v1/messages", handlers.messages)
    app.router.add_post("/v1/actions", handlers.actions)
    app.router.add_post("/v1/threads/{thread}/messages", handlers.actions)
    app.router.add_post("/send-mail", handlers.actions)
    app.router.add_post("/v1/transfers", handlers.gateway)
    app.router.add_get("/v1/models", handlers.models)
    app.router.add_post("/v1/exports", handlers.exports)
    app.router.add_put("/v1/blobs/{name}", handlers.blobs)
    app.router.add_get("/v1/redirect", handlers.redirect)
    app.router.add_route("*", "/{tail:.*}", handlers.other)
    return app


@contextlib.asynccontextmanager
async def running_provider(provider: FakeProvider | None = None) -> AsyncIterator[FakeProvider]:
    """Run a fake provider on a free 127.0.0.1 port for the duration of the block."""
    provider = provider or FakeProvider()
    runner = web.AppRunner(make_app(provider), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    provider.url = f"http://127.0.0.1:{port}"
    try:
        yield provider
    finally:
        await runner.cleanup()


@pytest.fixture
async def provider() -> AsyncIterator[FakeProvider]:
    """A fake provider per test (bind in a module: `provider = fake_provider.provider`)."""
    async with running_provider() as running:
        yield running

"""Run the proxy for an MCP transport test: a real aiohttp server on a free 127.0.0.1 port.

    async with running_proxy({"up": http_upstream("up", url)}, tmp_path) as proxy:
        async with Client(proxy.mcp_url("up")) as client: ...

The application is the whole proxy (`proxy.app.create_app`, a SQLite ledger in the test's folder),
served by `web.AppRunner` with aiohttp's default of not cancelling handlers when a client
disconnects (as `web.run_app` serves it in production).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from policies.config import parse_config_text
from policies.model import Config, DeferredSettings, UpstreamSpec
from proxy.app import create_app
from proxy.mcp.transport.sessions import MCP_TRANSPORT, McpTransport
from proxy.mcp.wire.sse import SseParser
from tests.integration.mcp_servers import (
    REPO_ROOT,
    RunningUpstream,
    running_upstream,
    stdio_command,
)
from tests.integration.proxy_harness import serving

__all__ = [
    "ENVELOPE",
    "LEGACY",
    "MODERN",
    "RawAnswer",
    "RawMcp",
    "RunningProxy",
    "build_config",
    "deferring_proxy",
    "http_upstream",
    "minimal_result",
    "module_json_upstream",
    "module_sse_upstream",
    "module_upstream",
    "running_proxy",
    "serving_mcp",
    "stdio_upstream",
]


def http_upstream(name: str, url: str, **values: Any) -> UpstreamSpec:
    """A Streamable HTTP upstream spec."""
    return UpstreamSpec(name=name, kind="mcp_http", url=url, **values)


def minimal_result(method: str, server: str) -> dict[str, Any]:
    """The result a minimal hand-written MCP upstream named `server` answers `method` with: its
    handshake for `initialize`, one tool `look` for `tools/list`, a plain "ok" for a call."""
    if method == "initialize":
        return {
            "protocolVersion": LEGACY,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": server, "version": "1"},
        }
    if method == "tools/list":
        return {"tools": [{"name": "look", "inputSchema": {"type": "object"}}]}
    return {"content": [{"type": "text", "text": "ok"}], "isError": False}


def stdio_upstream(
    name: str, command: tuple[str, ...] | None = None, **values: Any
) -> UpstreamSpec:
    """A stdio upstream spec (by default the test upstream's stdio script)."""
    return UpstreamSpec(
        name=name,
        kind="mcp_stdio",
        command=command or stdio_command(),
        cwd=str(REPO_ROOT),
        **values,
    )


@dataclass
class RunningProxy:
    app: web.Application
    port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def mcp_url(self, upstream: str) -> str:
        return f"{self.base}/mcp/{upstream}"

    @property
    def transport(self) -> McpTransport:
        return self.app[MCP_TRANSPORT]


_BASE_CONFIG = """
ledger: {url: "sqlite:///ledger.db"}
upstreams:
  placeholder: {mcp: "http://127.0.0.1:9/mcp"}
"""
_READ_ONLY_RULE = """
tools:
  - {match: "*/*", side_effect: false}
"""


def build_config(
    upstreams: Mapping[str, UpstreamSpec], folder: Path, *, read_only: bool = True, **values: Any
) -> Config:
    """A full configuration (defaults from the real config loader) with these upstreams.

    `read_only` adds a first rule marking every tool read-only, so transport tests see the
    pipeline's admission but no ledger dedupe of repeated calls.
    """
    text = _BASE_CONFIG + (_READ_ONLY_RULE if read_only else "")
    config = parse_config_text(text, str(folder / "interlock.yaml"), environ={}, base_dir=folder)
    return replace(config, upstreams=dict(upstreams), **values)


@contextlib.asynccontextmanager
async def running_proxy(
    upstreams: Mapping[str, UpstreamSpec],
    folder: Path,
    *,
    read_only: bool = True,
    stdio_idle_s: float | None = None,
    **values: Any,
) -> AsyncIterator[RunningProxy]:
    """Serve the whole proxy (`create_app`) for `upstreams` until the block ends.

    Its SQLite ledger lives in `folder`; `values` override configuration fields.
    """
    app = create_app(build_config(upstreams, folder, read_only=read_only, **values))
    if stdio_idle_s is not None:
        app[MCP_TRANSPORT].stdio.idle_s = stdio_idle_s
    async with serving(app) as base:
        yield RunningProxy(app=app, port=int(base.rsplit(":", 1)[1]))


@contextlib.asynccontextmanager
async def deferring_proxy(spec: UpstreamSpec, folder: Path) -> AsyncIterator[RunningProxy]:
    """`running_proxy` for deferred-work (task) tests: the one upstream `spec` (under its own
    name), side effects allowed, deferred work polled every 0.1 s."""
    deferred = DeferredSettings(poll_interval_s=0.1)
    async with running_proxy(
        {spec.name: spec}, folder, read_only=False, deferred=deferred
    ) as running:
        yield running


MODERN = "2026-07-28"
LEGACY = "2025-11-25"
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "raw-test", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


@dataclass
class RawAnswer:
    """One HTTP answer to a raw MCP POST, with the JSON-RPC messages inside it as bytes."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def messages(self) -> list[bytes]:
        """The JSON-RPC messages: SSE `data` payloads, or the JSON body itself."""
        if self.headers.get("Content-Type", "").startswith("text/event-stream"):
            return [
                e.data.encode() for e in SseParser().feed(self.body) if not e.comment and e.data
            ]
        return [self.body] if self.body else []

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def last(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.messages[-1])
        return value


class RawMcp:
    """A hand-written MCP client over aiohttp, to look at bytes and status codes."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http = http
        self.url = url
        self.session_id: str | None = None
        self.version: str | None = None

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
        }
        if self.session_id:
            headers["Mcp-Session-Id"] = self.session_id
        if self.version:
            headers["MCP-Protocol-Version"] = self.version
        headers.update(extra or {})
        return headers

    async def post(self, body: Any, headers: Mapping[str, str] | None = None) -> RawAnswer:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with self.http.post(self.url, data=data, headers=self.headers(headers)) as answer:
            return RawAnswer(answer.status, CIMultiDict(answer.headers), await answer.read())

    async def initialize(self, version: str = LEGACY) -> RawAnswer:
        """The handshake: initialize; once a session is opened, notifications/initialized."""
        answer = await self.post(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": version,
                    "capabilities": {},
                    "clientInfo": {"name": "raw-test", "version": "1"},
                },
            }
        )
        self.session_id = answer.headers.get("Mcp-Session-Id")
        self.version = version
        if self.session_id:
            note = await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
            assert note.status == 202, note
        return answer

    async def call_modern(
        self,
        request_id: Any,
        tool: str,
        arguments: dict[str, Any],
        meta: Mapping[str, Any] | None = None,
    ) -> RawAnswer:
        """A stateless 2026-07-28 tools/call: envelope in _meta (with `meta`'s members, e.g. an
        idempotency key), routing headers."""
        body = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": {**ENVELOPE, **(meta or {})}},
        }
        headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": tool}
        return await self.post(body, headers)

    async def delete(self) -> int:
        async with self.http.delete(self.url, headers=self.headers()) as answer:
            return answer.status


@contextlib.asynccontextmanager
async def serving_mcp(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[str]:
    """Serve a hand-written MCP endpoint (`handler` answers POST /mcp) on a free loopback port
    until the block ends; yields its URL, ready for `http_upstream`."""
    app = web.Application()
    app.router.add_post("/mcp", handler)
    async with serving(app) as base:
        yield f"{base}/mcp"


@pytest.fixture(scope="module", name="upstream")
def module_upstream() -> Iterator[RunningUpstream]:
    """The real test upstream, one per test module (bind it: `upstream = module_upstream`)."""
    with running_upstream() as running:
        yield running


@pytest.fixture(scope="module", name="sse_upstream")
def module_sse_upstream() -> Iterator[RunningUpstream]:
    """The real test upstream answering calls with event streams, one per module (bind it:
    `sse_upstream = module_sse_upstream`)."""
    with running_upstream() as running:
        yield running


@pytest.fixture(scope="module", name="json_upstream")
def module_json_upstream() -> Iterator[RunningUpstream]:
    """The real test upstream answering calls with JSON bodies, one per module (bind it:
    `json_upstream = module_json_upstream`)."""
    with running_upstream(json_response=True) as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session per test (bind in a module: `http = mcp_proxy_harness.http`)."""
    async with aiohttp.ClientSession() as session:
        yield session

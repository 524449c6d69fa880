"""The proxy's own way to an MCP upstream for deferred calls (their client is not connected).

- 2026-07-28 (stateless): the call goes as its client sent it (its `Mcp-*` routing headers and
  `_meta` envelope), over the pooled HTTP session or the upstream's shared stdio process.
- Handshake era: a session of the proxy's own per (upstream, protocol version), opened with
  `initialize` (no client capabilities: a deferred call cannot ask its user anything) and
  reopened when the upstream no longer knows it; for a stdio upstream, a process of its own.

Only the configured upstream headers go with a deferred call, never the caller's own
credentials (they are not stored).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from policies.model import UpstreamSpec
from proxy.errors import UpstreamError, UpstreamNotReached
from proxy.mcp.catalog import ParamHeaders
from proxy.mcp.transport.sessions import McpTransport
from proxy.mcp.upstreams.channels import HttpChannel, StdioChannel, UpstreamChannel
from proxy.mcp.upstreams.http_pool import send
from proxy.mcp.upstreams.stdio import StdioProcess
from proxy.mcp.upstreams.stdio_pool import SessionCapReached
from proxy.mcp.wire.headers import MCP_PROTOCOL_VERSION_HEADER, MCP_SESSION_ID_HEADER
from proxy.mcp.wire.jsonrpc import read_upstream_message
from proxy.mcp.wire.sse import SseParser
from proxy.runtime.http1 import Pool, Response

__all__ = ["CLIENT_INFO", "DeferredChannels", "NoRelay"]

CLIENT_INFO = {"name": "interlock-deferred", "version": "1"}
_INIT_TIMEOUT_S = 10.0
_INIT_ANSWER_MAX = 1024 * 1024


class NoRelay:
    """Where a deferred call's intermediate messages go: nowhere (nobody is listening)."""

    async def message(self, data: bytes) -> None:
        del data

    async def event(self, frame: bytes, event_id: str | None) -> None:
        del frame, event_id

    async def comment(self, raw: bytes) -> None:
        del raw

    async def let_go(self) -> None:
        return None


def _initialize(version: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": "interlock-deferred-init",
        "method": "initialize",
        "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": CLIENT_INFO},
    }


def _negotiated(body: bytes, sse: bool, asked: str) -> str:
    """The protocol version the upstream's `initialize` answer chose (else the one asked)."""
    payloads: list[bytes | str] = (
        [e.data for e in SseParser().feed(body) if not e.comment and e.data] if sse else [body]
    )
    for payload in payloads:
        message = read_upstream_message(payload)
        result = message.get("result") if message is not None else None
        if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
            return str(result["protocolVersion"])
    return asked


class DeferredChannels:
    """Channels for deferred calls, with the handshake-era sessions they opened."""

    def __init__(self, transport: McpTransport) -> None:
        self._transport = transport
        self._http: dict[tuple[str, str], tuple[str | None, str]] = {}
        self._stdio: dict[tuple[str, str], StdioProcess] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def channel(
        self,
        spec: UpstreamSpec,
        envelope: Mapping[str, Any],
        *,
        forward_authorization: bool,
        param_headers: Mapping[str, ParamHeaders],
    ) -> UpstreamChannel:
        """The channel for this deferred call.

        Raises:
            UpstreamNotReached: no session could be opened (nothing of the call was sent).
        """
        modern = bool(envelope.get("modern"))
        version = str(envelope.get("protocol_version") or "2025-11-25")
        if spec.kind == "mcp_stdio":
            if modern:
                return StdioChannel(await self._transport.stdio.shared_process(spec))
            return StdioChannel(await self._stdio_session(spec, version))
        headers: dict[str, str] = dict(envelope.get("headers") or {})
        if not modern:
            session_id, negotiated = await self._http_session(spec, version)
            headers = {MCP_PROTOCOL_VERSION_HEADER: negotiated}
            if session_id:
                headers[MCP_SESSION_ID_HEADER] = session_id
        return HttpChannel(
            self._transport.http.pool(spec),
            spec,
            headers,
            modern=modern,
            forward_authorization=forward_authorization,
            param_headers=param_headers,
        )

    def forget(self, spec: UpstreamSpec, envelope: Mapping[str, Any]) -> None:
        """The upstream no longer knows the session: the next call opens a new one."""
        version = str(envelope.get("protocol_version") or "2025-11-25")
        self._http.pop((spec.name, version), None)

    async def _http_session(self, spec: UpstreamSpec, version: str) -> tuple[str | None, str]:
        key = (spec.name, version)
        async with self._locks.setdefault(key, asyncio.Lock()):
            known = self._http.get(key)
            if known is None:
                known = self._http[key] = await self._open_http(spec, version)
            return known

    async def _open_http(self, spec: UpstreamSpec, version: str) -> tuple[str | None, str]:
        assert spec.url is not None
        pool = self._transport.http.pool(spec)
        base = {
            **spec.headers,
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
        }
        answer, body = await _post(pool, spec, base, json.dumps(_initialize(version)).encode())
        if answer.status >= 300:
            raise UpstreamNotReached(f"{spec.name}: initialize answered HTTP {answer.status}")
        session_id = answer.headers.get(MCP_SESSION_ID_HEADER)
        negotiated = _negotiated(body, answer.event_stream, version)
        headers = {**base, MCP_PROTOCOL_VERSION_HEADER: negotiated}
        if session_id:
            headers[MCP_SESSION_ID_HEADER] = session_id
        note = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await _post(pool, spec, headers, note.encode())
        return session_id, negotiated

    async def _stdio_session(self, spec: UpstreamSpec, version: str) -> StdioProcess:
        key = (spec.name, version)
        async with self._locks.setdefault(key, asyncio.Lock()):
            process = self._stdio.get(key)
            if process is not None and process.alive:
                return process
            stdio = self._transport.stdio
            try:
                process = await stdio.spawn_session_process(spec)
            except SessionCapReached as exc:
                raise UpstreamNotReached(f"{spec.name}: no process for deferred calls") from exc
            try:
                answer = await process.exchange(
                    _initialize(version), raw=None, relay=NoRelay(), timeout_s=_INIT_TIMEOUT_S
                )
                if "result" not in answer:
                    raise UpstreamNotReached(f"{spec.name}: initialize refused: {answer}")
                await process.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            except BaseException:
                await process.close()
                raise
            stdio.register_session(process)
            self._stdio[key] = process
            return process


async def _post(
    pool: Pool, spec: UpstreamSpec, headers: Mapping[str, str], body: bytes
) -> tuple[Response, bytes]:
    """One step of opening a session for deferred calls: the answer and its body."""
    try:
        async with asyncio.timeout(_INIT_TIMEOUT_S):
            answer = await send(pool, spec, "POST", headers, body)
            try:
                return answer, await answer.read(_INIT_ANSWER_MAX)
            finally:
                answer.release()
    except (UpstreamError, TimeoutError) as exc:
        raise UpstreamNotReached(f"{spec.name}: no session for deferred calls: {exc}") from exc

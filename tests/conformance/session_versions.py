"""An ASGI layer giving each handshake-era session's requests the version the session negotiated.

The SDK decides per request, from the `MCP-Protocol-Version` header, whether to prime a stream for
resumption (2025-11-25 and later). The conformance suite's raw SSE requests send `2025-03-26` on
sessions negotiated at 2025-11-25; a server should go by the session, so this layer does.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from typing import Any

__all__ = ["SessionVersions"]


class SessionVersions:
    """ASGI layer: a session's requests carry the protocol version the session negotiated.

    The SDK decides per request, from the `MCP-Protocol-Version` header, whether to prime a stream
    for resumption. A handshake-era session has one version, fixed by `initialize`: this layer
    remembers it (from the initialize body and the session id in its answer) and puts it in the
    header of that session's later requests. Bounded (oldest sessions forgotten).
    """

    def __init__(self, app: Any, max_sessions: int = 10_000) -> None:
        self._app = app
        self._max = max_sessions
        self._versions: OrderedDict[str, bytes] = OrderedDict()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        session = headers.get(b"mcp-session-id")
        if session is not None:
            version = self._versions.get(session.decode(errors="replace"))
            if version is not None and b"mcp-protocol-version" in headers:
                rewritten = [
                    (k, version if k == b"mcp-protocol-version" else v) for k, v in scope["headers"]
                ]
                scope = {**scope, "headers": rewritten}
            await self._app(scope, receive, send)
            return
        if scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        body = await _read_body(receive)
        requested = _initialize_version(body)
        await self._app(scope, _replay(body), self._watch(send, requested))

    def _watch(self, send: Any, version: str | None) -> Any:
        async def watching(event: dict[str, Any]) -> None:
            if version is not None and event["type"] == "http.response.start":
                for name, value in event.get("headers", []):
                    if name.lower() == b"mcp-session-id":
                        self._versions[value.decode(errors="replace")] = version.encode()
                        while len(self._versions) > self._max:
                            self._versions.popitem(last=False)
            await send(event)

        return watching


def _initialize_version(body: bytes) -> str | None:
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return None
    params = message.get("params")
    version = params.get("protocolVersion") if isinstance(params, dict) else None
    return version if isinstance(version, str) else None


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        event = await receive()
        if event["type"] != "http.request":
            return b"".join(chunks)
        chunks.append(event.get("body", b""))
        if not event.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes) -> Any:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # as a real receive: nothing more until the request ends
        return {"type": "http.disconnect"}  # pragma: no cover

    return receive

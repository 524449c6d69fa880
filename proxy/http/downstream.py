"""The caller's side of a proxied HTTP exchange (`Downstream`).

It knows whether anything was sent to the caller yet (a retry is only possible before that),
opens an SSE stream early to tell a waiting streaming caller what it is waiting for, and ends a
broken stream so the caller sees an error, not a hang.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from policies.answers import Answer

__all__ = ["Downstream", "answer_response", "sse_error_event"]


class _RelayedResponse(web.StreamResponse):
    """A relayed answer: its head goes out with the first body chunk, in one write.

    The first chunk is already in hand when the head is sent, so holding the head back delays
    nothing (aiohttp's `web.Response` does the same for a complete body).
    """

    _send_headers_immediately = False


def sse_error_event(body: Mapping[str, Any]) -> bytes:
    """An SSE `error` event both the OpenAI and the Anthropic SDKs raise on."""
    payload = {"type": "error", **body}
    return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"


class Downstream:
    """The caller's response, started lazily: nothing is sent until there is something to say.

    With `sse_while_waiting` (a streaming request), the first `comment()` opens a 200
    `text/event-stream` response so the caller sees `: queued` instead of silence; from then on
    every answer, including an upstream error, is an SSE `error` event.
    """

    def __init__(self, request: web.Request, *, sse_while_waiting: bool) -> None:
        self._request = request
        self._sse_while_waiting = sse_while_waiting
        self.response: web.StreamResponse | None = None
        self.sse_opened_early = False

    @property
    def committed(self) -> bool:
        """True once the caller has received a status line (no retry or re-answer after that)."""
        return self.response is not None

    async def comment(self, text: str) -> None:
        """Tell a waiting streaming caller what it waits for (an SSE comment line)."""
        if not self._sse_while_waiting:
            return
        with contextlib.suppress(ConnectionError, RuntimeError):  # a gone caller learns nothing
            if self.response is None:
                self.response = web.StreamResponse(
                    status=200,
                    headers={
                        "Content-Type": "text/event-stream",
                        "Cache-Control": "no-cache",
                        "X-Accel-Buffering": "no",
                    },
                )
                self.sse_opened_early = True
                await self.response.prepare(self._request)
            await self.response.write(f": {text}\n\n".encode())

    async def answer(
        self, answer: Answer, headers: Mapping[str, str] | None = None
    ) -> web.StreamResponse:
        """Answer with one of the proxy's own answers (refusal, conflict, unknown outcome...)."""
        if self.response is None:
            return answer_response(answer, headers)
        await self.response.write(sse_error_event(answer.http_body()))
        await self.response.write_eof()
        return self.response

    async def start(self, status: int, headers: CIMultiDict[str]) -> web.StreamResponse:
        """Send the upstream's status and headers; the body follows through `write`."""
        assert self.response is None, "start() after the response was committed"
        self.response = _RelayedResponse(status=status, headers=headers)
        await self.response.prepare(self._request)
        return self.response

    async def write(self, chunk: bytes) -> None:
        assert self.response is not None
        await self.response.write(chunk)

    async def end(self, last_chunk: bytes = b"") -> web.StreamResponse:
        """Finish the body (with its last chunk, sent with the end marker); idempotent."""
        assert self.response is not None
        await self.response.write_eof(last_chunk)
        return self.response

    async def fail(self, answer: Answer, *, event_stream: bool) -> web.StreamResponse:
        """End a response that already started with an error the caller cannot miss.

        For an event stream an SSE `error` event is written first; then the connection is closed
        without finishing the body, so any HTTP client sees a truncated response, never a
        complete-looking one and never a hang.
        """
        assert self.response is not None
        if event_stream or self.sse_opened_early:
            with contextlib.suppress(ConnectionError, RuntimeError):  # the caller may be gone
                await self.response.write(sse_error_event(answer.http_body()))
        self.response.force_close()
        transport = self._request.transport
        if transport is not None:
            transport.close()
        return self.response


def answer_response(answer: Answer, headers: Mapping[str, str] | None = None) -> web.Response:
    """One of the proxy's own answers as a plain JSON response (with its `Retry-After`)."""
    extra = dict(headers or {})
    if (retry_after := answer.retry_after_header) is not None:
        extra["Retry-After"] = retry_after
    return web.json_response(answer.http_body(), status=answer.http_status, headers=extra)

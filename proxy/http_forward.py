"""Forwarding bytes to an HTTP upstream and back: path safety, headers, transport, outcomes.

The pure parts (the target URL, the hop-by-hop header filters) are plain functions; the I/O parts
are `open_upstream` (one attempt: send, wait for the response head) and `read_chunk` (the body
piece by piece, as it arrives). Both translate aiohttp's errors into `proxy.errors` in one
place, `_translate`, so the pipeline only ever sees our own exception tree.

`Downstream` is the caller's side of the exchange: it knows whether anything was sent to the caller
yet (a retry is only possible before that), opens an SSE stream early to tell a waiting streaming
caller what it is waiting for, and ends a broken stream so the caller sees an error, not a hang.
`encode_outcome` / `replay_response` store a side-effecting call's answer in the ledger and give
it back byte-identical to a caller that repeats the call.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from policies.answers import Answer
from proxy.errors import (
    UpstreamError,
    UpstreamLost,
    UpstreamNotReached,
    UpstreamPressure,
    UpstreamTimeout,
)

__all__ = [
    "HOP_BY_HOP",
    "PRESSURE_STATUSES",
    "REPLAYED_HEADER",
    "Downstream",
    "UnsafePath",
    "encode_outcome",
    "open_upstream",
    "read_chunk",
    "replay_response",
    "request_headers",
    "response_headers",
    "split_route",
    "sse_error_event",
    "upstream_url",
]

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
PRESSURE_STATUSES = frozenset({429, 503, 529})
# Headers of the caller that describe the connection to the proxy, not the request itself.
_REQUEST_ONLY_HERE = frozenset({"host", "content-length", "expect"})
_CONTROL_PREFIX = "x-interlock-"
_CALLER_CREDENTIALS = frozenset({"authorization", "x-api-key", "cookie", "origin"})
_PRESSURE_BODY_CAP = 64 * 1024
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_ESCAPING_CHARS = re.compile(r"[/\\\x00-\x1f\x7f]")


class UnsafePath(ValueError):
    """The path would leave the upstream's base URL (dot segments, encoded slashes, a host)."""


# ---------------------------------------------------------------------------- pure: paths


def split_route(raw_path: str) -> tuple[str, str]:
    """Split the raw request path `/http/{upstream}/{tail}` into (upstream name, raw tail).

    The tail is kept exactly as the caller encoded it; the upstream name is percent-decoded.

    Raises:
        UnsafePath: the path does not start with `/http/{upstream}`.
    """
    path = raw_path.split("?", 1)[0]
    if not path.startswith("/http/"):
        raise UnsafePath("the path must start with /http/{upstream}/")
    name, _, tail = path[len("/http/") :].partition("/")
    if not name:
        raise UnsafePath("the path names no upstream")
    return unquote(name), tail


def _check_segment(segment: str) -> None:
    decoded = segment
    for _ in range(3):  # double or triple encoding must not smuggle a dot segment or a slash
        if decoded in (".", "..") or _ESCAPING_CHARS.search(decoded):
            raise UnsafePath(
                f"path segment {segment!r} could escape the upstream's base URL "
                "or holds a control character"
            )
        if "%" not in decoded:
            return
        decoded = unquote(decoded)
    raise UnsafePath(f"path segment {segment!r} is encoded too many times")


def upstream_url(base_url: str, raw_tail: str, query_string: str = "") -> URL:
    """The target URL: the configured base URL, then `/`, then the caller's path, then its query.

    Raises:
        UnsafePath: the tail holds an absolute URL, `//`, a dot segment (also percent-encoded),
            an encoded slash or backslash, or a control character.
    """
    if _SCHEME.match(raw_tail) or raw_tail.startswith("/"):
        raise UnsafePath("the path must be relative to the upstream's base URL")
    segments = raw_tail.split("/") if raw_tail else []
    for index, segment in enumerate(segments):
        if segment == "" and index != len(segments) - 1:
            raise UnsafePath("empty path segments ('//') are not allowed")
        if segment:
            _check_segment(segment)
    origin, prefix, where = _base(base_url)
    query = f"?{query_string}" if query_string else ""
    target = URL(f"{origin}{prefix}/{raw_tail}{query}", encoded=True)
    if (target.scheme, target.host, target.port) != where:
        raise UnsafePath("the target left the upstream's host")  # defence in depth
    return target


@functools.lru_cache(maxsize=64)
def _base(base_url: str) -> tuple[str, str, tuple[str, str | None, int | None]]:
    """The configured base URL's origin, path prefix and (scheme, host, port), parsed once."""
    base = URL(base_url)
    return str(base.origin()), base.raw_path.rstrip("/"), (base.scheme, base.host, base.port)


# -------------------------------------------------------------------------- pure: headers


def _connection_tokens(headers: Iterable[tuple[str, str]]) -> set[str]:
    tokens: set[str] = set()
    for name, value in headers:
        if name.lower() == "connection":
            tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
    return tokens


def request_headers(
    incoming: Iterable[tuple[str, str]],
    injected: Mapping[str, str],
    *,
    identity_encoding: bool = False,
    drop_credentials: bool = False,
) -> CIMultiDict[str]:
    """Headers for the upstream request: the caller's end-to-end headers plus the configured ones.

    Hop-by-hop headers (and any the caller's `Connection` names), `Host`, `Content-Length` and the
    proxy's own `X-Interlock-*` control headers are dropped; configured headers replace the
    caller's of the same name. `identity_encoding` asks the upstream for an uncompressed body
    (used when the proxy must read token usage from it). `drop_credentials` removes the
    caller's `Authorization` / `x-api-key`, `Cookie` and `Origin` (when callers' API keys name
    tenants, those keys are the proxy's, never the upstream's).
    """
    pairs = list(incoming)
    drop = HOP_BY_HOP | _REQUEST_ONLY_HERE | _connection_tokens(pairs)
    if drop_credentials:
        drop |= _CALLER_CREDENTIALS
    injected_names = {name.lower() for name in injected}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in pairs:
        lower = name.lower()
        if lower in drop or lower in injected_names or lower.startswith(_CONTROL_PREFIX):
            continue
        out.add(name, value)
    for name, value in injected.items():
        out[name] = value
    if identity_encoding:
        out["Accept-Encoding"] = "identity"
    return out


def response_headers(incoming: Iterable[tuple[str, str]]) -> CIMultiDict[str]:
    """The upstream's response headers minus hop-by-hop ones (the body bytes are unchanged)."""
    pairs = list(incoming)
    drop = HOP_BY_HOP | _connection_tokens(pairs)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in pairs:
        if name.lower() not in drop:
            out.add(name, value)
    return out


# ------------------------------------------------------------------------------- transport


def _translate(exc: BaseException) -> UpstreamError:
    """aiohttp's and the OS's transport errors as our exception tree (call with `from exc`)."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError):
        return UpstreamNotReached(f"upstream not reached: {exc}")
    if isinstance(exc, aiohttp.ServerTimeoutError | asyncio.TimeoutError):
        return UpstreamTimeout("upstream did not answer within the attempt timeout")
    return UpstreamLost(f"upstream connection lost: {exc.__class__.__name__}: {exc}")


_TRANSPORT_ERRORS = (aiohttp.ClientError, OSError, asyncio.TimeoutError)


async def open_upstream(
    session: aiohttp.ClientSession,
    method: str,
    url: URL,
    headers: CIMultiDict[str],
    body: bytes | aiohttp.StreamReader | None,
    timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 - aiohttp's per-request timeouts, not a wait
) -> aiohttp.ClientResponse:
    """Send one attempt and wait for the response head; the body is left to `read_chunk`.

    Redirects are never followed (the proxy contacts only the configured upstream).

    Raises:
        UpstreamNotReached: nothing was sent (connection refused, connect timeout).
        UpstreamPressure: the upstream answered 429/503/529 (its body is read, bounded).
        UpstreamTimeout, UpstreamLost: sent, and no response head came back.
    """
    try:
        response = await session.request(
            method, url, headers=headers, data=body, timeout=timeout, allow_redirects=False
        )
    except _TRANSPORT_ERRORS as exc:
        raise _translate(exc) from exc
    if response.status in PRESSURE_STATUSES:
        try:
            content = await response.content.read(_PRESSURE_BODY_CAP)
        except _TRANSPORT_ERRORS:
            content = b""
        finally:
            response.release()
        raise UpstreamPressure(response.status, dict(response.headers), content)
    return response


async def read_chunk(response: aiohttp.ClientResponse) -> bytes:
    """The next piece of the response body as soon as any is there; `b""` at the end.

    Raises:
        UpstreamTimeout, UpstreamLost: the body stalled past the read timeout or was cut off.
    """
    try:
        return await response.content.readany()
    except _TRANSPORT_ERRORS as exc:
        raise _translate(exc) from exc


# ------------------------------------------------------------------------------ downstream


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
            extra = dict(headers or {})
            if (retry_after := answer.retry_after_header) is not None:
                extra["Retry-After"] = retry_after
            return web.json_response(answer.http_body(), status=answer.http_status, headers=extra)
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


# -------------------------------------------------------------------------------- outcomes

# Response headers that describe this one exchange, not the outcome: never stored or replayed.
_NOT_REPLAYED = frozenset(
    {"content-length", "date", "server", "set-cookie", "retry-after", "retry-after-ms"}
)
_NOT_REPLAYED_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")
REPLAYED_HEADER = "Idempotent-Replayed"


def encode_outcome(status: int, headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
    """A side-effecting call's answer as the ledger stores it: status, headers worth replaying,
    and the body bytes exactly as the upstream sent them (base64)."""
    kept = [
        [name, value]
        for name, value in response_headers(headers).items()
        if name.lower() not in _NOT_REPLAYED and not name.lower().startswith(_NOT_REPLAYED_PREFIXES)
    ]
    record = {"v": 1, "status": status, "headers": kept, "body": base64.b64encode(body).decode()}
    return json.dumps(record, separators=(",", ":")).encode()


def replay_response(
    outcome: bytes | None, *, state: str, entry_id: str, idempotency_key: str | None
) -> web.Response:
    """The stored answer of a finished call, byte-identical, marked `Idempotent-Replayed: true`.

    An outcome that was too large to keep (only its hash was stored) answers 200 with a note.
    """
    if outcome is None:
        body = {
            "status": "completed",
            "state": state,
            "outcome_retained": False,
            "entry_id": entry_id,
            "idempotency_key": idempotency_key,
            "message": "The call completed; its outcome was too large to be kept for replay.",
        }
        return web.json_response(body, headers={REPLAYED_HEADER: "true"})
    record = json.loads(outcome)
    headers: CIMultiDict[str] = CIMultiDict((name, value) for name, value in record["headers"])
    headers[REPLAYED_HEADER] = "true"
    return web.Response(
        status=record["status"], headers=headers, body=base64.b64decode(record["body"])
    )

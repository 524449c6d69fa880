"""Interlock's HTTP/1.1 upstream client (`proxy.runtime.http1`) against real sockets.

Each test runs on both event loops `serve` can use (uvloop, the default, and asyncio's own): the
upstream is a raw asyncio server that answers with scripted bytes, so framings aiohttp's server
never writes (split chunk-size lines, answers without a length, interim 1xx heads, malformed
heads) are exercised too.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import uvloop
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from yarl import URL

from proxy.errors import UpstreamLost, UpstreamNotReached, UpstreamTimeout
from proxy.runtime.http1 import Pool

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

LOOPS = {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


@pytest.fixture(params=sorted(LOOPS))
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, None]], None]:
    factory = LOOPS[request.param]

    def runner(coro: Coroutine[Any, Any, None]) -> None:
        with asyncio.Runner(loop_factory=factory) as loop_runner:
            loop_runner.run(asyncio.wait_for(coro, 20))

    return runner


class Upstream:
    """A raw server: each connection runs `script`; it keeps what it read and counts connections."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.received: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.tls: ssl.SSLContext | None = None

    async def __aenter__(self) -> Upstream:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.script(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=self.tls)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> URL:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return URL(f"http://127.0.0.1:{port}/v1/x?q=1")

    async def request(self, reader: asyncio.StreamReader) -> bytes:
        """Read one request (head, and a Content-Length or chunked body) and keep it."""
        head = await reader.readuntil(b"\r\n\r\n")
        body = b""
        lower = head.lower()
        if b"content-length:" in lower:
            length = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
        elif b"transfer-encoding: chunked" in lower:
            while True:
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                body += await reader.readexactly(size + 2)
                if size == 0:
                    break
        self.received.append(head + body)
        return head + body


def answers(*replies: bytes, pause: float = 0.0) -> Callable[[Upstream], Script]:
    """A script that answers each request on a connection with the next reply, sent in pieces
    of 7 bytes with `pause` between them (so every framing boundary is split somewhere)."""

    def bind(upstream: Upstream) -> Script:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for reply in replies:
                await upstream.request(reader)
                for at in range(0, len(reply), 7):
                    writer.write(reply[at : at + 7])
                    await writer.drain()
                    if pause:
                        await asyncio.sleep(pause)

        return script

    return bind


def upstream(bind: Callable[[Upstream], Script]) -> Upstream:
    up = Upstream(lambda r, w: asyncio.sleep(0))
    up.script = bind(up)
    return up


async def body_of(pool: Pool, url: URL, body: bytes | None = b"{}", method: str = "POST") -> bytes:
    response = await pool.request(
        method, url, [("Content-Type", "application/json")], body, connect_s=2, read_s=2
    )
    parts = []
    try:
        while piece := await response.readany():
            parts.append(piece)
        assert response.at_eof()
    finally:
        response.release()
    return b"".join(parts)


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: dropped\r\n\r\n"
)


def test_answers_of_every_framing_are_read_whole_and_the_connection_is_reused(run: Any) -> None:
    async def scenario() -> None:
        replies = (OK, CHUNKED, b"HTTP/1.1 204 No Content\r\n\r\n", OK)
        async with upstream(answers(*replies)) as up:
            pool = Pool(up.url, limit=4)
            assert await body_of(pool, up.url) == b"hello"
            assert await body_of(pool, up.url) == b"hello world"
            assert await body_of(pool, up.url) == b""
            assert await body_of(pool, up.url, body=None, method="GET") == b"hello"
            await pool.close()
        assert up.connections == 1
        assert pool.opened == 1
        first, *_, last = up.received
        assert first.startswith(b"POST /v1/x?q=1 HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"\r\nContent-Length: 2\r\n" in first
        assert first.endswith(b"\r\n\r\n{}")
        assert last.startswith(b"GET /v1/x?q=1 HTTP/1.1\r\n")
        assert b"content-length" not in last.lower()

    run(scenario())


def test_the_last_piece_of_a_sized_answer_is_known_as_the_last(run: Any) -> None:
    """The relay sends the end of the caller's answer with the last piece: `at_eof` must be
    true as soon as the last byte is read, not one read later."""

    async def scenario() -> None:
        async with upstream(answers(OK)) as up:
            pool = Pool(up.url, limit=1)
            response = await pool.request("GET", up.url, [], None, connect_s=2, read_s=2)
            got = b""
            while not response.at_eof():
                got += await response.readany()
            assert got == b"hello"
            response.release()
            await pool.close()

    run(scenario())


@pytest.mark.parametrize(
    ("content_type", "stream"),
    [
        (b"text/event-stream", True),
        (b"Text/Event-Stream; charset=utf-8", True),  # media types are case-insensitive
        (b" text/event-stream ;charset=utf-8", True),
        (b"application/json", False),
        (b"text/event-streams", False),
        (None, False),
    ],
)
def test_an_event_stream_is_known_by_its_media_type_in_any_spelling(
    run: Any, content_type: bytes | None, stream: bool
) -> None:
    """Both paths relay an answer as events only when the upstream's media type says so: read
    once from the head, whatever its case or parameters."""
    typed = b"" if content_type is None else b"Content-Type: " + content_type + b"\r\n"
    reply = b"HTTP/1.1 200 OK\r\n" + typed + b"Content-Length: 0\r\n\r\n"

    async def scenario() -> None:
        async with upstream(answers(reply)) as up:
            pool = Pool(up.url, limit=1)
            response = await pool.request("GET", up.url, [], None, connect_s=2, read_s=2)
            assert response.event_stream is stream
            response.release()
            await pool.close()

    run(scenario())


def test_an_answer_without_a_length_ends_with_the_connection(run: Any) -> None:
    async def scenario() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await up.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
            await writer.drain()

        async with Upstream(script) as up:
            pool = Pool(up.url, limit=1)
            assert await body_of(pool, up.url) == b"until the end"
            assert await body_of(pool, up.url) == b"until the end"
            await pool.close()
        assert pool.opened == 2  # the first connection could not carry a second request

    run(scenario())


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=1\r\nContent-Length: 5\r\n\r\nhello",
    ],
    ids=["connection-close", "http-1.0", "keep-alive-1s"],
)
def test_a_connection_the_upstream_will_not_keep_is_not_reused(run: Any, reply: bytes) -> None:
    async def scenario() -> None:
        async with upstream(answers(reply, reply)) as up:
            pool = Pool(up.url, limit=1)
            assert await body_of(pool, up.url) == b"hello"
            assert await body_of(pool, up.url) == b"hello"
            await pool.close()
        assert pool.opened == 2

    run(scenario())


def test_interim_answers_are_skipped(run: Any) -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"

    async def scenario() -> None:
        async with upstream(answers(interim + OK)) as up:
            pool = Pool(up.url, limit=1)
            response = await pool.request("POST", up.url, [], b"x", connect_s=2, read_s=2)
            assert response.status == 200
            assert "Link" not in response.headers
            assert await response.read(100) == b"hello"
            response.release()
            await pool.close()

    run(scenario())


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        b"HTTP/1.1 200 OK\r\nContent-Length: five\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n",
        b"HTTP/2 200\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello",  # then the upstream closes
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",  # likewise
        b"HTTP/1.1 200 OK\r\n" + b"X-Big: " + b"a" * 70_000 + b"\r\n\r\n",
    ],
    ids=[
        "two-lengths",
        "length-not-a-number",
        "space-before-colon",
        "folded-header",
        "chunk-size-0x",
        "chunk-size-underscore",
        "chunk-longer-than-its-size",
        "not-http-1",
        "unasked-upgrade",
        "cut-off-sized",
        "cut-off-chunked",
        "head-too-large",
    ],
)
def test_a_malformed_or_cut_off_answer_is_lost_never_guessed(run: Any, reply: bytes) -> None:
    async def scenario() -> None:
        async with upstream(answers(reply)) as up:
            pool = Pool(up.url, limit=1)
            with pytest.raises(UpstreamLost):
                await body_of(pool, up.url)
            with pytest.raises(UpstreamLost):  # not "busy": the failed request freed its slot
                await body_of(pool, up.url)
            await pool.close()
        assert up.connections == 2  # a connection that carried a bad answer is never reused

    run(scenario())


def test_an_upstream_that_does_not_answer_times_out(run: Any) -> None:
    async def scenario() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await up.request(reader)
            if up.connections == 1:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhe")
            await asyncio.sleep(5)

        async with Upstream(script) as up:
            pool = Pool(up.url, limit=1)
            started = time.monotonic()
            response = await pool.request("GET", up.url, [], None, connect_s=2, read_s=0.2)
            assert await response.readany() == b"he"
            with pytest.raises(UpstreamTimeout):
                await response.readany()
            response.release()
            assert time.monotonic() - started < 3
            with pytest.raises(UpstreamTimeout):  # no head at all this time
                await pool.request("GET", up.url, [], None, connect_s=2, read_s=0.2)
            await pool.close()

    run(scenario())


def test_a_refused_connection_is_not_reached(run: Any) -> None:
    async def scenario() -> None:
        async with Upstream(lambda r, w: asyncio.sleep(0)) as up:
            url = up.url
        pool = Pool(url, limit=1)
        with pytest.raises(UpstreamNotReached, match="ECONNREFUSED"):
            await pool.request("GET", url, [], None, connect_s=2, read_s=2)
        await pool.close()

    run(scenario())


def test_a_header_that_would_split_the_request_is_never_sent(run: Any) -> None:
    async def scenario() -> None:
        async with upstream(answers(OK)) as up:
            pool = Pool(up.url, limit=1)
            for name, value in [
                ("X-A", "1\r\nX-Injected: 2"),
                ("X A", "1"),
                ("X-A", "1\n"),
                ("X-日本", "1"),
            ]:
                with pytest.raises(UpstreamNotReached, match="cannot be sent"):
                    await pool.request("GET", up.url, [(name, value)], None, connect_s=2, read_s=2)
            await pool.close()
        assert up.connections == 0

    run(scenario())


def test_requests_beyond_the_limit_wait_for_a_connection_then_give_up(run: Any) -> None:
    async def scenario() -> None:
        async with upstream(answers(OK, OK, OK)) as up:
            pool = Pool(up.url, limit=1)
            held = await pool.request("GET", up.url, [], None, connect_s=2, read_s=2)
            with pytest.raises(UpstreamNotReached, match="connections stayed busy"):
                await pool.request("GET", up.url, [], None, connect_s=0.1, read_s=2)
            waiting = asyncio.ensure_future(body_of(pool, up.url, body=None, method="GET"))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            assert await held.read(10) == b"hello"
            held.release()
            assert await waiting == b"hello"
            await pool.close()
        assert up.connections == 1  # the waiting request took the released connection

    run(scenario())


def test_an_answer_released_before_its_end_closes_its_connection(run: Any) -> None:
    async def scenario() -> None:
        async with upstream(answers(CHUNKED, OK, pause=0.01)) as up:
            pool = Pool(up.url, limit=1)
            response = await pool.request("GET", up.url, [], None, connect_s=2, read_s=2)
            assert await response.readany()  # some of the first chunk
            response.release()  # the rest of the body is still on the wire
            # a new connection, where the script starts over: its whole first answer
            assert await body_of(pool, up.url) == b"hello world"
            await pool.close()
        assert pool.opened == 2

    run(scenario())


def test_a_connection_the_upstream_closed_while_idle_is_replaced(run: Any) -> None:
    async def scenario() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await up.request(reader)
            writer.write(OK)
            await writer.drain()
            # and the upstream closes the idle connection (its own keep-alive timeout)

        async with Upstream(script) as up:
            pool = Pool(up.url, limit=1)
            assert await body_of(pool, up.url) == b"hello"
            await asyncio.sleep(0.1)
            assert await body_of(pool, up.url) == b"hello"
            await pool.close()
        assert pool.opened == 2

    run(scenario())


def test_an_idle_connection_is_not_kept_past_its_idle_time(run: Any) -> None:
    async def scenario() -> None:
        now = [0.0]
        async with upstream(answers(OK, OK)) as up:
            pool = Pool(up.url, limit=1, idle_s=15, clock=lambda: now[0])
            assert await body_of(pool, up.url) == b"hello"
            now[0] = 15.0
            assert await body_of(pool, up.url) == b"hello"
            await pool.close()
        assert pool.opened == 2

    run(scenario())


def test_a_large_answer_streams_through_a_bounded_buffer(run: Any) -> None:
    size = 8 * 1024 * 1024

    async def scenario() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await up.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
            for _ in range(size // 65536):
                writer.write(b"x" * 65536)
                await writer.drain()

        async with Upstream(script) as up:
            pool = Pool(up.url, limit=1)
            response = await pool.request("GET", up.url, [], None, connect_s=2, read_s=5)
            total = 0
            biggest = 0
            while piece := await response.readany():
                total += len(piece)
                biggest = max(biggest, len(response._connection.buffer))
                await asyncio.sleep(0.001)  # a slow reader
            response.release()
            await pool.close()
        assert total == size
        assert biggest < 2 * 1024 * 1024  # reading paused long before the 8 MiB were in

    run(scenario())


def test_a_streamed_request_body_is_sent_chunked(run: Any) -> None:
    """A body the proxy does not hold (aiohttp's reader of the caller's body) goes out chunked."""

    async def scenario() -> None:
        async def relay(request: web.Request) -> web.Response:
            response = await pool.request("PUT", up.url, [], request.content, connect_s=2, read_s=2)
            got = await response.read(100)
            response.release()
            return web.Response(body=got)

        async with upstream(answers(OK)) as up:
            pool = Pool(up.url, limit=1)
            app = web.Application()
            app.router.add_put("/", relay)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]

            async def parts() -> Any:
                for piece in (b"a" * 10, b"b" * 100_000, b"c"):
                    yield piece

            async with (
                aiohttp.ClientSession() as session,
                session.put(f"http://127.0.0.1:{port}/", data=parts()) as answer,
            ):
                assert await answer.read() == b"hello"
            await runner.cleanup()
            await pool.close()
        (sent,) = up.received
        head, _, body = sent.partition(b"\r\n\r\n")
        assert b"Transfer-Encoding: chunked" in head
        assert body.replace(b"\r\n", b"").count(b"b") == 100_000

    run(scenario())


def test_a_connection_the_upstream_wrote_to_while_idle_is_not_reused(run: Any) -> None:
    """Bytes an upstream sends after its answer, unasked, would be read as the start of the
    next answer on that connection: such a connection is dropped, never reused."""

    async def scenario() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await up.request(reader)
            writer.write(OK)
            await writer.drain()
            await asyncio.sleep(0.1)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale")
            await up.request(reader)

        async with Upstream(script) as up:
            pool = Pool(up.url, limit=1)
            assert await body_of(pool, up.url) == b"hello"
            await asyncio.sleep(0.3)  # the stray answer arrives while the connection is idle
            assert await body_of(pool, up.url) == b"hello"
            await pool.close()
        assert pool.opened == 2

    run(scenario())


def test_a_request_cancelled_while_waiting_for_a_connection_frees_nothing_twice(run: Any) -> None:
    """Cancelled while waiting for a slot, in the same turn as the slot is released: it ends
    cancelled (not with an error of the pool's), and the slot serves the next request."""

    async def scenario() -> None:
        async with upstream(answers(OK, OK, OK)) as up:
            pool = Pool(up.url, limit=1)
            held = await pool.request("GET", up.url, [], None, connect_s=2, read_s=2)
            waiting = asyncio.ensure_future(
                pool.request("GET", up.url, [], None, connect_s=10, read_s=2)
            )
            await asyncio.sleep(0.05)
            waiting.cancel()
            assert await held.read(5) == b"hello"
            held.release()  # in the same turn: the cancelled waiter is still queued
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert await body_of(pool, up.url, body=None, method="GET") == b"hello"
            held = await pool.request("GET", up.url, [], None, connect_s=2, read_s=2)
            with pytest.raises(UpstreamNotReached, match="busy"):  # one slot, not two
                await pool.request("GET", up.url, [], None, connect_s=0.1, read_s=2)
            held.close()
            await pool.close()

    run(scenario())


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, signed by its own key (the test's stand-in for a CA)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "interlock test upstream")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_an_https_upstream_is_verified_then_used(
    run: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TLS with the system's verification: a certificate nobody vouches for is never sent a
    request; once trusted (here through SSL_CERT_FILE, as an operator would), it is used."""
    cert, key = _self_signed(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    async def scenario(trusted: bool) -> None:
        up = upstream(answers(OK, OK))
        up.tls = server_tls
        async with up:
            url = up.url.with_scheme("https")
            pool = Pool(url, limit=1)
            if trusted:
                assert await body_of(pool, url) == b"hello"
                assert await body_of(pool, url) == b"hello"
                assert pool.opened == 1
            else:
                with pytest.raises(UpstreamNotReached, match="TLS handshake: CERTIFICATE_VERIFY"):
                    await pool.request("GET", url, [], None, connect_s=2, read_s=2)
            await pool.close()
        if not trusted:
            assert up.received == []  # the handshake failed: no request was written

    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    run(scenario(trusted=False))
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    run(scenario(trusted=True))

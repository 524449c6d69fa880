"""Slow and greedy clients against `interlock serve`: a connection cap with a clear refusal, and
connections that never finish their request head or body are closed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import psutil
import pytest

from tests.acceptance.test_proxy_crash import _free_port, proxy_process

_WAIT_S = 15.0  # bound on every wait below; the timeouts under test are 1 s


def _config(tmp_path: Path, port: int, max_connections: int) -> Path:
    config = tmp_path / "interlock.yaml"
    config.write_text(
        f"""
listen: "127.0.0.1:{port}"
ledger: {{url: "sqlite:///ledger.db"}}
max_connections: {max_connections}
client_header_timeout_s: 1
client_body_timeout_s: 1
upstreams:
  up: {{mcp: "http://127.0.0.1:9/mcp"}}
"""
    )
    return config


async def _closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (bounded)."""
    data = b""
    async with asyncio.timeout(_WAIT_S):
        while chunk := await reader.read(4096):
            data += chunk
    return data


async def _healthy(port: int) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/healthz") as answer,
    ):
        return answer.status


@pytest.mark.slow
async def test_connections_beyond_the_cap_get_503_and_idle_ones_are_closed(tmp_path: Path):
    """With max_connections 4: four idle connections are held, every further one is answered 503
    with Retry-After and closed at once (the proxy's open files stay bounded); the idle ones are
    closed after the header timeout, and then the proxy serves again."""
    port = _free_port()
    with proxy_process(_config(tmp_path, port, max_connections=4)) as process:
        files_before = psutil.Process(process.pid).num_fds()
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        await asyncio.sleep(0.2)  # let the server accept them (the cap counts accepted ones)
        refused = []
        for _ in range(50):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            refused.append(await _closed_by_server(reader))
            writer.close()
        files_during = psutil.Process(process.pid).num_fds()
        assert all(answer.startswith(b"HTTP/1.1 503") for answer in refused), refused[0]
        assert b"Retry-After: 1" in refused[0]
        assert b"too_many_connections" in refused[0]
        assert files_during <= files_before + 4 + 2, (files_before, files_during)
        for reader, writer in idle:
            assert await _closed_by_server(reader) == b""
            writer.close()
        assert await _healthy(port) == 200


@pytest.mark.slow
async def test_a_request_head_that_trickles_in_is_cut_off(tmp_path: Path):
    """Slowloris: a head sent a few bytes at a time, never finished, is closed by the server."""
    port = _free_port()
    with proxy_process(_config(tmp_path, port, max_connections=64)):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        deadline = time.monotonic() + _WAIT_S
        closed = False
        while time.monotonic() < deadline and not closed:
            try:
                writer.write(b"X-Slow: a\r\n")
                await writer.drain()
                closed = await asyncio.wait_for(reader.read(1), 0.2) == b""
            except TimeoutError:
                continue
            except ConnectionError:
                closed = True
        writer.close()
        assert closed
        assert await _healthy(port) == 200


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/mcp/up", "/admin/ledger/e1/resolve"])
async def test_a_body_that_stops_arriving_is_cut_off(tmp_path: Path, path: str):
    """A POST that announces 1000 bytes and sends 10 is closed once its body stops moving, and
    the proxy stays up: on the proxied routes and on the operator API alike."""
    port = _free_port()
    with proxy_process(_config(tmp_path, port, max_connections=64)):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            + b'{"jsonrpc"'
        )
        await writer.drain()
        await _closed_by_server(reader)
        writer.close()
        assert await _healthy(port) == 200


@pytest.mark.slow
async def test_malformed_header_lines_are_refused_without_logging_their_values(tmp_path: Path):
    """A request whose header line is malformed gets 400; the proxy's log names the problem but
    never the header's value (here a caller's bearer token)."""
    port = _free_port()
    with proxy_process(_config(tmp_path, port, max_connections=64)) as process:
        for line in (
            b"Authorization: Bearer SECRET-TOKEN-1\x01x",
            b"Authorization Bearer SECRET-TOKEN-2",
            b"X-Api-Key: SECRET-TOKEN-3\x7f",
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + line + b"\r\n\r\n")
            answer = await _closed_by_server(reader)
            writer.close()
            assert b" 400 " in answer.split(b"\r\n")[0], answer[:100]
        assert await _healthy(port) == 200
        process.terminate()
        assert process.stdout is not None
        log = process.stdout.read()
    assert "SECRET-TOKEN" not in log
    assert "malformed" in log

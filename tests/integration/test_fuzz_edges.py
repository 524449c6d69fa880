"""Fuzzing the two entry routes, `/mcp/{upstream}` and `/http/{upstream}/{path}`, with raw
requests built by hypothesis: JSON-RPC bodies (deep, batched, malformed), headers and paths.

For every request: no 5xx unless an upstream caused it, the proxy stays up, and no address
outside the configuration is ever contacted (a sentinel listener counts connections; the fuzzed
paths, hosts and bodies keep naming it).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import textwrap
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.config import parse_config_text
from proxy.app import create_app
from tests.integration.fake_provider import FakeProvider, running_provider
from tests.integration.mcp_servers import running_upstream
from tests.integration.proxy_harness import serving

EXAMPLES = 300
UPSTREAM_CAUSED = {"upstream", "upstream_unreachable", "upstream_lost", "outcome_unknown"}


@dataclass
class Sentinel:
    """A listener on a port no upstream uses: any connection to it is a proxy going astray."""

    port: int = 0
    connections: int = 0
    _socket: socket.socket | None = None

    def start(self) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(64)
        self._socket.settimeout(0.2)
        self.port = self._socket.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self._socket is not None
        while True:
            try:
                conn, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            conn.close()

    def stop(self) -> None:
        if self._socket is not None:
            self._socket.close()


@dataclass
class Target:
    """The proxy under fuzz, served from its own thread and event loop."""

    port: int = 0
    sentinel: Sentinel = field(default_factory=Sentinel)
    provider: FakeProvider = field(default_factory=FakeProvider)
    loop_error: list[BaseException] = field(default_factory=list)


@contextlib.asynccontextmanager
async def _serve(folder: Path, mcp_url: str, target: Target) -> AsyncIterator[None]:
    async with running_provider(target.provider) as provider:
        text = f"""
            ledger: {{url: "sqlite:///ledger.db"}}
            defaults: {{timeout_s: 2, deadline_s: 4}}
            upstreams:
              mail: {{mcp: "{mcp_url}"}}
              llm: {{http: "{provider.url}"}}
        """
        config = parse_config_text(
            textwrap.dedent(text), str(folder / "interlock.yaml"), environ={}, base_dir=folder
        )
        async with serving(create_app(config)) as base:
            target.port = int(base.rsplit(":", 1)[1])
            yield


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    folder = tmp_path_factory.mktemp("fuzz")
    target = Target()
    target.sentinel.start()
    ready = threading.Event()
    stop: asyncio.Event | None = None
    loop = asyncio.new_event_loop()

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()
        async with _serve(folder, mcp_url, target):
            ready.set()
            await stop.wait()

    def run() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as exc:
            target.loop_error.append(exc)
            ready.set()

    with running_upstream(stateless=True) as upstream:
        mcp_url = upstream.url
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        assert ready.wait(30), "the proxy did not start"
        assert not target.loop_error, target.loop_error
        yield target
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()
    target.sentinel.stop()


def _send(
    port: int, method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        if "Host" not in headers:
            conn.putheader("Host", f"127.0.0.1:{port}")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------------- strategies

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
methods = st.one_of(
    st.sampled_from(
        ["tools/call", "tools/list", "initialize", "ping", "resources/read", "notifications/x"]
    ),
    st.text(max_size=30),
)
sentinel_words = st.sampled_from(
    ["http://127.0.0.1:{s}/", "//127.0.0.1:{s}", "127.0.0.1:{s}", "@127.0.0.1:{s}", "localhost:{s}"]
)


@st.composite
def jsonrpc_message(draw: st.DrawFn, sentinel_port: int) -> Any:
    message: dict[str, Any] = {}
    if draw(st.booleans()):
        message["jsonrpc"] = draw(st.sampled_from(["2.0", "1.0", 2]))
    if draw(st.booleans()):
        message["id"] = draw(st.one_of(st.integers(), st.text(max_size=10), json_value))
    message["method"] = draw(methods)
    params: dict[str, Any] = {}
    if draw(st.booleans()):
        params["name"] = draw(
            st.one_of(st.text(max_size=20), st.sampled_from(["send_email", "search_docs"]))
        )
    if draw(st.booleans()):
        params["arguments"] = draw(json_value)
    if draw(st.booleans()):
        params["_meta"] = {
            draw(
                st.sampled_from(["interlock/tenant", "interlock/idempotency-key", "progressToken"])
            ): draw(json_value)
        }
    if draw(st.booleans()):
        params["url"] = draw(sentinel_words).format(s=sentinel_port)
    if draw(st.booleans()):
        message["params"] = params
    return message


@st.composite
def mcp_body(draw: st.DrawFn, sentinel_port: int) -> bytes:
    kind = draw(st.sampled_from(["message", "batch", "deep", "junk"]))
    if kind == "message":
        return json.dumps(draw(jsonrpc_message(sentinel_port))).encode()
    if kind == "batch":
        return json.dumps(draw(st.lists(jsonrpc_message(sentinel_port), max_size=5))).encode()
    if kind == "deep":
        depth = draw(st.integers(min_value=100, max_value=20_000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        inner = opener * depth + "1" + closer * depth
        return (
            '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"send_email",'
            f'"arguments":{{"x":{inner}}}}}}}'
        ).encode()
    return draw(st.binary(max_size=200))


header_names = st.sampled_from(
    [
        "X-Interlock-Tenant",
        "X-Interlock-Class",
        "X-Interlock-Run",
        "X-Interlock-Deadline-Ms",
        "Idempotency-Key",
        "Mcp-Session-Id",
        "MCP-Protocol-Version",
        "Content-Type",
        "Accept",
        "Origin",
        "Authorization",
    ]
)
header_values = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)
path_pieces = st.one_of(
    st.sampled_from(
        ["v1", "chat", "completions", "..", ".", "%2e%2e", "%2f", "%5c", "%252e", ";", "..;", "%00"]
    ),
    st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=8),
    st.text(max_size=4),
)


@st.composite
def http_path(draw: st.DrawFn, sentinel_port: int) -> str:
    upstream = draw(st.sampled_from(["llm", "llm", "mail", "nope", "%6c%6c%6d"]))
    pieces = draw(st.lists(path_pieces, max_size=5))
    if draw(st.booleans()):
        pieces.insert(0, draw(sentinel_words).format(s=sentinel_port))
    tail = "/".join(quote(p, safe="%;.:@/") for p in pieces)
    query = "?" + quote(draw(st.text(max_size=10)), safe="=&") if draw(st.booleans()) else ""
    return f"/http/{upstream}/{tail}{query}"


def _check(status: int, body: bytes) -> None:
    if status < 500:
        return
    try:
        data = json.loads(body)
    except ValueError:
        data = {}
    reason = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):
            reason = error.get("reason") or (error.get("data") or {}).get("reason")
    assert reason in UPSTREAM_CAUSED, (status, body[:300])


# ------------------------------------------------------------------------------------ tests

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(data=st.data())
def test_fuzzed_mcp_posts_never_crash_or_stray(target: Target, data: st.DataObject):
    """Any body and headers on `/mcp/{upstream}`: an answer below 500 (or an upstream-caused
    one), and nothing outside the configuration is contacted."""
    body = data.draw(mcp_body(target.sentinel.port))
    headers = dict(data.draw(st.lists(st.tuples(header_names, header_values), max_size=4)))
    headers.setdefault("Content-Type", "application/json")
    headers.setdefault("Accept", "application/json, text/event-stream")
    headers.pop("Origin", None)
    name = data.draw(st.sampled_from(["mail", "mail", "llm", "nope"]))
    status, answer = _send(target.port, "POST", f"/mcp/{name}", headers, body)
    _check(status, answer)
    assert target.sentinel.connections == 0


@FUZZ
@given(data=st.data())
def test_fuzzed_http_requests_never_crash_or_stray(target: Target, data: st.DataObject):
    """Any method, path, headers and body on `/http/...`: an answer below 500 (or an
    upstream-caused one), and nothing outside the configuration is contacted."""
    path = data.draw(http_path(target.sentinel.port))
    method = data.draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "TRACE"]))
    headers = dict(data.draw(st.lists(st.tuples(header_names, header_values), max_size=4)))
    headers.pop("Origin", None)
    body = data.draw(st.one_of(st.binary(max_size=100), mcp_body(target.sentinel.port)))
    status, answer = _send(target.port, method, path, headers, body)
    _check(status, answer)
    assert target.sentinel.connections == 0


def test_the_proxy_is_still_up_after_the_fuzzing(target: Target):
    """After every fuzzed request the proxy still answers /healthz and its loop never died."""
    status, _ = _send(target.port, "GET", "/healthz", {}, b"")
    assert status == 200
    assert not target.loop_error

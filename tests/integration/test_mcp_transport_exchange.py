"""The `send_upstream` contract: one exchange, its relayed messages, and the errors it raises.

These drive the transport's exchanges directly (HTTP and stdio) against real upstreams, so the
pipeline can rely on exactly which `proxy.errors` type each failure is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from policies.model import UpstreamSpec
from proxy.errors import (
    UpstreamLost,
    UpstreamNotReached,
    UpstreamPressure,
    UpstreamRefused,
    UpstreamTimeout,
)
from proxy.mcp.upstreams.http_pool import HttpUpstreams
from proxy.mcp.upstreams.stdio import StdioProcess
from proxy.mcp.upstreams.streamable_http import exchange_http
from proxy.mcp.wire.jsonrpc import dumps, wire_bytes
from proxy.mcp.wire.sse import SseParser
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import ENVELOPE, MODERN, http_upstream, stdio_upstream
from tests.integration.mcp_servers import RunningUpstream, running_upstream
from tests.integration.proxy_harness import serving
from tests.integration.waiting import wait_until


class Collected:
    """A relay that keeps what it is given (the messages a client would have been sent)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.comments: list[bytes] = []

    async def message(self, data: bytes) -> None:
        self.messages.append(json.loads(data))

    async def event(self, frame: bytes, event_id: str | None) -> None:
        for event in SseParser().feed(frame):
            if event.data:
                self.messages.append(json.loads(event.data))

    async def comment(self, raw: bytes) -> None:
        self.comments.append(raw)

    async def let_go(self) -> None:
        pass


upstream = mcp_proxy_harness.module_upstream


@pytest.fixture
async def pool() -> AsyncIterator[HttpUpstreams]:
    upstreams = HttpUpstreams()
    yield upstreams
    await upstreams.close()


def _request(request_id: Any, tool: str, token: Any = None, **arguments: Any) -> dict[str, Any]:
    meta: dict[str, Any] = dict(ENVELOPE)
    if token is not None:
        meta["progressToken"] = token
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": meta},
    }


def _headers(tool: str) -> dict[str, str]:
    return {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/call",
        "mcp-name": tool,
    }


async def _exchange(
    pool: HttpUpstreams,
    spec: UpstreamSpec,
    message: dict[str, Any],
    *,
    relay: Collected | None = None,
    timeout_s: float = 10.0,
    cancel: asyncio.Event | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    return await exchange_http(
        pool.pool(spec),
        spec,
        request_id=message["id"],
        body=dumps(message),
        headers=headers or _headers(message["params"]["name"]),
        relay=relay or Collected(),
        timeout_s=timeout_s,
        cancel=cancel,
    )


async def test_http_exchange_relays_progress_before_the_answer(
    pool: HttpUpstreams, upstream: RunningUpstream
):
    """Progress for the request is relayed as it comes; the answer is returned with its bytes."""
    relay = Collected()
    spec = http_upstream("up", upstream.url)
    answer = await _exchange(
        pool, spec, _request(5, "slow_progress", token="t5", steps=2), relay=relay
    )
    assert answer["id"] == 5
    # the tool's output is kept as the upstream's JSON text: read it as the client would
    relayed = json.loads(wire_bytes(answer))
    assert relayed["result"]["content"][0]["text"] == "done after 2 steps"
    assert [m["params"]["progress"] for m in relay.messages] == [1, 2]
    assert json.loads(answer.raw) == relayed  # type: ignore[attr-defined]


@pytest.mark.parametrize(("status", "error"), [(429, UpstreamPressure), (503, UpstreamPressure)])
async def test_http_pressure_is_upstream_pressure_with_its_headers(
    pool: HttpUpstreams, upstream: RunningUpstream, status: int, error: type[Exception]
):
    """429/503 before processing raise UpstreamPressure carrying Retry-After; nothing ran."""
    spec = http_upstream("up", upstream.url)
    before = upstream.stats()["emails_total"]
    upstream.control(reject_next=1, status=status, retry_after="4")
    with pytest.raises(error) as caught:
        await _exchange(pool, spec, _request(1, "send_email", to="a@b", subject="s"))
    assert caught.value.status == status  # type: ignore[attr-defined]
    assert caught.value.headers["Retry-After"] == "4"  # type: ignore[attr-defined]
    assert upstream.stats()["emails_total"] == before


async def test_http_other_statuses_are_upstream_refused(
    pool: HttpUpstreams, upstream: RunningUpstream
):
    """A non-2xx answer that is not pressure (here 404: unknown session) is UpstreamRefused."""
    spec = http_upstream("up", upstream.url)
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-session-id": "no-such-session",
        "mcp-protocol-version": "2025-11-25",
    }
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo"}}
    with pytest.raises(UpstreamRefused) as caught:
        await _exchange(pool, spec, message, headers=headers)
    assert caught.value.status == 404


async def test_http_connection_refused_is_not_reached(pool: HttpUpstreams):
    """Nothing listening on the port: UpstreamNotReached (certainly not executed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    spec = http_upstream("down", f"http://127.0.0.1:{port}/mcp")
    with pytest.raises(UpstreamNotReached):
        await _exchange(pool, spec, _request(1, "echo", text="x"))


async def test_http_timeout_is_upstream_timeout_and_aborts_the_call(
    pool: HttpUpstreams, upstream: RunningUpstream
):
    """No answer within the attempt timeout: UpstreamTimeout, and the upstream call is aborted."""
    spec = http_upstream("up", upstream.url)
    with pytest.raises(UpstreamTimeout):
        await _exchange(pool, spec, _request(1, "hold", seconds=30, tag="x-timeout"), timeout_s=0.5)
    await wait_until(lambda: "x-timeout" in upstream.stats()["cancelled"])


async def test_http_cancel_event_aborts_as_upstream_lost(
    pool: HttpUpstreams, upstream: RunningUpstream
):
    """The client going away (modern era) aborts the upstream call and raises UpstreamLost."""
    spec = http_upstream("up", upstream.url)
    gone = asyncio.Event()
    call = asyncio.create_task(
        _exchange(pool, spec, _request(1, "hold", seconds=30, tag="x-gone"), cancel=gone)
    )
    await wait_until(lambda: "x-gone" in upstream.stats()["started"])
    gone.set()
    with pytest.raises(UpstreamLost):
        await call
    await wait_until(lambda: "x-gone" in upstream.stats()["cancelled"])


async def test_http_client_gone_before_sending_is_not_reached(
    pool: HttpUpstreams, upstream: RunningUpstream
):
    """A client already gone when the attempt starts: nothing is sent, UpstreamNotReached."""
    spec = http_upstream("up", upstream.url)
    before = upstream.stats()["mcp_requests"]
    gone = asyncio.Event()
    gone.set()
    with pytest.raises(UpstreamNotReached):
        await _exchange(pool, spec, _request(1, "echo", text="x"), cancel=gone)
    assert upstream.stats()["mcp_requests"] == before


async def test_http_upstream_dying_mid_call_is_upstream_lost(pool: HttpUpstreams):
    """The upstream process exiting after receiving the call: UpstreamLost (outcome unknown)."""
    with running_upstream() as doomed:
        spec = http_upstream("doomed", doomed.url)
        with pytest.raises(UpstreamLost) as caught:
            await _exchange(pool, spec, _request(1, "die"))
    assert not isinstance(caught.value, UpstreamTimeout)


_BEYOND_A_DOUBLE = '{"jsonrpc":"2.0","id":%s,"result":{"content":[],"_meta":{"n":1e400}}}'


@pytest.mark.parametrize("framing", ["json", "sse"])
async def test_an_http_answer_with_a_number_beyond_a_double_is_answered(
    pool: HttpUpstreams, framing: str
):
    """The envelope reader refuses such a number in a member it builds; the answer is then parsed
    whole (as infinity, like Python's json module) instead of failing the call."""

    async def answer(request: web.Request) -> web.Response:
        body = _BEYOND_A_DOUBLE % json.dumps((await request.json())["id"])
        if framing == "json":
            return web.Response(text=body, content_type="application/json")
        return web.Response(text=f"data: {body}\n\n", content_type="text/event-stream")

    app = web.Application()
    app.router.add_post("/mcp", answer)
    async with serving(app) as base_url:
        got = await _exchange(pool, http_upstream("odd", f"{base_url}/mcp"), _request(4, "x"))
    assert got["id"] == 4
    assert got["result"]["_meta"] == {"n": float("inf")}


# --- stdio ---


@pytest.fixture
async def shared() -> AsyncIterator[StdioProcess]:
    process = StdioProcess(stdio_upstream("st"), shared=True, max_line_bytes=1 << 20)
    await process.start()
    yield process
    await process.close()


async def test_stdio_exchange_rewrites_ids_and_tokens_and_restores_them(shared: StdioProcess):
    """Two requests with the same id and token on one process each get their own progress/answer."""
    relays = [Collected(), Collected()]
    answers = await asyncio.gather(
        *(
            shared.exchange(
                _request(1, "slow_progress", token=1, steps=steps, delay_s=0.02),
                raw=None,
                relay=relay,
                timeout_s=20,
            )
            for steps, relay in zip((2, 3), relays, strict=True)
        )
    )
    assert [a["id"] for a in answers] == [1, 1]
    assert [json.loads(wire_bytes(a))["result"]["content"][0]["text"] for a in answers] == [
        "done after 2 steps",
        "done after 3 steps",
    ]
    assert [[m["params"]["progress"] for m in r.messages] for r in relays] == [[1, 2], [1, 2, 3]]
    assert all(m["params"]["progressToken"] == 1 for r in relays for m in r.messages)


@contextlib.asynccontextmanager
async def _shared_script(script: str) -> AsyncIterator[StdioProcess]:
    """A shared stdio process running the Python `script` (a hand-written JSON-lines server)."""
    spec = stdio_upstream("script", command=(sys.executable, "-c", script))
    process = StdioProcess(spec, shared=True, max_line_bytes=1 << 20)
    await process.start()
    try:
        yield process
    finally:
        await process.close()


# A JSON-lines server that writes each answer's result before its id (as the TypeScript SDK's
# servers do) and echoes the id it was sent inside that result; with a progress token, it first
# sends one progress notification that echoes the token in its message, before the token member.
_ECHO_FIRST = (
    "import json, sys\n"
    "for line in sys.stdin:\n"
    "    request = json.loads(line)\n"
    "    token = request['params'].get('_meta', {}).get('progressToken')\n"
    "    if token is not None:\n"
    "        params = {'message': token, 'progressToken': token, 'progress': 1}\n"
    "        note = {'jsonrpc': '2.0', 'method': 'notifications/progress', 'params': params}\n"
    "        print(json.dumps(note), flush=True)\n"
    "    answer = {'result': {'seen': request['id']}, 'jsonrpc': '2.0', 'id': request['id']}\n"
    "    print(json.dumps(answer), flush=True)\n"
)


async def test_a_shared_process_that_echoes_the_minted_id_still_answers_under_the_clients_id():
    """The minted id is put back in the answer's bytes only where the bytes say unambiguously
    which occurrence is the id member: a server that writes its result first and echoes the id
    there leaves two, so the answer is encoded afresh: the client's id, the server's result as
    it was (not the echo replaced). The same holds for a progress notification's token."""
    relay = Collected()
    async with _shared_script(_ECHO_FIRST) as process:
        answer = await process.exchange(
            _request(7, "anything", token="t-7"), raw=None, relay=relay, timeout_s=10
        )
    minted = answer["result"]["seen"]
    assert isinstance(minted, str)
    assert minted.startswith("interlock-")
    expected = {"result": {"seen": minted}, "jsonrpc": "2.0", "id": 7}
    assert answer == expected
    assert json.loads(wire_bytes(answer)) == expected
    [note] = relay.messages
    assert note["params"]["progressToken"] == "t-7"
    assert note["params"]["message"].startswith("interlock-")  # the server's echo, as it was


# The same, echoing the id it was sent in a tool's output (content and structuredContent).
_ECHO_IN_OUTPUT = _ECHO_FIRST.replace(
    "{'seen': request['id']}",
    "{'content': [{'type': 'text', 'text': request['id']}],"
    " 'structuredContent': {'seen': request['id']}}",
)


async def test_a_shared_process_that_echoes_the_minted_id_in_its_output_relays_it_as_it_was():
    """A tool's output is read only as its JSON text; when the answer must be encoded afresh
    (the minted id occurs twice), that text goes out as the server wrote it."""
    async with _shared_script(_ECHO_IN_OUTPUT) as process:
        answer = await process.exchange(
            _request(8, "anything"), raw=None, relay=Collected(), timeout_s=10
        )
    relayed = json.loads(wire_bytes(answer))
    minted = relayed["result"]["structuredContent"]["seen"]
    assert minted.startswith("interlock-")
    assert relayed == {
        "result": {
            "content": [{"type": "text", "text": minted}],
            "structuredContent": {"seen": minted},
        },
        "jsonrpc": "2.0",
        "id": 8,
    }


# A JSON-lines server whose answers carry a number beyond a double in a member the proxy reads.
_OUT_OF_RANGE = (
    "import json, sys\n"
    "for line in sys.stdin:\n"
    "    request_id = json.dumps(json.loads(line)['id'])\n"
    '    print(\'{"jsonrpc":"2.0","id":\' + request_id + \',"result":\'\n'
    '          \'{"content":[],"_meta":{"n":1e400}}}\', flush=True)\n'
)


async def test_a_number_beyond_a_double_in_a_stdio_answer_keeps_the_process():
    """The envelope reader refuses such a number; the answer is then parsed whole (as infinity,
    like Python's json module), answered, and the process goes on to answer the next call."""
    async with _shared_script(_OUT_OF_RANGE) as process:
        for number in (1, 2):
            answer = await process.exchange(
                _request(number, "anything"), raw=None, relay=Collected(), timeout_s=10
            )
            assert answer["id"] == number
            assert answer["result"]["_meta"] == {"n": float("inf")}
        assert process.alive


async def test_stdio_timeout_cancels_the_request_in_the_process(shared: StdioProcess):
    """A stdio attempt past its timeout raises UpstreamTimeout and the process stops the call."""
    with pytest.raises(UpstreamTimeout):
        await shared.exchange(
            _request(1, "hold", seconds=30, tag="s-timeout"),
            raw=None,
            relay=Collected(),
            timeout_s=0.5,
        )
    counts = await shared.exchange(_request(2, "count"), raw=None, relay=Collected(), timeout_s=10)
    state = json.loads(wire_bytes(counts))["result"]["structuredContent"]
    assert "s-timeout" in state["cancelled"]


async def test_stdio_process_dying_mid_call_is_upstream_lost(shared: StdioProcess):
    """A process exiting mid-call fails it with UpstreamLost; later sends are NotReached."""
    with pytest.raises(UpstreamLost):
        await shared.exchange(_request(1, "die"), raw=None, relay=Collected(), timeout_s=20)
    await asyncio.wait_for(shared.exited.wait(), 10)
    with pytest.raises(UpstreamNotReached):
        await shared.exchange(
            _request(2, "echo", text="x"), raw=None, relay=Collected(), timeout_s=5
        )


async def test_stdio_command_that_cannot_start_is_not_reached():
    """A missing program raises UpstreamNotReached at start."""
    process = StdioProcess(
        stdio_upstream("missing", ("/nonexistent/interlock-test",)),
        shared=False,
        max_line_bytes=1024,
    )
    with pytest.raises(UpstreamNotReached):
        await process.start()

"""The MCP wire format and its small helpers: JSON-RPC, SSE, headers, learning, cancellation."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from policies.answers import CODE_INVALID_REQUEST, CODE_PARSE_ERROR
from proxy.mcp.catalog import CATALOG, ToolCatalog, learn_tools
from proxy.mcp.upstreams.stdio_ids import restore
from proxy.mcp.wire import jsonrpc
from proxy.mcp.wire.headers import (
    client_response_headers,
    is_modern,
    modern_routing_headers,
    routing_changed,
    upstream_request_headers,
)
from proxy.mcp.wire.jsonrpc import (
    InvalidBody,
    StaleWireBytes,
    WireMessage,
    dumps,
    id_key,
    kind_of,
    parse_body,
    progress_token,
    read_upstream_message,
    wire_bytes,
)
from proxy.mcp.wire.sse import SseParser, format_comment, format_event
from proxy.runtime.client_gone import ClientGone, Trip, cancelled_when


def _code(raw: bytes) -> tuple[int, str, int]:
    with pytest.raises(InvalidBody) as caught:
        parse_body(raw)
    answer = caught.value.answer
    return answer.code, answer.data["reason"], answer.http_status


# --- JSON-RPC bodies ---


def test_single_request_notification_and_response_are_classified():
    """A request, a notification and a response each parse to a one-message body of their kind."""
    request = parse_body(b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}')
    note = parse_body(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    response = parse_body(b'{"jsonrpc":"2.0","id":"e1","result":{"action":"accept"}}')
    assert (request.batch, request.single.kind, request.single.id) == (False, "request", 1)
    assert note.single.kind == "notification"
    assert note.single.id is None
    assert response.single.kind == "response"


def test_malformed_json_is_a_parse_error():
    """Bytes that are not JSON (or not UTF-8) are -32700 with HTTP 400."""
    assert _code(b'{"jsonrpc": "2.0", "id": 1,') == (CODE_PARSE_ERROR, "parse_error", 400)
    assert _code(b"\xff\xfe") == (CODE_PARSE_ERROR, "parse_error", 400)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'"hello"', "not_an_object"),
        (b'{"id": 1, "method": "ping"}', "bad_jsonrpc_version"),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}', "bad_jsonrpc_version"),
        (b'{"jsonrpc": "2.0", "id": 1, "method": ""}', "bad_method"),
        (b'{"jsonrpc": "2.0", "id": 1, "method": 7}', "bad_method"),
        (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', "bad_id"),
        (b'{"jsonrpc": "2.0", "id": null, "method": "ping"}', "bad_id"),
        (b'{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}', "bad_id"),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]}', "bad_params"),
        (b'{"jsonrpc": "2.0", "id": 1, "result": {}, "error": {}}', "not_jsonrpc"),
        (b'{"jsonrpc": "2.0", "id": 1, "error": {"message": "x"}}', "bad_error"),
        (b'{"jsonrpc": "2.0", "result": {}}', "not_jsonrpc"),
        (b"[]", "empty_batch"),
    ],
)
def test_json_that_is_not_jsonrpc_is_an_invalid_request(raw: bytes, reason: str):
    """Each way of being valid JSON but not a JSON-RPC 2.0 message gets -32600 and its reason."""
    assert _code(raw) == (CODE_INVALID_REQUEST, reason, 400)


def test_batch_answers_invalid_elements_individually():
    """A batch keeps its valid elements and turns each invalid one into its own error response."""
    body = parse_body(
        b'[{"jsonrpc":"2.0","id":1,"method":"ping"},'
        b'{"jsonrpc":"2.0","id":2,"method":""},'
        b'{"jsonrpc":"2.0","method":"notifications/x"}, 5]'
    )
    assert body.batch
    assert [m.kind for m in body.messages] == ["request", "notification"]
    assert [(e["id"], e["error"]["code"]) for e in body.errors] == [
        (2, CODE_INVALID_REQUEST),
        (None, CODE_INVALID_REQUEST),
    ]


def test_batch_of_only_invalid_elements_is_rejected_whole():
    """A batch with no valid element at all is one -32600 answer."""
    assert _code(b'[1, {"jsonrpc": "2.0"}]')[0] == CODE_INVALID_REQUEST


def test_message_accessors_tolerate_missing_params():
    """params and _meta read as empty objects when absent; the id keeps its JSON type."""
    message = parse_body(b'{"jsonrpc":"2.0","id":"7","method":"ping"}').single
    assert (message.params, message.meta, message.id, message.method) == ({}, {}, "7", "ping")


def test_upstream_messages_are_read_leniently():
    """Upstream lines that are not JSON-RPC messages read as None instead of raising."""
    assert read_upstream_message(b"not json") is None
    assert read_upstream_message(b"[1,2]") is None
    assert read_upstream_message(b'{"hello": 1}') is None
    message = read_upstream_message('{"jsonrpc":"2.0","id":3,"result":{}}')
    assert message == {"jsonrpc": "2.0", "id": 3, "result": {}}
    assert kind_of(message) == "response"


def test_kind_of_and_progress_token():
    """Kinds come from the members; the progress token is read from a request's _meta or a note."""
    request = {"jsonrpc": "2.0", "id": 1, "method": "x", "params": {"_meta": {"progressToken": 9}}}
    note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "a"}}
    assert (kind_of(request), kind_of(note), kind_of({"id": 1})) == (
        "request",
        "notification",
        None,
    )
    assert (progress_token(request), progress_token(note)) == (9, "a")
    assert progress_token({"params": {"_meta": {"progressToken": True}}}) is None


def test_id_keys_keep_numbers_and_strings_apart():
    """The id 1 and the id "1" are different requests."""
    assert id_key(1) != id_key("1")
    assert id_key(1) == id_key(1)


def test_unchanged_wire_message_keeps_its_exact_bytes():
    """An unchanged WireMessage is written as the bytes it came as, spacing and escapes included."""
    raw = b'{"jsonrpc": "2.0", "id": 1, "result": {"text": "caf\\u00e9"}}'
    message = read_upstream_message(raw)
    assert message is not None
    assert wire_bytes(message) == raw


def test_a_wire_message_cannot_be_edited_and_a_changed_copy_is_encoded():
    """A WireMessage refuses every change to its members (its bytes would go stale); a new dict
    made from it is what a change looks like, and that is encoded afresh."""
    message = read_upstream_message(b'{"jsonrpc":"2.0","id":1,"result":{"n":1}}')
    assert message is not None
    edits = [
        lambda m: m.__setitem__("id", 2),
        lambda m: m.__delitem__("id"),
        lambda m: m.pop("id"),
        lambda m: m.popitem(),
        lambda m: m.clear(),
        lambda m: m.update(id=2),
        lambda m: m.setdefault("error", {}),
        lambda m: m.__ior__({"id": 2}),
    ]
    for edit in edits:
        with pytest.raises(TypeError, match="build a new dict"):
            edit(message)
    assert message == {"jsonrpc": "2.0", "id": 1, "result": {"n": 1}}
    changed = {**message, "id": "a"}
    assert wire_bytes(changed) == b'{"jsonrpc":"2.0","id":"a","result":{"n":1}}'
    assert wire_bytes({"a": "é"}) == dumps({"a": "é"}) == '{"a":"é"}'.encode()


def test_a_wire_message_edited_deep_inside_fails_the_check(monkeypatch: pytest.MonkeyPatch):
    """A nested value edited in place cannot be refused, and production does not re-read the
    bytes to notice: under `INTERLOCK_CHECK_WIRE=1` (the test suite's setting) sending it fails
    loudly instead of sending the stale bytes."""
    monkeypatch.setattr(jsonrpc, "_CHECK_WIRE", True)
    message = read_upstream_message(b'{"id":1,"result":{"content":[{"text":"a"}]}}')
    assert message is not None
    assert wire_bytes(message) == b'{"id":1,"result":{"content":[{"text":"a"}]}}'
    message["result"]["content"][0]["text"] = "b"
    with pytest.raises(StaleWireBytes):
        wire_bytes(message)
    monkeypatch.setattr(jsonrpc, "_CHECK_WIRE", False)
    assert wire_bytes(message) == message.raw  # production: not parsed again


def test_a_single_client_message_keeps_its_bytes_and_a_batchs_do_not():
    """A one-message body is a WireMessage of the body's bytes (they go upstream as they are when
    nothing changes the message); a batch's messages have no bytes of their own."""
    raw = b' {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}\n'
    body = parse_body(raw).single.body
    assert isinstance(body, WireMessage)
    assert body.raw == raw
    batch = parse_body(b'[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"b"}]')
    assert not any(isinstance(m.body, WireMessage) for m in batch.messages)
    with pytest.raises(InvalidBody):
        parse_body(b"7")


def test_a_minted_value_is_put_back_only_where_the_bytes_are_unambiguous():
    """`restore` replaces the minted id when it occurs exactly once; echoed (twice) or written
    with escapes (not found), it answers None so the message is encoded afresh."""
    minted, mine = "interlock-ab12-3", 7
    once = b'{"result":{"ok":1},"id":"interlock-ab12-3"}'
    assert restore(once, minted, mine) == b'{"result":{"ok":1},"id":7}'
    assert restore(b'{"result":"interlock-ab12-3","id":"interlock-ab12-3"}', minted, mine) is None
    assert restore(b'{"id":"\\u0069nterlock-ab12-3"}', minted, mine) is None
    assert restore(once, mine, mine) is once  # nothing was minted


# --- SSE ---


def _stream() -> bytes:
    return (
        b": ping\r\n\r\n"
        b"id: 0\r\ndata: \r\n\r\n"
        b'event: message\ndata: {"a":1}\n\n'
        b"event: message\rdata: line1\rdata: line2\rretry: 500\r\r"
        b'event: message\r\ndata: {"id":2}\r\n: inside\r\n\r\n'
    )


def test_sse_parser_reads_all_line_ending_styles_and_comments():
    """CRLF, LF and CR streams, comments, priming events and multi-line data all parse."""
    events = SseParser().feed(_stream())
    assert [e.comment for e in events] == [True, False, False, False, False]
    assert events[1].id == "0"
    assert events[1].data == ""
    assert events[2].data == '{"a":1}'
    assert (events[3].data, events[3].retry) == ("line1\nline2", 500)
    assert events[4].data == '{"id":2}'
    assert events[4].raw.endswith(b": inside\r\n\r\n")


@given(st.lists(st.integers(min_value=0, max_value=len(_stream())), max_size=12))
def test_sse_parser_result_does_not_depend_on_chunking(cuts: list[int]):
    """However the bytes are split into chunks, the same events come out, raw bytes included."""
    data = _stream()
    whole = SseParser().feed(data)
    parser = SseParser()
    pieces: list = []
    bounds = [0, *sorted(cuts), len(data)]
    for start, end in itertools.pairwise(bounds):
        pieces += parser.feed(data[start:end])
    assert pieces == whole


def test_sse_parser_looks_at_each_byte_of_a_long_event_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A multi-megabyte event arriving in small chunks is scanned for line ends in linear
    work: re-scanning the unfinished line on every chunk made an 8 MB answer cost seconds of
    the event loop (quadratic in its size)."""
    import proxy.mcp.wire.sse as sse_module

    scanned = 0
    real = sse_module._LINE_END

    class Counting:
        def search(self, data: bytes, pos: int = 0) -> object:
            nonlocal scanned
            found = real.search(data, pos)
            scanned += (found.end() if found else len(data)) - pos
            return found

    monkeypatch.setattr(sse_module, "_LINE_END", Counting())
    size = 4 * 1024 * 1024
    stream = b"event: message\r\ndata: " + b"x" * size + b"\r\n\r\n"
    parser = SseParser()
    events = [e for i in range(0, len(stream), 4096) for e in parser.feed(stream[i : i + 4096])]
    (event,) = events
    assert len(event.data) == size
    assert event.raw == stream
    assert scanned <= 2 * len(stream)


def test_sse_parser_bounds_an_event_that_never_ends():
    """A stream that never ends its event raises instead of buffering without limit."""
    parser = SseParser(max_event_bytes=64)
    with pytest.raises(ValueError):
        parser.feed(b"data: " + b"x" * 100)


def test_format_event_round_trips_through_the_parser():
    """A formatted event (multi-line data included) parses back to the same data."""
    data = b'{"jsonrpc":"2.0"}\n{"second": true}'
    (event,) = SseParser().feed(format_event(data, event_id="7"))
    assert (event.data.encode(), event.id, event.event) == (data, "7", "message")
    (comment,) = SseParser().feed(format_comment())
    assert comment.comment


# --- headers ---


CLIENT_HEADERS = {
    "Host": "proxy:8787",
    "Origin": "http://evil.example",
    "Cookie": "a=b",
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "Accept-Encoding": "gzip",
    "Mcp-Session-Id": "s1",
    "MCP-Protocol-Version": "2025-11-25",
    "Mcp-Param-Region": "eu",
    "Authorization": "Bearer client",
    "X-Interlock-Tenant": "t1",
    "Idempotency-Key": "k1",
    "Connection": "keep-alive",
    "Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
}


def test_only_allowed_headers_go_upstream():
    """Host, Origin, cookies, hop-by-hop, trace and the proxy's own headers never go upstream."""
    headers = upstream_request_headers(CLIENT_HEADERS, {})
    assert set(headers) == {
        "accept",
        "content-type",
        "accept-encoding",
        "mcp-session-id",
        "mcp-protocol-version",
        "mcp-param-region",
        "authorization",
    }
    assert headers["accept-encoding"] == "identity"


def test_configured_headers_win_and_authorization_can_be_withheld():
    """Configured upstream headers override the client's; Authorization may be withheld."""
    headers = upstream_request_headers(
        CLIENT_HEADERS, {"Authorization": "Bearer upstream"}, forward_authorization=False
    )
    assert headers["authorization"] == "Bearer upstream"
    assert "authorization" not in upstream_request_headers(
        CLIENT_HEADERS, {}, forward_authorization=False
    )


def test_response_headers_drop_length_and_encoding():
    """The client gets the MCP and retry headers, never a stale length or encoding."""
    upstream = {
        "Content-Type": "text/event-stream",
        "Content-Length": "12",
        "Content-Encoding": "gzip",
        "Mcp-Session-Id": "s1",
        "Retry-After": "2",
        "Set-Cookie": "x=y",
        "Transfer-Encoding": "chunked",
    }
    assert set(client_response_headers(upstream)) == {
        "Content-Type",
        "Mcp-Session-Id",
        "Retry-After",
    }
    assert "Content-Encoding" in client_response_headers(upstream, keep_encoding=True)


def test_era_follows_the_version_header():
    """Handshake-era versions and no header are not modern; 2026-07-28 and unknown ones are."""
    assert not is_modern(None)
    assert not is_modern("2025-06-18")
    assert is_modern("2026-07-28")
    assert is_modern("2099-01-01")


def _call(name: str, arguments: dict) -> dict:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


def test_modern_headers_follow_a_changed_message():
    """A renamed tool updates Mcp-Name (base64 when not plain ASCII); unchanged args keep params."""
    headers = {"mcp-method": "tools/call", "mcp-name": "old", "mcp-param-region": "eu"}
    original = _call("old", {"region": "eu"})
    changed = _call("café", {"region": "eu"})
    out = modern_routing_headers(headers, original, changed, None)
    assert out["mcp-name"].startswith("=?base64?")
    assert out["mcp-param-region"] == "eu"


def test_modern_param_headers_are_rebuilt_when_arguments_change():
    """Changed arguments rebuild Mcp-Param-* from the schema map, or drop them without one."""
    headers = {"mcp-method": "tools/call", "mcp-name": "t", "mcp-param-region": "eu"}
    original = _call("t", {"region": "eu"})
    changed = _call("t", {"region": "us"})
    rebuilt = modern_routing_headers(headers, original, changed, {("region",): "Region"})
    assert rebuilt["mcp-param-region"] == "us"
    dropped = modern_routing_headers(headers, original, changed, None)
    assert "mcp-param-region" not in dropped


# --- what the transport learns from tools/list ---


def _app() -> web.Application:
    app = web.Application()
    app[CATALOG] = ToolCatalog()
    return app


def test_paginated_tool_listings_add_up():
    """Each page of tools/list adds its tools' annotations; a later page forgets nothing."""
    app = _app()
    first = {
        "tools": [
            {"name": "search", "annotations": {"readOnlyHint": True}},
            {"name": "plain", "inputSchema": {"type": "object"}},
        ],
        "nextCursor": "2",
    }
    second = {"tools": [{"name": "send", "annotations": {"destructiveHint": True}}, "junk"]}
    assert learn_tools(app, "up", first) == 2
    assert learn_tools(app, "up", second) == 1
    assert app[CATALOG].annotations["up"] == {
        "search": {"readOnlyHint": True},
        "plain": {},
        "send": {"destructiveHint": True},
    }
    assert learn_tools(app, "up", {"tools": "not a list"}) == 0


def test_header_mirrored_arguments_are_learned_from_schemas():
    """A schema's x-mcp-header properties are remembered for rebuilding Mcp-Param-* headers."""
    app = _app()
    schema = {
        "type": "object",
        "properties": {"region": {"type": "string", "x-mcp-header": "Region"}, "q": {}},
    }
    learn_tools(app, "up", {"tools": [{"name": "find", "inputSchema": schema}]})
    assert app[CATALOG].param_headers["up"]["find"] == {("region",): "Region"}


def test_a_listed_schema_nested_deeper_than_the_stack_is_learned() -> None:
    """An upstream's schema nested 900 levels deep (the JSON reader takes about a thousand) is
    learned as mirroring nothing, not a RecursionError out of reading its listing."""
    app = _app()
    deep: dict[str, object] = {"type": "string"}
    for _ in range(900):
        deep = {"type": "object", "default": deep}
    assert learn_tools(app, "up", {"tools": [{"name": "deep", "inputSchema": deep}]}) == 1
    assert "deep" not in app[CATALOG].param_headers.get("up", {})


# --- cancelling a wait when the client goes away ---


async def test_client_gone_cancels_the_waiting_task_and_is_absorbed():
    """Setting ClientGone cancels the wait inside cancelled_when; absorb() turns it into ours."""
    gone = ClientGone()
    loop = asyncio.get_running_loop()
    loop.call_soon(gone.set)
    with pytest.raises(asyncio.CancelledError), cancelled_when(gone) as trip:
        await asyncio.Event().wait()
    assert trip is not None
    assert trip.fired
    assert trip.absorb()


async def test_a_real_cancellation_is_not_absorbed():
    """A cancellation from elsewhere passes through: nothing fired, nothing absorbed."""
    gone = ClientGone()

    async def wait() -> Trip | None:
        with cancelled_when(gone) as trip:
            await asyncio.Event().wait()
        return trip  # pragma: no cover

    task = asyncio.create_task(wait())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gone.set()  # after the block: the callback was removed, nothing is cancelled any more


async def test_a_plain_event_works_too():
    """cancelled_when also accepts a plain asyncio.Event (one helper task watches it)."""
    gone = asyncio.Event()
    asyncio.get_running_loop().call_soon(gone.set)
    with pytest.raises(asyncio.CancelledError), cancelled_when(gone) as trip:
        await asyncio.Event().wait()
    assert trip is not None
    assert trip.absorb()


def test_the_transport_names_agree_with_the_sdk() -> None:
    """The header names and handshake-era versions the proxy keeps are the MCP SDK's own."""
    from mcp.shared import inbound
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    from proxy.mcp.wire import headers

    assert headers.MCP_PROTOCOL_VERSION_HEADER == inbound.MCP_PROTOCOL_VERSION_HEADER
    assert headers.MCP_METHOD_HEADER == inbound.MCP_METHOD_HEADER
    assert headers.MCP_NAME_HEADER == inbound.MCP_NAME_HEADER
    assert headers.MCP_PARAM_HEADER_PREFIX == inbound.MCP_PARAM_HEADER_PREFIX
    assert tuple(headers.HANDSHAKE_PROTOCOL_VERSIONS) == tuple(HANDSHAKE_PROTOCOL_VERSIONS)


@pytest.mark.parametrize(
    "packages",
    [
        ("mcp", "mcp_types"),  # the MCP SDK costs ~30 MB of memory
        ("rich",),  # the ledger commands' tables load it when they print one
    ],
)
def test_serving_needs_no_import_of(packages: tuple[str, ...]) -> None:
    """`interlock serve`'s modules load without these packages."""
    import subprocess
    import sys

    program = (
        "import sys, proxy.ops.cli, proxy.app; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {packages!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_modern_headers_stay_the_clients_when_only_meta_changed():
    """The trace context the proxy adds to `_meta` is in no header: the client's routing headers
    go on as they came (a changed argument beside it still rebuilds them)."""
    headers = {"mcp-method": "tools/call", "mcp-name": "t", "mcp-param-region": "eu"}
    original = _call("t", {"region": "eu"})
    traced = _call("t", {"region": "eu"})
    traced["params"]["_meta"] = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    assert not routing_changed(original, traced)
    assert modern_routing_headers(headers, original, traced, None) == headers
    traced["params"]["arguments"] = {"region": "us"}
    assert routing_changed(original, traced)
    rebuilt = modern_routing_headers(headers, original, traced, {("region",): "Region"})
    assert rebuilt["mcp-param-region"] == "us"

"""Unit tests of the pure forwarding helpers: target URL safety and header filters."""

from __future__ import annotations

import json

import pytest

from proxy.http.downstream import sse_error_event
from proxy.http.headers import request_headers, response_headers
from proxy.http.outcomes import encode_outcome, replay_response
from proxy.http.paths import UnsafePath, split_route, upstream_target


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/http/openai/v1/chat/completions", ("openai", "v1/chat/completions")),
        ("/http/openai/v1/models?limit=2", ("openai", "v1/models")),
        ("/http/openai/", ("openai", "")),
        ("/http/openai", ("openai", "")),
        ("/http/my%20api/x", ("my api", "x")),
    ],
)
def test_split_route(raw: str, expected: tuple[str, str]) -> None:
    """The upstream name and the raw tail are taken from the raw path."""
    assert split_route(raw) == expected


@pytest.mark.parametrize("raw", ["/mcp/x", "/http/", "/http//v1/x"])
def test_split_route_rejects_paths_without_upstream(raw: str) -> None:
    """A path that names no upstream is refused."""
    with pytest.raises(UnsafePath):
        split_route(raw)


@pytest.mark.parametrize(
    ("base", "tail", "query", "expected"),
    [
        (
            "http://127.0.0.1:9000",
            "v1/chat/completions",
            "",
            "http://127.0.0.1:9000/v1/chat/completions",
        ),
        (
            "http://127.0.0.1:9000/v1",
            "chat/completions",
            "",
            "http://127.0.0.1:9000/v1/chat/completions",
        ),
        (
            "http://127.0.0.1:9000/v1/",
            "models",
            "limit=2&x=%20",
            "http://127.0.0.1:9000/v1/models?limit=2&x=%20",
        ),
        ("http://127.0.0.1:9000", "files/a%20b.txt", "", "http://127.0.0.1:9000/files/a%20b.txt"),
        ("http://127.0.0.1:9000/api", "", "", "http://127.0.0.1:9000/api/"),
        ("http://127.0.0.1:9000", "v1/models/", "", "http://127.0.0.1:9000/v1/models/"),
    ],
)
def test_upstream_url_joins_base_and_path(base: str, tail: str, query: str, expected: str) -> None:
    """The target is the base URL, then '/', then the caller's path and query."""
    assert str(upstream_target(base, tail, query).url) == expected


@pytest.mark.parametrize(
    ("base", "tail", "sent", "path"),
    [
        ("http://127.0.0.1:9000", "s%65nd-mail", "/send-mail", "/send-mail"),
        ("http://127.0.0.1:9000/v1", "chat/completion%73", "/v1/chat/completions", None),
        ("http://127.0.0.1:9000", "files/a%20b.txt", "/files/a%20b.txt", "/files/a b.txt"),
        ("http://127.0.0.1:9000", "x%3Fy=1", "/x%3Fy=1", "/x?y=1"),
        ("http://127.0.0.1:9000", "caf%C3%A9", "/caf%C3%A9", "/café"),
        ("http://127.0.0.1:9000", "café", "/caf%C3%A9", "/café"),
        ("http://127.0.0.1:9000", "x/a:b@c;d=e", "/x/a:b@c;d=e", "/x/a:b@c;d=e"),
        ("http://127.0.0.1:9000/api%20v2/", "x", "/api%20v2/x", "/api v2/x"),
        ("http://127.0.0.1:9000", "", "/", "/"),
    ],
)
def test_the_upstream_is_sent_the_path_that_was_classified(
    base: str, tail: str, sent: str, path: str | None
) -> None:
    """The path is decoded once and re-encoded canonically: the upstream decodes what was sent
    into exactly the path rules and classification were given."""
    target = upstream_target(base, tail)
    assert target.url.raw_path == sent
    assert target.path == (sent if path is None else path)
    assert target.url.path == target.path


@pytest.mark.parametrize(
    "tail",
    [
        "../secret",
        "v1/../../admin",
        "v1/./x",
        "v1/%2e%2e/admin",
        "v1/%2E%2E/admin",
        "v1/.%2e/admin",
        "v1/%252e%252e/admin",
        "v1/a%2fb",
        "v1/a%2Fb",
        "v1/a%5cb",
        "v1/a\\b",
        "/evil.example/x",
        "v1//evil.example",
        "http://evil.example/x",
        "https:/evil.example",
        "a:b/c",
        "v1/a%00b",
        "v1/a%0d%0aX-Injected:%201",
        "s%2565nd-mail",
        "v1/%252f",
        "v1/a%zzb",
        "v1/a%2",
        "v1/%ff",
        "v1/%C3",
    ],
)
def test_upstream_url_rejects_escapes(tail: str) -> None:
    """Dot segments, encoded slashes, absolute URLs, '//', control characters, double encoding,
    broken escapes and non-UTF-8 bytes are refused."""
    with pytest.raises(UnsafePath):
        upstream_target("http://127.0.0.1:9000/v1", tail)


def test_upstream_url_never_changes_host() -> None:
    """Whatever the tail, an accepted target has the base URL's scheme, host and port."""
    for tail in ["a@evil.example/x", "v1/a:b", "%40evil", "x%3Fy=1"]:
        url = upstream_target("http://127.0.0.1:9000/v1", tail).url
        assert (url.scheme, url.host, url.port) == ("http", "127.0.0.1", 9000)
        assert url.raw_path.startswith("/v1/")


def test_request_headers_drop_hop_by_hop_and_control_headers() -> None:
    """Hop-by-hop, Host, Content-Length and X-Interlock-* headers never reach the upstream."""
    incoming = [
        ("Host", "127.0.0.1:8787"),
        ("Connection", "keep-alive, X-Secret-Hop"),
        ("X-Secret-Hop", "1"),
        ("Keep-Alive", "timeout=5"),
        ("Transfer-Encoding", "chunked"),
        ("TE", "trailers"),
        ("Content-Length", "12"),
        ("Content-Type", "application/json"),
        ("X-Interlock-Tenant", "acme"),
        ("Idempotency-Key", "k1"),
        ("Accept", "text/event-stream"),
    ]
    out = request_headers(incoming, {})
    assert sorted(out.keys()) == ["Accept", "Content-Type", "Idempotency-Key"]


def test_request_headers_inject_configured_credentials() -> None:
    """Configured headers replace the caller's (e.g. a dummy API key) whatever their case."""
    out = request_headers(
        [("authorization", "Bearer sk-dummy"), ("X-Api-Key", "dummy")],
        {"Authorization": "Bearer sk-real", "x-api-key": "real"},
    )
    assert out.getall("Authorization") == ["Bearer sk-real"]
    assert out.getall("X-API-KEY") == ["real"]


def test_request_headers_drop_the_callers_tenant_key() -> None:
    """With tenant API keys configured, the caller's key never reaches the upstream, even when
    the upstream's own credential goes in another header."""
    caller = [("Authorization", "Bearer tenant-key"), ("Cookie", "s=1"), ("Accept", "*/*")]
    out = request_headers(caller, {"x-api-key": "real"}, drop_credentials=True)
    assert "Authorization" not in out
    assert "Cookie" not in out
    assert out["x-api-key"] == "real"
    assert out["Accept"] == "*/*"


def test_request_headers_identity_encoding() -> None:
    """When the proxy must read the body, the upstream is asked not to compress it."""
    out = request_headers([("Accept-Encoding", "gzip, br")], {}, identity_encoding=True)
    assert out.getall("Accept-Encoding") == ["identity"]


def test_response_headers_keep_end_to_end_ones() -> None:
    """Content-Encoding and the rate-limit headers pass; hop-by-hop headers do not."""
    out = response_headers(
        [
            ("Content-Type", "application/json"),
            ("Content-Encoding", "gzip"),
            ("Transfer-Encoding", "chunked"),
            ("Connection", "close"),
            ("x-ratelimit-remaining-requests", "9"),
            ("Set-Cookie", "a=1"),
            ("Set-Cookie", "b=2"),
        ]
    )
    assert out.getall("Set-Cookie") == ["a=1", "b=2"]
    assert "Transfer-Encoding" not in out
    assert "Connection" not in out
    assert out["Content-Encoding"] == "gzip"


def test_sse_error_event_is_one_event() -> None:
    """The error event carries the envelope and ends with a blank line."""
    raw = sse_error_event({"error": {"message": "m"}})
    head, data = raw.decode().rstrip("\n").split("\n")
    assert head == "event: error"
    assert json.loads(data.removeprefix("data: ")) == {"type": "error", "error": {"message": "m"}}
    assert raw.endswith(b"\n\n")


def test_outcome_round_trip_is_byte_identical() -> None:
    """A stored outcome replays the same status, body bytes and replayable headers."""
    body = b'{"id": "act_1",  "n": 1}\n'  # odd spacing: bytes, not re-serialised JSON
    stored = encode_outcome(
        201,
        [
            ("Content-Type", "application/json"),
            ("Content-Encoding", "identity"),
            ("Location", "/v1/actions/act_1"),
            ("Date", "Mon, 01 Jan 2024 00:00:00 GMT"),
            ("Content-Length", "24"),
            ("Set-Cookie", "session=secret"),
            ("x-ratelimit-remaining-requests", "3"),
            ("Transfer-Encoding", "chunked"),
        ],
        body,
    )
    assert b"secret" not in stored
    response = replay_response(stored)
    assert response.status == 201
    assert response.body == body
    assert response.headers["Idempotent-Replayed"] == "true"
    assert response.headers["Location"] == "/v1/actions/act_1"
    assert response.headers["Content-Type"] == "application/json"
    for dropped in ("Date", "Set-Cookie", "x-ratelimit-remaining-requests", "Transfer-Encoding"):
        assert dropped not in response.headers

"""The upstream client's response heads, parsed without a network (`proxy.runtime.http1.head`)."""

from __future__ import annotations

import pytest

from proxy.runtime.http1.head import BadAnswer, Framing, parse_response_head


def test_header_values_keep_every_byte_and_lose_only_the_surrounding_blanks() -> None:
    """A value reads as UTF-8; bytes that are not UTF-8 are kept as they came (surrogate escapes,
    so they go back out unchanged); spaces and tabs around it are dropped, inside it kept."""
    head = parse_response_head(
        b"HTTP/1.1 200 OK\r\nX-Name: \t caf\xc3\xa9 au lait \t\r\nX-Raw: a\xffb\r\n"
        b"Content-Length: 3",
        method="POST",
    )
    assert head.headers["x-name"] == "café au lait"
    assert head.headers["X-RAW"] == "a\udcffb"
    assert head.headers["X-Raw"].encode("utf-8", "surrogateescape") == b"a\xffb"
    assert (head.status, head.reason, head.framing, head.length) == (200, "OK", Framing.LENGTH, 3)
    assert list(head.headers) == ["X-Name", "X-Raw", "Content-Length"]


@pytest.mark.parametrize(
    "line",
    [b"X-\xff: 1", b"X-\xc3\xa9: 1", b"X A: 1", b" X-A: 1", b"X-A 1", b"X-A : 1"],
    ids=["latin-1-name", "utf-8-name", "space-in-name", "folded", "no-colon", "space-before-colon"],
)
def test_a_header_line_whose_name_is_not_a_token_is_refused(line: bytes) -> None:
    with pytest.raises(BadAnswer):
        parse_response_head(b"HTTP/1.1 200 OK\r\n" + line + b"\r\nContent-Length: 0", method="GET")

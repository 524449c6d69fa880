"""HTTP/1.1 message heads for the upstream client (pure: bytes in, values out).

`request_head` writes a request's head; `parse_response_head` reads a response's head and decides
how its body is framed (RFC 9112 section 6.3). Anything ambiguous is refused with `BadAnswer`
rather than guessed: a proxy that guesses where one answer ends is how responses get mixed up
between callers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from multidict import CIMultiDict, CIMultiDictProxy

from policies.header_syntax import breaks_header_line, is_header_name

__all__ = [
    "MAX_HEAD_BYTES",
    "BadAnswer",
    "BadRequestHead",
    "Framing",
    "ResponseHead",
    "keep_alive_s",
    "parse_response_head",
    "request_head",
]

MAX_HEAD_BYTES = 64 * 1024
"""A response head larger than this is refused (aiohttp's parser allows about the same)."""

_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: ([^\r\n]*))?")
_DIGITS = re.compile(r"[0-9]+")


class BadAnswer(Exception):
    """The upstream's answer is not well-formed HTTP/1.1 (its head, or its body's framing)."""


class BadRequestHead(ValueError):
    """A header we were asked to send would break the request's framing (CR, LF or NUL)."""


class Framing(Enum):
    """How the body of a response ends."""

    NONE = "none"  # HEAD, 1xx, 204, 304: no body at all
    LENGTH = "length"  # Content-Length bytes
    CHUNKED = "chunked"  # Transfer-Encoding: chunked
    CLOSE = "close"  # until the upstream closes the connection


@dataclass(frozen=True, slots=True)
class ResponseHead:
    status: int
    reason: str
    headers: CIMultiDictProxy[str]
    framing: Framing
    length: int  # bytes of body for LENGTH, else 0
    keep_alive: bool  # the connection may carry another request after this answer


def request_head(
    method: str, target: str, host: str, headers: Iterable[tuple[str, str]], framing: str | None
) -> bytes:
    """The head of a request: `framing` is a Content-Length value, "chunked", or None (no body).

    `Host`, `Content-Length` and `Transfer-Encoding` are ours to write; the caller's are dropped.

    Raises:
        BadRequestHead: a header name or value could end the head early or split it.
    """
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    for name, value in headers:
        lower = name.lower()
        if lower in ("host", "content-length", "transfer-encoding"):
            continue
        if breaks_header_line(value) or not is_header_name(name):
            raise BadRequestHead(f"header {name!r} cannot be sent as it is")
        lines.append(f"{name}: {value}")
    if framing == "chunked":
        lines.append("Transfer-Encoding: chunked")
    elif framing is not None:
        lines.append(f"Content-Length: {framing}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


def parse_response_head(head: bytes, *, method: str) -> ResponseHead:
    """Parse a response head (without the blank line that ends it) to the request `method`.

    Raises:
        BadAnswer: not HTTP/1.x, a malformed header line, or body framing that is ambiguous
            (Content-Length values that disagree or are not numbers).
    """
    status_line, _, rest = head.partition(b"\r\n")
    matched = _STATUS_LINE.fullmatch(status_line)
    if matched is None:
        raise BadAnswer("the answer does not start with an HTTP/1.x status line")
    minor, status = matched.group(1), int(matched.group(2))
    reason = (matched.group(3) or b"").decode("latin-1")
    pairs: list[tuple[str, str]] = []
    if rest:
        # Decoded once: a name must be a token (ASCII), so it reads the same in any decoding,
        # and a value's bytes that are not UTF-8 are kept as they came (surrogateescape).
        for line in rest.decode("utf-8", "surrogateescape").split("\r\n"):
            name, colon, value = line.partition(":")
            if not colon or not is_header_name(name):
                # includes obsolete line folding (a line starting with whitespace), which RFC
                # 9112 lets a client refuse, and whitespace before the colon, which it must
                raise BadAnswer("a malformed header line in the answer")
            pairs.append((name, value.strip(" \t")))
    headers = CIMultiDictProxy(CIMultiDict(pairs))
    connection = {t.strip().lower() for v in headers.getall("Connection", ()) for t in v.split(",")}
    keep_alive = "close" not in connection and (minor == b"1" or "keep-alive" in connection)
    framing, length = _framing(status, method, headers)
    if framing is Framing.CLOSE:
        keep_alive = False
    return ResponseHead(status, reason, headers, framing, length, keep_alive)


def _framing(status: int, method: str, headers: CIMultiDictProxy[str]) -> tuple[Framing, int]:
    if method == "HEAD" or status < 200 or status in (204, 304):
        return Framing.NONE, 0
    codings = [
        t.strip().lower() for v in headers.getall("Transfer-Encoding", ()) for t in v.split(",")
    ]
    if codings:
        # chunked last frames the body; any other coding last means "until close"
        return (Framing.CHUNKED, 0) if codings[-1] == "chunked" else (Framing.CLOSE, 0)
    lengths = {
        v.strip() for value in headers.getall("Content-Length", ()) for v in value.split(",")
    }
    if not lengths:
        return Framing.CLOSE, 0
    if len(lengths) > 1 or not all(_DIGITS.fullmatch(v) for v in lengths):
        raise BadAnswer("the answer's Content-Length is not one number")
    return Framing.LENGTH, int(lengths.pop())


def keep_alive_s(headers: CIMultiDictProxy[str]) -> float | None:
    """The idle time the upstream promises to keep the connection open (`Keep-Alive: timeout=N`)."""
    value = headers.get("Keep-Alive")
    if value is None:
        return None
    for part in value.split(","):
        name, _, number = part.partition("=")
        if name.strip().lower() == "timeout" and _DIGITS.fullmatch(number.strip()):
            return float(number.strip())
    return None

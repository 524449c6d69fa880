"""Which upstream URL a caller's `/http/{upstream}/{path}` names (pure: no I/O).

The caller's path is kept as encoded and appended to the configured base URL; a path that could
leave that base (dot segments, encoded slashes, an absolute URL) raises `UnsafePath`.
"""

from __future__ import annotations

import functools
import re
from urllib.parse import unquote

from yarl import URL

__all__ = ["UnsafePath", "split_route", "upstream_url"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_ESCAPING_CHARS = re.compile(r"[/\\\x00-\x1f\x7f]")


class UnsafePath(ValueError):
    """The path would leave the upstream's base URL (dot segments, encoded slashes, a host)."""


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

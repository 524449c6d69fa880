"""Which upstream URL a caller's `/http/{upstream}/{path}` names, and which path it runs (pure).

The caller's path is decoded once, segment by segment, into the path the upstream will see; that
decoded path is what rules and classification judge, and the request is forwarded with that same
path, re-encoded in one canonical way, so the upstream runs exactly the path that was judged
(`/s%65nd-mail` is sent, classified and ledgered as `/send-mail`). A path that has no single
meaning is refused (`UnsafePath`) before anything is sent: an encoded `/` or `\\`, a dot segment
(also encoded), an escape that still decodes after one decoding (double encoding), a broken
escape or bytes that are not UTF-8, a control character, an empty segment, an absolute URL.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

from yarl import URL

__all__ = ["UnsafePath", "UpstreamTarget", "split_route", "upstream_target"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_BROKEN_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_ENCODED_SEPARATOR = re.compile(r"%(?:2[fF]|5[cC])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# RFC 3986 `pchar` characters kept as they are; everything else is percent-encoded (UTF-8).
_SAFE = "!$&'()*+,;=:@-._~"


class UnsafePath(ValueError):
    """The path has no single meaning or could leave the upstream's base URL."""


@dataclass(frozen=True, slots=True)
class UpstreamTarget:
    """Where a request goes: `url` as sent, and `path`, the decoded path the upstream receives
    (its base URL's path included, no query): what rules, classification and the ledger see."""

    url: URL
    path: str


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


def _decode_segment(segment: str) -> str:
    """One path segment as the upstream will read it (decoded once), if it has one meaning."""
    if "\\" in segment or _ENCODED_SEPARATOR.search(segment):
        raise UnsafePath(f"path segment {segment!r} holds an encoded '/' or a '\\'")
    if _BROKEN_ESCAPE.search(segment):
        raise UnsafePath(f"path segment {segment!r} has a '%' that starts no escape")
    try:
        decoded = unquote(segment, errors="strict")
    except UnicodeDecodeError:
        raise UnsafePath(f"path segment {segment!r} does not decode to UTF-8") from None
    if decoded.split(";", 1)[0] in (".", ".."):
        # `..;x` is a dot segment to servers that strip path parameters (Tomcat, Spring)
        raise UnsafePath(f"path segment {segment!r} is a dot segment")
    if _ESCAPE.search(decoded):
        raise UnsafePath(f"path segment {segment!r} is encoded twice")
    if _CONTROL.search(decoded):
        raise UnsafePath(f"path segment {segment!r} holds a control character")
    return decoded


def upstream_target(base_url: str, raw_tail: str, query_string: str = "") -> UpstreamTarget:
    """The target: the configured base URL, then `/`, then the caller's path (decoded and
    re-encoded canonically), then its query as given.

    Raises:
        UnsafePath: the tail holds an absolute URL, `//`, or a segment without a single meaning
            (see the module docstring).
    """
    return _target(base_url, raw_tail, query_string)


# Callers repeat the same few paths (a model API's `v1/chat/completions`): decide each once.
# A refused path raises every time (lru_cache keeps results, not exceptions).
@functools.lru_cache(maxsize=512)
def _target(base_url: str, raw_tail: str, query_string: str) -> UpstreamTarget:
    if _SCHEME.match(raw_tail) or raw_tail.startswith("/"):
        raise UnsafePath("the path must be relative to the upstream's base URL")
    segments = raw_tail.split("/") if raw_tail else []
    decoded: list[str] = []
    for index, segment in enumerate(segments):
        if segment == "" and index != len(segments) - 1:
            raise UnsafePath("empty path segments ('//') are not allowed")
        decoded.append(_decode_segment(segment) if segment else "")
    origin, raw_prefix, prefix, where = _base(base_url)
    encoded = "/".join(quote(segment, safe=_SAFE) for segment in decoded)
    query = f"?{query_string}" if query_string else ""
    url = URL(f"{origin}{raw_prefix}/{encoded}{query}", encoded=True)
    if (url.scheme, url.host, url.port) != where:
        raise UnsafePath("the target left the upstream's host")  # defence in depth
    return UpstreamTarget(url=url, path=f"{prefix}/{'/'.join(decoded)}")


@functools.lru_cache(maxsize=64)
def _base(base_url: str) -> tuple[str, str, str, tuple[str, str | None, int | None]]:
    """The configured base URL's origin, path prefix (raw and decoded) and (scheme, host, port)."""
    base = URL(base_url)
    where = (base.scheme, base.host, base.port)
    return str(base.origin()), base.raw_path.rstrip("/"), base.path.rstrip("/"), where

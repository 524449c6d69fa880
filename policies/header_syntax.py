"""What can be written into an HTTP/1.1 header line (pure): one definition for the configuration
check and the HTTP client, so what loads is what can be sent."""

from __future__ import annotations

import functools
import re

__all__ = ["breaks_header_line", "is_header_name"]

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP token (RFC 9110 section 5.6.2)


# Asked of every header of every upstream request and answer, where the same few names recur:
# the verdicts are kept (bounded: a peer may send any name, which is then merely matched again).
@functools.lru_cache(maxsize=1024)
def is_header_name(name: str) -> bool:
    return _TOKEN.fullmatch(name) is not None


def breaks_header_line(value: str) -> bool:
    """The value would end its header line early (CR, LF) or is refused by servers (NUL)."""
    return "\r" in value or "\n" in value or "\x00" in value

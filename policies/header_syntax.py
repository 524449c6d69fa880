"""What can be written into an HTTP/1.1 header line (pure): one definition for the configuration
check and the HTTP client, so what loads is what can be sent."""

from __future__ import annotations

import re

__all__ = ["breaks_header_line", "is_header_name"]

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP token (RFC 9110 section 5.6.2)
_LINE_BREAK = re.compile(r"[\r\n\x00]")


def is_header_name(name: str) -> bool:
    return _TOKEN.fullmatch(name) is not None


def breaks_header_line(value: str) -> bool:
    """The value would end its header line early (CR, LF) or is refused by servers (NUL)."""
    return _LINE_BREAK.search(value) is not None

"""What the proxy's logs may carry: never a header value.

aiohttp logs a request it cannot parse with the offending header line quoted in the exception —
a caller's `Authorization` or `x-api-key` included — and a traceback per request. The filter here
rewrites those records to one line naming the problem (e.g. "Invalid header value char") and the
peer, without the line, the value or the traceback.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["MalformedRequestFilter", "install_log_filters"]


def _problem(exc: HttpProcessingError) -> str:
    """The parser's description of what is wrong, without the quoted bytes that follow it."""
    text = str(exc.message or type(exc).__name__)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first.rstrip(": ")


class MalformedRequestFilter(logging.Filter):
    """Rewrites aiohttp's "Error handling request" records for unparsable requests."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg = "refused a malformed HTTP request from %s: %s"
            record.args = (peer, _problem(exc))
            record.levelno = logging.WARNING
            record.levelname = "WARNING"
            record.exc_info = None
            record.exc_text = None
        return True


def install_log_filters() -> None:
    """Attach the filters to the loggers that quote requests (idempotent)."""
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedRequestFilter) for f in server.filters):
        server.addFilter(MalformedRequestFilter())

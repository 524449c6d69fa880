"""The proxy's exception tree for talking to upstreams.

    UpstreamError                  something went wrong reaching or hearing from an upstream
    ├── UpstreamNotReached         nothing was sent: connect refused, DNS, process not started
    ├── UpstreamPressure           the upstream pushed back (HTTP 429/503/529: cooldown)
    ├── UpstreamRefused            another non-2xx status answered before a JSON-RPC reply
    └── UpstreamLost               the request was sent and no complete answer came back
        ├── UpstreamTimeout        ... because the per-attempt timeout passed
        └── UpstreamAnswerTooLarge ... because it was larger than `max_response_bytes`

`UpstreamNotReached` means "certainly not executed", and so does an answered status in the
upstream's not-executed set (`policies.retry.not_executed_statuses`: 429; 503/529 only from a model
provider); only they permit a retry of a side-effecting call. `UpstreamLost`, and any other 5xx
(a gateway's 503 included), make a side-effecting call `unknown`. Transport code maps
`aiohttp.ClientError` / OS errors into these in one place (`raise … from exc`).
"""

from __future__ import annotations

from collections.abc import Mapping

from multidict import CIMultiDict

__all__ = [
    "UpstreamAnswerTooLarge",
    "UpstreamError",
    "UpstreamLost",
    "UpstreamNotReached",
    "UpstreamPressure",
    "UpstreamRefused",
    "UpstreamTimeout",
]


class UpstreamError(Exception):
    """Root of the upstream errors."""


class UpstreamNotReached(UpstreamError):
    """The request never left the proxy (connection refused, no process)."""


class UpstreamPressure(UpstreamError):
    """The upstream answered 429/503/529 (a cooldown); `headers` carry its retry hints. Whether it
    proves "not executed" depends on the upstream (`policies.retry.not_executed_statuses`)."""

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes = b"") -> None:
        super().__init__(f"upstream answered HTTP {status}")
        self.status = status
        self.headers: CIMultiDict[str] = CIMultiDict(headers)  # any spelling finds it
        self.body = body


class UpstreamRefused(UpstreamError):
    """The upstream answered with another non-2xx HTTP status (kept as-is for the client)."""

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes = b"") -> None:
        super().__init__(f"upstream answered HTTP {status}")
        self.status = status
        self.headers: CIMultiDict[str] = CIMultiDict(headers)  # any spelling finds it
        self.body = body


class UpstreamLost(UpstreamError):
    """The request was sent; the answer never arrived whole (connection lost, process died)."""


class UpstreamTimeout(UpstreamLost):
    """The request was sent; the per-attempt timeout passed before the answer."""


class UpstreamAnswerTooLarge(UpstreamLost):
    """The request was sent and answered, but the answer is larger than the proxy holds
    (`max_response_bytes`): the caller cannot have it, and repeating the call would not help."""

    def __init__(self, upstream: str, limit: int) -> None:
        super().__init__(
            f"{upstream}: the answer is larger than max_response_bytes ({limit} bytes)"
        )

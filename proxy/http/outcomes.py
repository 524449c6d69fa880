"""A side-effecting HTTP call's answer in the ledger: stored (`encode_outcome`) and given back
byte-identical to a caller that repeats the call (`replay_response`)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable

from aiohttp import web
from multidict import CIMultiDict

from proxy.http.headers import response_headers

__all__ = ["REPLAYED_HEADER", "encode_outcome", "replay_response"]

# Response headers that describe this one exchange, not the outcome: never stored or replayed.
_NOT_REPLAYED = frozenset(
    {"content-length", "date", "server", "set-cookie", "retry-after", "retry-after-ms"}
)
_NOT_REPLAYED_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")
REPLAYED_HEADER = "Idempotent-Replayed"


def encode_outcome(status: int, headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
    """A side-effecting call's answer as the ledger stores it: status, headers worth replaying,
    and the body bytes exactly as the upstream sent them (base64)."""
    kept = [
        [name, value]
        for name, value in response_headers(headers).items()
        if name.lower() not in _NOT_REPLAYED and not name.lower().startswith(_NOT_REPLAYED_PREFIXES)
    ]
    record = {"v": 1, "status": status, "headers": kept, "body": base64.b64encode(body).decode()}
    return json.dumps(record, separators=(",", ":")).encode()


def replay_response(outcome: bytes) -> web.Response:
    """The stored answer of a finished call, byte-identical, marked `Idempotent-Replayed: true`.

    An entry without a stored outcome is never replayed (the pipeline answers 409
    `outcome_not_retained` instead).
    """
    record = json.loads(outcome)
    headers: CIMultiDict[str] = CIMultiDict((name, value) for name, value in record["headers"])
    headers[REPLAYED_HEADER] = "true"
    return web.Response(
        status=record["status"], headers=headers, body=base64.b64decode(record["body"])
    )

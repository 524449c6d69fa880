"""A side-effecting HTTP call's answer in the ledger: kept as it streams (`KeptBody`, bounded by
`max_outcome_bytes`), stored (`outcome_of`) and given back byte-identical to a caller that repeats
the call (`replay_response`).

An answer too large to keep is relayed whole to the caller but recorded as its body's sha256 and
size only (`OutcomeDigest`); a repeat of its key is then answered `outcome_not_retained`."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable

from aiohttp import web
from multidict import CIMultiDict

from ledger import Outcome, OutcomeDigest
from policies.model import UpstreamSpec
from policies.retry import not_executed_statuses
from proxy.http.headers import response_headers

__all__ = [
    "REPLAYED_HEADER",
    "KeptBody",
    "encode_outcome",
    "not_processed",
    "outcome_of",
    "replay_response",
    "stored_response",
]

# Response headers that describe this one exchange, not the outcome: never stored or replayed.
_NOT_REPLAYED = frozenset(
    {"content-length", "date", "server", "set-cookie", "retry-after", "retry-after-ms"}
)
_NOT_REPLAYED_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")
REPLAYED_HEADER = "Idempotent-Replayed"
# Statuses by which any upstream says it did not process the request: request timeout, too early
# (429, and 503/529 from a model provider, arrive earlier, as pressure).
_NOT_PROCESSED = frozenset({408, 425})


def not_processed(status: int, upstream: UpstreamSpec) -> bool:
    """The upstream answered `status` to say it did not act on the request (408, 425, or one of
    its `not_executed_statuses`): the answer is not the call's outcome and it may be sent again."""
    return status in _NOT_PROCESSED or status in not_executed_statuses(upstream)


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


class KeptBody:
    """An answer's body as the ledger may keep it: whole while it fits in `cap` bytes, hashed
    throughout; past the cap the kept bytes are dropped, so memory stays bounded."""

    __slots__ = ("_cap", "_digest", "_parts", "overflowed", "size")

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._digest = hashlib.sha256()
        self._parts: list[bytes] = []
        self.size = 0
        self.overflowed = False

    def add(self, chunk: bytes) -> None:
        self._digest.update(chunk)
        self.size += len(chunk)
        if self.overflowed:
            return
        if self.size > self._cap:
            self.overflowed = True
            self._parts.clear()
        else:
            self._parts.append(chunk)

    @property
    def body(self) -> bytes | None:
        """The whole body, or None once it outgrew the cap."""
        return None if self.overflowed else b"".join(self._parts)

    def digest(self) -> OutcomeDigest:
        return OutcomeDigest(sha256=self._digest.hexdigest(), size=self.size)


def outcome_of(
    status: int, headers: Iterable[tuple[str, str]], kept: KeptBody, cap: int
) -> Outcome:
    """What the ledger records for an answer: the encoded record, or the body's digest when the
    body (or its encoded record) is larger than `cap`."""
    body = kept.body
    if body is None:
        return kept.digest()
    record = encode_outcome(status, headers, body)
    return record if len(record) <= cap else kept.digest()


def replay_response(outcome: bytes) -> web.Response:
    """The stored answer of a finished call, byte-identical, marked `Idempotent-Replayed: true`.

    An entry without a stored outcome is never replayed (the pipeline answers 409
    `outcome_not_retained` instead).
    """
    return stored_response(outcome, replayed=True)


def stored_response(outcome: bytes, *, replayed: bool) -> web.Response:
    """A recorded answer as it was: status, the headers worth keeping, the body bytes; marked
    `Idempotent-Replayed: true` when it answers a repeat of the call (not a job's own poll)."""
    record = json.loads(outcome)
    headers: CIMultiDict[str] = CIMultiDict((name, value) for name, value in record["headers"])
    if replayed:
        headers[REPLAYED_HEADER] = "true"
    return web.Response(
        status=record["status"], headers=headers, body=base64.b64decode(record["body"])
    )

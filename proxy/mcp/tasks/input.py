"""Deferred tasks waiting for their caller's input (2026-07-28 tasks extension, SEP-2663).

The upstream answered a deferred `tools/call` with `resultType: "input_required"` (its
`inputRequests`, maybe a `requestState`); the ledger keeps that answer as the entry's outcome
while it waits (`ledger.deferred_input`). `tasks/get` shows the `inputRequests`; `tasks/update`
with `inputResponses` rewrites the stored request as the client's own re-send would carry it
(the responses and the upstream's `requestState`) and puts it back in line, to run as the next
attempt.
"""

from __future__ import annotations

import json
from typing import Any

from ledger import EntryView, waits_for_input
from proxy.runtime.deferred_job import decode_envelope, encode_envelope

__all__ = ["answered_request", "input_requests", "waits_for_input"]


def _question(entry: EntryView) -> dict[str, Any]:
    stored = json.loads(entry.outcome or b"{}")
    result = stored.get("result") if isinstance(stored, dict) else None
    return result if isinstance(result, dict) else {}


def input_requests(entry: EntryView) -> dict[str, Any]:
    """The upstream's `inputRequests` the caller must answer."""
    asked = _question(entry).get("inputRequests")
    return asked if isinstance(asked, dict) else {}


def answered_request(entry: EntryView, responses: dict[str, Any]) -> bytes:
    """The stored request with `inputResponses` (and the upstream's `requestState`, if any) in
    its params, as the client's re-send would carry them.

    Raises:
        ValueError: the stored request is not one the proxy can re-send.
    """
    envelope = decode_envelope(entry.request or b"")
    message = envelope.get("message")
    if not isinstance(message, dict) or not isinstance(message.get("params"), dict):
        raise ValueError("the stored request has no params")
    params = {**message["params"], "inputResponses": responses}
    state = _question(entry).get("requestState")
    if isinstance(state, str):
        params["requestState"] = state
    else:
        params.pop("requestState", None)
    fields = {k: v for k, v in envelope.items() if k not in ("v", "kind")}
    fields["message"] = {**message, "params": params}
    return encode_envelope("mcp", fields)

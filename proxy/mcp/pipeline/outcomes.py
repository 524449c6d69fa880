"""How a `tools/call` outcome is stored in the ledger and replayed to a later caller.

The outcome is stored as the upstream answered it, in the revision of the session that made the
call; a replay is converted to the revision of the caller that repeats it: a 2026-07-28 caller
needs `resultType` (its SDK rejects a result without it), a 2025-11-25 one gets neither that nor
the 2026-07-28 `_meta` envelope keys a server adds there."""

from __future__ import annotations

import json
from typing import Any

import orjson

from ledger import EntryView
from proxy.json_codec import encode_default, orjson_default

__all__ = ["REPLAY_META", "decode_replay", "encode_outcome", "outcome_state", "stored_answer"]

REPLAY_META = "interlock/replayed"
JsonObject = dict[str, Any]
_MODERN_ONLY_META = frozenset({"io.modelcontextprotocol/serverInfo"})


def outcome_state(response: JsonObject) -> str:
    """`failed` for a JSON-RPC error or an `isError` tool result, else `succeeded`."""
    if "error" in response:
        return "failed"
    result = response.get("result")
    if isinstance(result, dict) and result.get("isError") is True:
        return "failed"
    return "succeeded"


def encode_outcome(response: JsonObject) -> bytes:
    """The response without its request id, as compact UTF-8 JSON (what a replay answers).

    An answer parsed from the upstream's bytes (`raw`) is written with orjson, ten times faster
    than the standard library on a large tool result (its unparsed tool output, `RawJson`, is
    copied as the upstream's text), unless those bytes hold a NaN or an Infinity (orjson would
    write null) or the value an integer beyond 64 bits (it refuses).
    """
    body = {k: v for k, v in response.items() if k in ("result", "error")}
    raw = getattr(response, "raw", None)
    if isinstance(raw, bytes) and b"NaN" not in raw and b"Infinity" not in raw:
        try:
            return orjson.dumps(body, default=orjson_default)
        except TypeError:
            pass
    encoded = json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=encode_default)
    return encoded.encode()


def decode_replay(entry: EntryView, request_id: Any, *, modern: bool) -> JsonObject:
    """The stored outcome of `entry` as the response to `request_id`, marked as a replay.

    Only for an entry whose outcome was kept (the pipeline answers -32056 otherwise).
    """
    assert entry.outcome is not None, "an entry without its outcome is never replayed"
    marker = {REPLAY_META: True, "interlock/entry-id": entry.id}
    stored: JsonObject = json.loads(entry.outcome)
    if "result" in stored and isinstance(stored["result"], dict):
        result = _in_revision(stored["result"], modern=modern)
        meta = dict(result.get("_meta") or {})
        meta.update(marker)
        stored["result"] = {**result, "_meta": meta}
    elif "error" in stored and isinstance(stored["error"], dict):
        data = stored["error"].get("data")
        stored["error"] = {
            **stored["error"],
            "data": {**data, **marker} if isinstance(data, dict) else {**marker, "upstream": data},
        }
    return {"jsonrpc": "2.0", "id": request_id, **stored}


def stored_answer(outcome: bytes, *, modern: bool) -> JsonObject:
    """A stored outcome as it was (`{"result": …}` or `{"error": …}`), in the caller's revision:
    a deferred call's result given to the caller that created it (not a replay)."""
    stored: JsonObject = json.loads(outcome)
    if isinstance(stored.get("result"), dict):
        stored["result"] = _in_revision(stored["result"], modern=modern)
    return stored


def _in_revision(result: JsonObject, *, modern: bool) -> JsonObject:
    """A stored `tools/call` result in the shape of the caller's protocol revision."""
    if modern:
        return result if "resultType" in result else {**result, "resultType": "complete"}
    legacy = {k: v for k, v in result.items() if k != "resultType"}
    meta = legacy.get("_meta")
    if isinstance(meta, dict):
        legacy["_meta"] = {k: v for k, v in meta.items() if k not in _MODERN_ONLY_META}
    return legacy

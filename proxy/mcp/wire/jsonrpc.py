"""JSON-RPC 2.0 messages as the MCP transport sees them: parse, validate, classify, serialize.

Pure: no I/O. Client bodies are validated strictly (a bad one gets a specific error and is never
forwarded); messages from upstreams are read leniently (`read_upstream_message`) because the proxy
relays them, it does not judge them.

A `WireMessage` is a dict that remembers the exact bytes it was parsed from, so a message the
proxy did not change goes on byte-for-byte (`wire_bytes`) without being parsed or encoded again.
It is never edited: its own members cannot be set, and code that changes a message (a minted id
put back, a trace context added) builds a new dict for it, leaving nested values shared. Setting
`INTERLOCK_CHECK_WIRE=1` (the test suite does) makes `wire_bytes` re-read the bytes and fail
loudly if a nested value was edited in place after all.

An answer the proxy awaits from an upstream (a `tools/call`'s, a batch member's; every line of
a stdio process) is read to its envelope (`read_upstream_message(raw, lazy_output=True)`): the
tool's output, a result's `content` and `structuredContent`, which the proxy relays and stores
but never reads, stays `RawJson`; the rest is parsed. msgspec's reader validates the whole
document but builds nothing for what it skips, so a megabyte of tool output costs a scan, not a
tree of Python objects; what it cannot vouch for (a member outside JSON-RPC's, a NaN, a lone
surrogate, a number beyond a double) is parsed whole as before.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from policies.answers import CODE_INVALID_REQUEST, CODE_PARSE_ERROR, Answer, bad_request
from policies.json_limits import MAX_JSON_DEPTH, nests_deeper_than
from proxy.json_codec import RawJson, encode_default, loads

__all__ = [
    "Body",
    "InvalidBody",
    "JsonObject",
    "Message",
    "MessageKind",
    "StaleWireBytes",
    "WireMessage",
    "dumps",
    "error_response",
    "id_key",
    "kind_of",
    "parse_body",
    "progress_token",
    "read_upstream_message",
    "wire_bytes",
]

JsonObject = dict[str, Any]
MessageKind = Literal["request", "notification", "response"]


class InvalidBody(ValueError):
    """A client body that is not acceptable JSON-RPC; `answer` is what the client is told."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.message)
        self.answer = answer


class WireMessage(dict[str, Any]):
    """A JSON-RPC message parsed from `raw`; `raw` is written instead of re-encoding it.

    A message that arrived as a server-sent event also keeps that event's bytes (`frame`) and
    id, so it can be relayed as the very event the upstream sent. Its members cannot be set or
    removed (a change would leave `raw` stale): build a new dict to change a message.
    """

    __slots__ = ("event_id", "frame", "raw")

    def __init__(
        self,
        value: Mapping[str, Any],
        raw: bytes,
        *,
        frame: bytes | None = None,
        event_id: str | None = None,
    ) -> None:
        super().__init__(value)
        self.raw = raw
        self.frame = frame
        self.event_id = event_id

    def _edited(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            "a WireMessage is sent as the bytes it was parsed from; build a new dict to change it"
        )

    __setitem__ = __delitem__ = __ior__ = _edited
    pop = popitem = clear = update = setdefault = _edited


_CHECK_WIRE = os.environ.get("INTERLOCK_CHECK_WIRE") == "1"


class StaleWireBytes(AssertionError):
    """(`INTERLOCK_CHECK_WIRE=1` only) a `WireMessage` was edited in place: its bytes are stale."""


def wire_bytes(message: Mapping[str, Any]) -> bytes:
    """The bytes to send for `message`: its original bytes if it is a `WireMessage`, else its
    compact encoding. A `WireMessage` is not parsed again (see the module's note on edits)."""
    if isinstance(message, WireMessage):
        if _CHECK_WIRE and loads(message.raw) != message:
            raise StaleWireBytes(f"a WireMessage was edited in place: {message.raw[:200]!r}")
        return message.raw
    return dumps(message)


def dumps(value: Any) -> bytes:
    """Compact JSON, UTF-8, no newline (one stdio line, one SSE data line)."""
    return json.dumps(
        value, separators=(",", ":"), ensure_ascii=False, default=encode_default
    ).encode()


@dataclass(frozen=True, slots=True)
class Message:
    """One validated client message."""

    kind: MessageKind
    body: JsonObject

    @property
    def method(self) -> str | None:
        method = self.body.get("method")
        return method if isinstance(method, str) else None

    @property
    def id(self) -> str | int | None:
        value = self.body.get("id")
        return value if isinstance(value, str | int) and not isinstance(value, bool) else None

    @property
    def params(self) -> JsonObject:
        params = self.body.get("params")
        return params if isinstance(params, dict) else {}

    @property
    def meta(self) -> JsonObject:
        meta = self.params.get("_meta")
        return meta if isinstance(meta, dict) else {}


@dataclass(frozen=True, slots=True)
class Body:
    """A parsed client POST body: one message, or a batch (a JSON array) of them.

    In a batch, each invalid element is answered on its own (`errors`, JSON-RPC error responses)
    and the valid ones still go through, as JSON-RPC 2.0 prescribes.
    """

    messages: tuple[Message, ...]
    batch: bool
    errors: tuple[JsonObject, ...] = ()

    @property
    def single(self) -> Message:
        return self.messages[0]


def _invalid(reason: str, message: str) -> InvalidBody:
    return InvalidBody(bad_request(CODE_INVALID_REQUEST, reason, message))


def parse_body(raw: bytes) -> Body:
    """Parse and validate a client POST body (a single message's body is a `WireMessage`).

    Raises:
        InvalidBody: not JSON (-32700), or JSON that is not JSON-RPC 2.0 (-32600).
    """
    try:
        value = loads(raw)
    except (ValueError, RecursionError):
        # ValueError covers bad UTF-8 and huge integer literals as well as JSONDecodeError.
        raise InvalidBody(
            bad_request(CODE_PARSE_ERROR, "parse_error", "The request body is not valid JSON.")
        ) from None
    if nests_deeper_than(value, raw=raw):
        raise _invalid(
            "too_deep", f"The request nests JSON more than {MAX_JSON_DEPTH} levels deep."
        )
    if isinstance(value, list):
        if not value:
            raise _invalid("empty_batch", "An empty JSON-RPC batch is not a valid request.")
        return _parse_batch(value)
    # One message: it keeps its bytes, which go upstream as they are if nothing changes it.
    return Body((_validate(WireMessage(value, raw) if isinstance(value, dict) else value),), False)


def _parse_batch(items: list[Any]) -> Body:
    messages: list[Message] = []
    errors: list[JsonObject] = []
    first_error: InvalidBody | None = None
    for item in items:
        try:
            messages.append(_validate(item))
        except InvalidBody as exc:
            first_error = first_error or exc
            item_id = item.get("id") if isinstance(item, dict) else None
            errors.append(exc.answer.jsonrpc_error(item_id if _valid_id(item_id) else None))
    if not messages:
        assert first_error is not None
        raise first_error
    return Body(tuple(messages), batch=True, errors=tuple(errors))


def _valid_id(value: Any) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool)


def _validate(value: Any) -> Message:
    if not isinstance(value, dict):
        raise _invalid("not_an_object", "A JSON-RPC message must be a JSON object.")
    if value.get("jsonrpc") != "2.0":
        raise _invalid("bad_jsonrpc_version", 'A JSON-RPC message must carry "jsonrpc": "2.0".')
    if "method" in value:
        method = value["method"]
        if not isinstance(method, str) or not method:
            raise _invalid("bad_method", "The JSON-RPC method must be a non-empty string.")
        if "params" in value and not isinstance(value["params"], dict):
            raise _invalid("bad_params", "MCP params must be a JSON object.")
        if "id" not in value:
            return Message("notification", value)
        if not _valid_id(value["id"]):
            raise _invalid("bad_id", "A JSON-RPC request id must be a string or an integer.")
        return Message("request", value)
    if "id" in value and ("result" in value) != ("error" in value):
        if value["id"] is not None and not _valid_id(value["id"]):
            raise _invalid("bad_id", "A JSON-RPC response id must be a string or an integer.")
        error = value.get("error")
        if "error" in value and not (
            isinstance(error, dict)
            and isinstance(error.get("code"), int)
            and isinstance(error.get("message"), str)
        ):
            raise _invalid("bad_error", "A JSON-RPC error needs an integer code and a message.")
        return Message("response", value)
    raise _invalid(
        "not_jsonrpc", "The body is neither a JSON-RPC request, a notification nor a response."
    )


def kind_of(message: Mapping[str, Any]) -> MessageKind | None:
    """Classify a message by its members (`None` if it is none of the three)."""
    if isinstance(message.get("method"), str):
        return "request" if "id" in message else "notification"
    if "id" in message and ("result" in message or "error" in message):
        return "response"
    return None


def read_upstream_message(raw: bytes | str, *, lazy_output: bool = False) -> WireMessage | None:
    """Parse one upstream message (SSE `data` or a stdio line); `None` if it is not one.

    `lazy_output`: a result's `content` and `structuredContent` (a tool's output, which the
    proxy relays and stores as its bytes but never reads) stay `RawJson`.
    """
    data = raw.encode() if isinstance(raw, str) else raw
    value = _envelope(data) if lazy_output else None
    if value is None:
        try:
            value = loads(raw)
        except (ValueError, RecursionError):
            return None
    if not isinstance(value, dict) or kind_of(value) is None:
        return None
    return WireMessage(value, data)


class _Envelope(msgspec.Struct, forbid_unknown_fields=True):
    """A JSON-RPC message's members; a result's own members are kept as their JSON text."""

    jsonrpc: Any = msgspec.UNSET
    id: Any = msgspec.UNSET
    method: Any = msgspec.UNSET
    params: Any = msgspec.UNSET
    error: Any = msgspec.UNSET
    result: dict[str, msgspec.Raw] | msgspec.UnsetType = msgspec.UNSET


_ENVELOPE = msgspec.json.Decoder(_Envelope)
_MEMBERS = ("jsonrpc", "id", "method", "params", "error")
_TOOL_OUTPUT = frozenset({"content", "structuredContent"})
_decode_member = msgspec.json.Decoder().decode


def _envelope(data: bytes) -> dict[str, Any] | None:
    """The message with its result's tool output left as text; None when the reader cannot
    vouch for it (not JSON to msgspec, a member outside JSON-RPC's, not UTF-8, nested deeper
    than the interpreter's recursion limit, a number beyond a double in a member it reads):
    the caller then parses it whole."""
    try:
        envelope = _ENVELOPE.decode(data)
        if not data.isascii():
            data.decode("utf-8")  # msgspec does not check the UTF-8 of what it skips
        value = {
            name: member
            for name in _MEMBERS
            if (member := getattr(envelope, name)) is not msgspec.UNSET
        }
        if isinstance(envelope.result, dict):
            value["result"] = {
                name: RawJson(bytes(text)) if name in _TOOL_OUTPUT else _decode_member(text)
                for name, text in envelope.result.items()
            }
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError):
        return None
    return value


def id_key(value: Any) -> str:
    """A dict key for a JSON-RPC id that keeps `1` and `"1"` apart."""
    return f"n:{value}" if isinstance(value, int) else f"s:{value}"


def progress_token(message: Mapping[str, Any]) -> str | int | None:
    """The `progressToken` of a request's `params._meta`, or of a progress notification."""
    params = message.get("params")
    if not isinstance(params, dict):
        return None
    token = params.get("progressToken")
    if token is None:
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
    return token if _valid_id(token) else None


def error_response(
    request_id: Any, code: int, message: str, data: Mapping[str, Any] | None = None
) -> JsonObject:
    """A JSON-RPC error response message."""
    error: JsonObject = {"code": code, "message": message}
    if data:
        error["data"] = dict(data)
    return {"jsonrpc": "2.0", "id": request_id, "error": error}

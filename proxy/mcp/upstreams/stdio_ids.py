"""The ids and progress tokens of requests to a stdio process that many clients share.

Clients' own ids may collide, so each request gets an id (and, if it asked for progress, a token)
minted by the process's `WireIds`: unique strings under a random prefix. The answer's bytes get
the client's value back in place of the minted one (`restore`), or, when the bytes do not say
where the minted value is, are encoded afresh with it.
"""

from __future__ import annotations

import itertools
import secrets
from typing import Any

from proxy.mcp.wire.jsonrpc import JsonObject, dumps

__all__ = ["WireIds", "restore"]


class WireIds:
    """The minted ids of one shared process."""

    def __init__(self) -> None:
        self._prefix = f"interlock-{secrets.token_hex(4)}"
        self._numbers = itertools.count(1)

    def mint(self, message: JsonObject, token: Any) -> tuple[str, str | None, JsonObject]:
        """A new id (and token, when the request has one) and the request rewritten to carry
        them; `message` itself is not changed."""
        number = next(self._numbers)
        wire_id = f"{self._prefix}-{number}"
        wire_token = f"{self._prefix}-p{number}" if token is not None else None
        rewritten = {**message, "id": wire_id}
        if wire_token is not None:
            params = dict(message["params"])
            params["_meta"] = {**params["_meta"], "progressToken": wire_token}
            rewritten["params"] = params
        return wire_id, wire_token, rewritten


def restore(raw: bytes, wire_value: Any, original: Any) -> bytes | None:
    """The bytes with the client's id (or token) back in place of the minted one; `None` when
    the bytes do not say which occurrence is the member (the caller encodes the message afresh).

    The minted value is a unique string under a random prefix (letters, digits, dashes: nothing
    a JSON encoder escapes), so when it occurs once it is the member that carries it, whatever
    the order of the members. A server that echoed it elsewhere as well (inside its result)
    leaves two, and one written with escapes leaves none: neither is guessed at.
    """
    if wire_value == original:
        return raw
    minted = dumps(wire_value)
    if raw.count(minted) != 1:
        return None
    return raw.replace(minted, dumps(original), 1)

"""What an upstream exchange needs from the call it serves: where to put intermediate messages
(`Relay`). How it learns the call was abandoned is `proxy.runtime.client_gone`.

The transport's `ClientReply` implements `Relay`; the upstream modules only see this interface.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Relay"]


class Relay(Protocol):
    """Where an upstream exchange puts the messages it receives before the final answer."""

    async def message(self, data: bytes) -> None:
        """One intermediate JSON-RPC message (already the bytes the client should get)."""

    async def event(self, frame: bytes, event_id: str | None) -> None:
        """One server-sent event as the upstream framed it (a message, or a priming event)."""

    async def comment(self, raw: bytes) -> None:
        """A keep-alive comment from the upstream's stream."""

    async def let_go(self) -> None:
        """The upstream closed the stream after an event id, to be resumed (SEP-1699 polling):
        the client may be let go the same way, if it can resume where the upstream's did."""

"""How deeply a request's JSON may nest (pure).

Recursive code anywhere on the way (the canonical form behind keys and fingerprints, the JSON
encoder, an upstream's own parser) turns a few kilobytes of brackets into a `RecursionError`;
the edge refuses such a body with 400 instead, before anything else reads it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_JSON_DEPTH", "nests_deeper_than"]

MAX_JSON_DEPTH = 128
"""Arrays and objects inside each other at most; no tool argument needs more."""


def nests_deeper_than(value: Any, limit: int = MAX_JSON_DEPTH, raw: bytes | None = None) -> bool:
    """True when `value` (parsed JSON) has containers nested more than `limit` deep.

    `raw`, the text it was parsed from, makes the common case free: a body with no more than
    `limit` brackets cannot nest deeper than that, so only bodies with many are walked.
    """
    if raw is not None and raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False

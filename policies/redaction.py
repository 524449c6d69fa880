"""Argument fields a rule names in `redact` are stored as their sha256 only (pure).

The ledger keeps a call's arguments so an operator can reconcile it; some fields (a card number, a
message body) must not be kept in clear or served by `/admin`. The fingerprint is made from the
real arguments, so two calls that differ only in a redacted field still differ.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, MutableMapping, MutableSequence
from typing import Any

from policies.keys import canonical_json

__all__ = ["redacted"]

_MARK = "sha256:"


def _digest(value: Any) -> str:
    try:
        text = canonical_json(value)
    except (TypeError, ValueError):
        text = repr(value)
    return _MARK + hashlib.sha256(text.encode("utf-8")).hexdigest()


def redacted(arguments: Any, fields: Iterable[str]) -> Any:
    """A copy of `arguments` with each field at a dotted path replaced by `sha256:<hex>` of its
    canonical JSON; paths that do not exist are ignored. The input is never modified."""
    paths = [path.split(".") for path in fields if path]
    if not paths:
        return arguments
    result = copy.deepcopy(arguments)
    for parts in paths:
        _replace(result, parts)
    return result


def _replace(node: Any, parts: list[str]) -> None:
    *steps, last = parts
    for part in steps:
        node = _child(node, part)
        if node is None:
            return
    if isinstance(node, MutableMapping) and last in node:
        node[last] = _digest(node[last])
    elif isinstance(node, MutableSequence) and last.isdigit() and int(last) < len(node):
        node[int(last)] = _digest(node[int(last)])


def _child(node: Any, part: str) -> Any:
    if isinstance(node, MutableMapping):
        return node.get(part)
    if isinstance(node, MutableSequence) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    return None

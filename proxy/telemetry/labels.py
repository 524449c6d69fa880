"""Metric label values, bounded: callers choose tenants, run ids, tool and method names, and none
of those may grow `/metrics` (or the process) without limit.

- Every value is cleaned: characters outside printable ASCII (CR, LF, quotes, backslashes
  included) become `_`, and it is cut to `MAX_CHARS`.
- Each label name keeps at most `MAX_VALUES` distinct values for the life of the process; later
  new values are reported as `other`. Scopes keep an allowance per kind (`run:…` cannot crowd out
  `tenant:…`), and keep their kind: `run:other`.
- `mcp.method.name` takes only the methods of the MCP specification (else `other`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

__all__ = [
    "MAX_CHARS",
    "MAX_VALUES",
    "MCP_METHODS",
    "OTHER",
    "bounded",
    "folded",
    "method",
    "reset",
    "scope",
]

MAX_CHARS = 64
MAX_VALUES = 100
OTHER = "other"
MCP_METHODS = frozenset(
    {
        "initialize",
        "ping",
        "server/discover",
        "tools/list",
        "tools/call",
        "resources/list",
        "resources/read",
        "resources/templates/list",
        "resources/subscribe",
        "resources/unsubscribe",
        "prompts/list",
        "prompts/get",
        "completion/complete",
        "logging/setLevel",
        "sampling/createMessage",
        "elicitation/create",
        "roots/list",
        "tasks/get",
        "tasks/result",
        "tasks/list",
        "tasks/cancel",
        "tasks/update",
        "notifications/initialized",
        "notifications/cancelled",
        "notifications/progress",
        "notifications/message",
        "notifications/roots/list_changed",
        "notifications/tools/list_changed",
        "notifications/resources/list_changed",
        "notifications/resources/updated",
        "notifications/prompts/list_changed",
        "notifications/tasks/status",
        "response",  # a client's response to a server request (the proxy's own name for it)
    }
)

_lock = threading.Lock()
_seen: dict[str, set[str]] = {}
_CLEAN = str.maketrans({chr(c): "_" for c in range(128) if not 0x20 <= c < 0x7F or c in (34, 92)})


def _clean(value: str) -> str:
    text = value.translate(_CLEAN)
    if not text.isascii():
        text = "".join(ch if ch.isascii() else "_" for ch in text)
    return text[:MAX_CHARS]


def bounded(name: str, value: str) -> str:
    """`value` as label `name` may carry it: cleaned, or `other` past the label's allowance."""
    clean = _clean(value)
    seen = _seen.get(name)
    if seen is not None and clean in seen:
        return clean
    with _lock:
        seen = _seen.setdefault(name, set())
        if clean in seen:
            return clean
        if len(seen) >= MAX_VALUES:
            return OTHER
        seen.add(clean)
        return clean


def scope(value: str) -> str:
    """A scheduler scope ("global", "tenant:acme", "run:r1") with its kind kept."""
    kind, sep, name = value.partition(":")
    if not sep:
        return bounded("scope", kind)
    kind = bounded("scope kind", kind)
    return f"{kind}:{bounded(f'scope:{kind}', name)}"


def method(value: str) -> str:
    """An MCP method name, if the specification has it; else `other`."""
    return value if value in MCP_METHODS else OTHER


def folded(
    key: str,
    values: Mapping[str, float],
    bound: Callable[[str], str],
    combine: Callable[[float, float], float],
) -> list[tuple[Mapping[str, str], float]]:
    """`values` per bounded label value, folding those that became the same value by `combine`."""
    out: dict[str, float] = {}
    for raw, value in values.items():
        label = bound(raw)
        out[label] = combine(out[label], value) if label in out else value
    return [({key: label}, value) for label, value in out.items()]


def reset() -> None:
    """Forget every value seen (tests)."""
    with _lock:
        _seen.clear()

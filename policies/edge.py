"""What the edge accepts before any route sees a request: browser origins and Host names.

A browser page can reach a proxy on loopback in two ways the MCP specification asks every server
to refuse: a cross-site request (the page's own `Origin`) and DNS rebinding (the page's host name
now resolves to us, so `Host` names it). Requests without `Origin` are not from a browser and
pass; a `Host` passes when it names the listen address, loopback (any port), or an allowed host.
Pure: callers pass header values and settings, nothing here reads a request.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies.model import EdgeSettings

__all__ = ["LOOPBACK_HOSTS", "host_allowed", "origin_allowed"]

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})  # a listen address that names no host


def origin_allowed(origin: str | None, settings: EdgeSettings, host: str | None = None) -> bool:
    """True when `origin` is absent (not a browser), listed (`*` lists every origin), or the
    request's own `host` (same-origin: not cross-site; call only once `host` is allowed)."""
    if origin is None:
        return True
    allowed = settings.allowed_origins
    value = origin.strip().rstrip("/").lower()
    if "*" in allowed or value in allowed:
        return True
    if host is None:
        return False
    own = host.strip().lower()
    return value in (f"http://{own}", f"https://{own}")


def host_allowed(host: str | None, settings: EdgeSettings, listen_host: str) -> bool:
    """True when `host` (a `Host` header value, port optional) names us.

    Allowed: loopback names and the listen address on any port; each `allowed_hosts` entry — a
    name (any port) or `name:port` (that port only); `*` allows every host (e.g. behind a
    reverse proxy that checks `Host` itself). An absent `Host` (HTTP/1.0) is not a browser's.
    """
    if host is None:
        return True
    value = host.strip().lower()
    name, port = split_host(value)
    if "*" in settings.allowed_hosts:
        return True
    listen = listen_host.lower()
    names = set(LOOPBACK_HOSTS)
    if listen not in _WILDCARD_HOSTS:
        names.add(listen)
        names.add(f"[{listen}]")
    if name in names:
        return True
    return any(_entry_matches(entry, name, port) for entry in settings.allowed_hosts)


def split_host(value: str) -> tuple[str, str | None]:
    """`name[:port]` (IPv6 in brackets) → (name, port or None)."""
    if value.startswith("["):
        end = value.find("]")
        if end == -1:
            return value, None
        rest = value[end + 1 :]
        return value[: end + 1], rest[1:] if rest.startswith(":") else None
    name, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        return value, None
    return name, port


def _entry_matches(entry: str, name: str, port: str | None) -> bool:
    entry_name, entry_port = split_host(entry)
    if entry_name != name:
        return False
    return entry_port is None or entry_port == port


def normalised(values: Iterable[str]) -> tuple[str, ...]:
    """Configured origins or hosts as compared: trimmed, lower case, no trailing slash."""
    return tuple(v.strip().rstrip("/").lower() for v in values if v.strip())

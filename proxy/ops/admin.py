"""The operator API under `/admin`: stats, ledger queries and resolve.

A bearer token is required when the environment variable named by `admin.token_env` is set; without
it, `/admin` answers only to loopback callers.
"""

from __future__ import annotations

import dataclasses
import functools
import hmac
import ipaddress
import os
import re
from typing import Any

from aiohttp import web

from ledger import (
    AmbiguousReference,
    EntryNotFound,
    IllegalTransition,
    LedgerError,
    LedgerStore,
    entry_json,
    transition_json,
)
from proxy.edge import Handler, guarded
from proxy.state import CONFIG, LEDGER, SCHEDULER

__all__ = ["setup"]

_RESOLUTIONS = ("succeeded", "failed", "retry")


def _jsonable(value: Any) -> Any:
    """The scheduler's snapshot (frozen dataclasses and mappings) as JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(_jsonable(v) for v in value)
    return value


def _error(status: int, reason: str, message: str) -> web.Response:
    return web.json_response(
        {"error": {"type": "admin_error", "reason": reason, "message": message}}, status=status
    )


def _operator(handler: Handler) -> Handler:
    """An `/admin` route: its access checked (`_check_access`), a POST required to be JSON, and
    the ledger's failures answered 503 (behind `proxy.edge.guarded`, as every route here is)."""

    async def checked(request: web.Request) -> web.StreamResponse:
        denied = _check_access(request)
        if denied is not None:
            return denied
        if request.method == "POST" and request.content_type != "application/json":
            # A browser can send a cross-site POST without a preflight only as a "simple"
            # request (text/plain, form data, or no body): requiring JSON makes every admin
            # write preflighted.
            return _error(
                415, "unsupported_media_type", "admin POSTs need Content-Type: application/json"
            )
        try:
            return await handler(request)
        except _LedgerDown as exc:
            return _error(503, "ledger_unavailable", str(exc))
        except LedgerError as exc:
            return _error(503, "ledger_error", str(exc))

    return guarded(functools.update_wrapper(checked, handler))


def _check_access(request: web.Request) -> web.Response | None:
    token = os.environ.get(request.app[CONFIG].admin.token_env)
    if token:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return _error(401, "unauthorized", "a valid bearer token is required for /admin")
    else:
        peer = request.remote or ""
        try:
            loopback = ipaddress.ip_address(peer).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            return _error(403, "forbidden", "/admin answers only on loopback without a token")
    return None


class _LedgerDown(Exception):
    """The ledger is not open; the admin API answers 503."""


def _store(request: web.Request) -> LedgerStore:
    store = request.app[LEDGER].store
    if store is None:
        raise _LedgerDown(request.app[LEDGER].error or "ledger unavailable")
    return store


async def stats(request: web.Request) -> web.Response:
    snapshot = request.app[SCHEDULER].snapshot()
    body: dict[str, Any] = {"scheduler": _jsonable(snapshot)}
    store = request.app[LEDGER].store
    if store is None:
        body["ledger_error"] = request.app[LEDGER].error
    else:
        try:
            body["ledger"] = await store.count_by_state()
        except LedgerError as exc:
            body["ledger_error"] = str(exc)
    return web.json_response(body)


async def list_entries(request: web.Request) -> web.Response:
    query = request.query
    try:
        limit = int(query.get("limit", "100"))
    except ValueError:
        return _error(400, "bad_limit", "limit must be an integer")
    entries = await _store(request).list_entries(
        state=query.get("state"),
        upstream=query.get("upstream"),
        tenant=query.get("tenant"),
        limit=limit,
    )
    return web.json_response([entry_json(e) for e in entries])


async def show_entry(request: web.Request) -> web.Response:
    try:
        entry, history = await _store(request).get(request.match_info["ref"])
    except (EntryNotFound, AmbiguousReference) as exc:
        return _error(404, "not_found", str(exc))
    return web.json_response(
        {**entry_json(entry), "history": [transition_json(t) for t in history]}
    )


async def resolve_entry(request: web.Request) -> web.Response:
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "bad_json", 'the body must be JSON: {"as": ..., "note": ...}')
    resolution = body.get("as") if isinstance(body, dict) else None
    if resolution not in _RESOLUTIONS:
        return _error(400, "bad_resolution", f"'as' must be one of {', '.join(_RESOLUTIONS)}")
    try:
        entry = await _store(request).resolve(
            request.match_info["ref"],
            as_=resolution,
            note=body.get("note"),
            actor=f"admin-api:{request.remote}",
        )
    except (EntryNotFound, AmbiguousReference) as exc:
        return _error(404, "not_found", str(exc))
    except IllegalTransition as exc:
        return _error(409, "illegal_transition", str(exc))
    return web.json_response(entry_json(entry))


_SCOPE = re.compile(r"^(global|(tenant|run|upstream|cost_class|class):[^\s]{1,200})$")


async def pause_scope(request: web.Request) -> web.Response:
    """Refuse new calls touching a scope (reason `paused`) until it is resumed."""
    scope = request.match_info["scope"]
    if not _SCOPE.match(scope):
        return _error(400, "bad_scope", "scope is global or kind:name, e.g. tenant:acme")
    request.app[SCHEDULER].pause(scope)
    return web.json_response({"scope": scope, "paused": True})


async def resume_scope(request: web.Request) -> web.Response:
    scope = request.match_info["scope"]
    request.app[SCHEDULER].resume(scope)
    return web.json_response({"scope": scope, "paused": False})


async def end_cooldown(request: web.Request) -> web.Response:
    """End an upstream's cooldown early (the operator knows it has recovered)."""
    upstream = request.match_info["upstream"]
    if upstream not in request.app[CONFIG].upstreams:
        return _error(404, "not_found", f"no upstream named {upstream!r}")
    request.app[SCHEDULER].end_cooldown(upstream)
    return web.json_response({"upstream": upstream, "cooldown_s": 0})


def setup(app: web.Application) -> None:
    app.router.add_get("/admin/stats", _operator(stats))
    app.router.add_get("/admin/ledger", _operator(list_entries))
    app.router.add_get("/admin/ledger/{ref}", _operator(show_entry))
    app.router.add_post("/admin/ledger/{ref}/resolve", _operator(resolve_entry))
    app.router.add_post("/admin/scopes/{scope}/pause", _operator(pause_scope))
    app.router.add_post("/admin/scopes/{scope}/resume", _operator(resume_scope))
    app.router.add_post("/admin/upstreams/{upstream}/end-cooldown", _operator(end_cooldown))

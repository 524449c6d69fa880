"""Liveness and readiness: `/healthz` is up while the process runs; `/readyz` checks the ledger.

Both answer without authentication (probes), so they say only the state, never a database error.
"""

from __future__ import annotations

from aiohttp import web

from ledger import LedgerError
from proxy.state import LEDGER, RUNTIME

__all__ = ["setup"]


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready when the configuration is loaded, the ledger answers, and no shutdown is under way."""
    app = request.app
    if app[RUNTIME].shutting_down:
        return web.json_response({"status": "shutting_down"}, status=503)
    handle = app[LEDGER]
    # The database's own error text (addresses, user names) is for the log and /admin/stats:
    # /readyz answers anyone who can reach the port.
    if handle.store is None:
        return web.json_response({"status": "ledger_unavailable"}, status=503)
    try:
        await handle.store.ping()
    except LedgerError:
        return web.json_response({"status": "ledger_unavailable"}, status=503)
    return web.json_response({"status": "ready"})


def setup(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)

"""What the proxy knows of each upstream tool, and how it learns it.

Per tool, from `tools/list` answers: its `annotations` (classification reads them), which
arguments its input schema mirrors into `Mcp-Param-*` headers (2026-07-28 routing headers), and
whether it runs MCP tasks itself (`execution.taskSupport`).

Annotations arrive for free when a client lists tools through the proxy (the transport records them
with `learn_tools`). A proxy that restarted, or a client that cached its tool list, would otherwise
leave a tool unclassified — and an unclassified tool counts as side-effecting: safe, but it is
ledgered and it is refused when the ledger is down. So before deciding on a default, the proxy lists
the upstream's tools itself, once per `_REFRESH_S`, with a short timeout: over Streamable HTTP, or
for a stdio upstream by starting its command once (a short-lived process of its own, ended as soon
as the listing is done, so no client session's process is borrowed). The listing runs in a child
process with the MCP SDK's client (`proxy.mcp.tool_listing`), so the SDK never stays in the
proxy's memory.

The listing is the upstream's, not the call's: it runs as a task of its own, which every call
that needs it waits for only as long as that call allows (`learn_annotations`' `wait_s`); a call
that stops waiting, or whose client leaves, does not end it, and the calls after it find what it
learned. The application's cleanup ends a listing still running."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from policies.model import UpstreamSpec
from proxy.mcp.tool_listing import list_tools_in_child
from proxy.mcp.wire.param_headers import ParamHeaders, declared

__all__ = [
    "CATALOG",
    "ParamHeaders",
    "ToolCatalog",
    "learn_annotations",
    "learn_tools",
    "param_headers",
    "runs_tasks",
    "setup",
    "tool_annotations",
    "tool_task_support",
]

log = logging.getLogger("interlock.tools")

_REFRESH_S = 60.0
_TIMEOUT_S = 3.0
_STDIO_TIMEOUT_S = 10.0  # a stdio listing starts the server's process first
_CHILD_START_S = 5.0  # the listing's child process loads the SDK first (~0.6 s on an idle host)


@dataclass
class ToolCatalog:
    """Per upstream and tool: annotations and header-mirrored arguments; when each upstream's
    tools were last listed by the proxy itself, and the listing running for it, if any."""

    annotations: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    param_headers: dict[str, dict[str, ParamHeaders]] = field(default_factory=dict)
    task_support: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per upstream, the tools whose listing says `execution.taskSupport` optional or required:
    that upstream runs tasks itself."""
    attempts: dict[str, float] = field(default_factory=dict)
    """When each upstream's tools were last listed (the start of the listing)."""
    listings: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    """The listing running for each upstream, if one is."""


CATALOG = web.AppKey("tool_catalog", ToolCatalog)


def setup(app: web.Application) -> None:
    app[CATALOG] = ToolCatalog()
    app.on_cleanup.append(_end_listings)


async def _end_listings(app: web.Application) -> None:
    """End the listings still running (each stops its child process as it is cancelled)."""
    listings = list(app[CATALOG].listings.values())
    for listing in listings:
        listing.cancel()
    await asyncio.gather(*listings, return_exceptions=True)


def tool_annotations(app: web.Application, upstream: str, tool: str) -> dict[str, Any] | None:
    """The annotations known for `tool` (an empty dict: listed without annotations)."""
    return app[CATALOG].annotations.get(upstream, {}).get(tool)


def runs_tasks(app: web.Application, upstream: str) -> bool:
    """Whether `upstream` runs MCP tasks itself (one of its tools supports them)."""
    return bool(app[CATALOG].task_support.get(upstream))


def tool_task_support(app: web.Application, upstream: str, tool: str) -> str | None:
    """A tool's own `execution.taskSupport` when it is optional or required (else None)."""
    return app[CATALOG].task_support.get(upstream, {}).get(tool)


def param_headers(app: web.Application, upstream: str) -> dict[str, ParamHeaders]:
    """Tool name → its header-mirrored arguments, for one upstream (a live view)."""
    return app[CATALOG].param_headers.setdefault(upstream, {})


def learn_tools(app: web.Application, upstream: str, result: Mapping[str, Any]) -> int:
    """Record each listed tool's annotations and header-mirrored arguments; returns how many.

    Pages of a paginated listing add to what earlier pages taught; nothing is forgotten.
    """
    tools = result.get("tools")
    if not isinstance(tools, list):
        return 0
    catalog = app[CATALOG]
    annotations = catalog.annotations.setdefault(upstream, {})
    params = catalog.param_headers.setdefault(upstream, {})
    tasks = catalog.task_support.setdefault(upstream, {})
    learned = 0
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        name = tool["name"]
        value = tool.get("annotations")
        annotations[name] = dict(value) if isinstance(value, dict) else {}
        execution = tool.get("execution")
        support = execution.get("taskSupport") if isinstance(execution, dict) else None
        if support in ("optional", "required"):
            tasks[name] = str(support)
        else:
            tasks.pop(name, None)
        schema = tool.get("inputSchema")
        header_map = declared(schema) if isinstance(schema, dict) else None
        if header_map:
            params[name] = header_map
        elif header_map is not None:
            params.pop(name, None)
        learned += 1
    return learned


async def learn_annotations(app: web.Application, spec: UpstreamSpec, *, wait_s: float) -> None:
    """List the upstream's tools ourselves (at most once a minute per upstream), waiting at most
    `wait_s` for that listing: it goes on without a caller that stops waiting (or is cancelled)."""
    if spec.kind == "http" or (spec.kind == "mcp_http" and spec.url is None):
        return
    learning = app[CATALOG]
    listing = learning.listings.get(spec.name)
    if listing is None:
        last = learning.attempts.get(spec.name)
        if last is not None and time.monotonic() - last < _REFRESH_S:
            return
        learning.attempts[spec.name] = time.monotonic()
        listing = asyncio.create_task(
            _list_tools(app, spec),
            name=f"list-tools-{spec.name}",
            context=contextvars.Context(),  # the upstream's, not the first caller's (its trace)
        )
        learning.listings[spec.name] = listing
        listing.add_done_callback(functools.partial(_listed, learning, spec.name))
    if wait_s > 0:
        # Neither the wait running out nor the listing's own end (cancelled by the cleanup, say)
        # reaches the call as an error; a cancellation of the call itself does.
        await asyncio.wait({listing}, timeout=wait_s)


def _listed(learning: ToolCatalog, upstream: str, listing: asyncio.Task[None]) -> None:
    if learning.listings.get(upstream) is listing:
        del learning.listings[upstream]
    if not listing.cancelled() and (error := listing.exception()) is not None:
        log.warning("%s: listing tools failed: %r", upstream, error)  # not an Exception


async def _list_tools(app: web.Application, spec: UpstreamSpec) -> None:
    timeout_s = _STDIO_TIMEOUT_S if spec.kind == "mcp_stdio" else _TIMEOUT_S
    try:
        async with asyncio.timeout(timeout_s + _CHILD_START_S):
            await list_tools_in_child(
                spec, timeout_s, lambda page: learn_tools(app, spec.name, page)
            )
    except Exception as exc:  # noqa: BLE001 - learning is best effort; the default is safe
        log.warning("%s: could not list tools to learn annotations: %s", spec.name, exc)

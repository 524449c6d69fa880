"""The proxy's own `tools/list` of an upstream (to learn its tools' annotations), run by a child
process with the MCP SDK's client.

The SDK's client is the one DESIGN chose to talk to an upstream as a client of its own, but with its
types and transports it holds about 56 MB for the life of a process that imports it, and the proxy
needs it only for this occasional listing (`proxy.mcp.catalog.learn_annotations`: a call for a tool
never listed through the proxy). So `serve` runs `python -m proxy.mcp.tool_listing`, which lists
the tools (every page) and writes the pages as JSON to its standard output. The upstream's
settings, credentials included, go to the child on its stdin, never on its command line.

If no child can be started (no interpreter to run), the listing runs in this process instead, and
says so in the log. A child that could not list (the upstream is down, say) is a failed listing,
not a reason to try again in-process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any

from policies.model import UpstreamSpec

__all__ = ["list_tools_here", "list_tools_in_child"]

log = logging.getLogger("interlock.tools")

_MAX_PAGES = 20
_CHILD_ERROR_CHARS = 2000

Page = dict[str, Any]


async def list_tools_in_child(spec: UpstreamSpec, request_timeout_s: float) -> list[Page]:
    """Every page of `spec`'s `tools/list`, listed by a child process (see the module note).

    Raises:
        RuntimeError: the child could not list the tools (its last words say why).
    """
    try:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "proxy.mcp.tool_listing",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as error:  # no interpreter to start (an embedded or frozen Python)
        log.warning("no child process to list %s's tools, listing here: %s", spec.name, error)
        return await list_tools_here(spec, request_timeout_s)
    settings = {
        "name": spec.name,
        "kind": spec.kind,
        "url": spec.url,
        "headers": dict(spec.headers),
        "command": list(spec.command),
        "env": dict(spec.env),
        "cwd": spec.cwd,
        "timeout_s": request_timeout_s,
    }
    try:
        out, errors = await child.communicate(json.dumps(settings).encode())
    finally:
        if child.returncode is None:  # cancelled (its time ran out) while it listed
            child.kill()
            await child.wait()
    if child.returncode != 0:
        detail = errors.decode(errors="replace").strip().splitlines()
        raise RuntimeError(detail[-1][-_CHILD_ERROR_CHARS:] if detail else "no message")
    pages: list[Page] = json.loads(out)
    return pages


async def list_tools_here(spec: UpstreamSpec, request_timeout_s: float) -> list[Page]:
    """Every page of `spec`'s `tools/list`, with the SDK's client in this process."""
    import httpx2  # the SDK's HTTP client
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client

    if spec.kind == "mcp_stdio":
        command, *args = spec.command
        server = StdioServerParameters(command=command, args=args, env=dict(spec.env), cwd=spec.cwd)
        async with Client(server, mode="auto") as client:
            return await _pages(client)
    assert spec.url is not None
    # trust_env=False: an environment HTTP(S)_PROXY must never see the injected credentials
    listing = httpx2.AsyncClient(
        headers=dict(spec.headers), timeout=request_timeout_s, trust_env=False
    )
    async with listing as http:
        transport = streamable_http_client(spec.url, http_client=http)
        async with Client(transport, mode="auto") as client:
            return await _pages(client)


async def _pages(client: Any) -> list[Page]:
    pages: list[Page] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        pages.append(page.model_dump(mode="json", by_alias=True, exclude_none=True))
        cursor = page.next_cursor
        if not cursor:
            break
    return pages


def _main() -> int:
    settings = json.loads(sys.stdin.buffer.read())
    spec = UpstreamSpec(
        settings["name"],
        settings["kind"],
        url=settings["url"],
        headers=settings["headers"],
        command=tuple(settings["command"]),
        env=settings["env"],
        cwd=settings["cwd"],
    )
    try:
        pages = asyncio.run(list_tools_here(spec, settings["timeout_s"]))
    except Exception as error:  # noqa: BLE001 - the parent reads the last line
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(pages))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())

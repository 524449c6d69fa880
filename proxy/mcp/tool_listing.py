"""The proxy's own `tools/list` of an upstream (to learn its tools' annotations), run by a child
process with the MCP SDK's client.

The SDK's client is the one DESIGN chose to talk to an upstream as a client of its own, but with its
types and transports it holds about 56 MB for the life of a process that imports it, and the proxy
needs it only for this occasional listing (`proxy.mcp.catalog.learn_annotations`: a call for a tool
never listed through the proxy). So `serve` runs `python -m proxy.mcp.tool_listing`
(`proxy.child_process`), which lists the tools and writes each page as one line of JSON as soon as
it has it (a listing cut short keeps what its first pages taught), then ends. The upstream's
settings (pickled), credentials included, go to the child on its stdin, never on its command
line; a stdio server it starts writes its own errors where serve's go, as when serve started it.

A listing that runs out of time stops its child with SIGTERM, on which the child closes what it
opened (a stdio server's process included), then with SIGKILL if it has not ended within
`_STOP_S`. Where no child can be started (a frozen build, no interpreter to run), the listing runs
in this process instead, and says so in the log. A child that could not list (the upstream is
down, say) is a failed listing, not a reason to try again in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import pickle
import signal
import sys
from collections.abc import Callable
from typing import Any

from policies.model import UpstreamSpec
from proxy.child_process import child_argv, child_environment, children_possible

__all__ = ["list_tools_here", "list_tools_in_child"]

log = logging.getLogger("interlock.tools")

_MAX_PAGES = 20
_STOP_S = 3.0  # after SIGTERM, how long a child may take to close what it opened
_MAX_LINE = 64 * 1024 * 1024  # one page of tools, as JSON

Page = dict[str, Any]
OnPage = Callable[[Page], object]


async def list_tools_in_child(
    spec: UpstreamSpec, request_timeout_s: float, on_page: OnPage
) -> None:
    """Every page of `spec`'s `tools/list`, each given to `on_page` as the child reads it.

    Raises:
        RuntimeError: the child could not list the tools (its own words say why).
    """
    if not children_possible():
        log.warning(
            "no child process to list %s's tools in a frozen build, listing here", spec.name
        )
        await list_tools_here(spec, request_timeout_s, on_page)
        return
    try:
        child = await asyncio.create_subprocess_exec(
            *child_argv("proxy.mcp.tool_listing"),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=child_environment(),
            limit=_MAX_LINE,
        )
    except OSError as error:  # no interpreter to start
        log.warning("no child process to list %s's tools, listing here: %s", spec.name, error)
        await list_tools_here(spec, request_timeout_s, on_page)
        return
    try:
        await _read_pages(child, _settings(spec, request_timeout_s), on_page)
    finally:
        await _stop(child)


def _settings(spec: UpstreamSpec, request_timeout_s: float) -> bytes:
    # Pickled: from serve to its own child (the other way, the child's answer is plain JSON).
    return pickle.dumps((spec, request_timeout_s), protocol=pickle.HIGHEST_PROTOCOL)


async def _read_pages(child: asyncio.subprocess.Process, settings: bytes, on_page: OnPage) -> None:
    assert child.stdin is not None
    assert child.stdout is not None
    child.stdin.write(settings)
    child.stdin.close()
    error = "the child ended without a word"
    while line := await child.stdout.readline():
        try:
            said = json.loads(line)
        except ValueError:
            continue  # not ours (a library that printed): only the child's JSON lines count
        if not isinstance(said, dict):
            continue
        if "page" in said:
            on_page(said["page"])
        elif "error" in said:
            error = str(said["error"])
    if await child.wait() != 0:
        raise RuntimeError(error)


async def _stop(child: asyncio.subprocess.Process) -> None:
    """End the child if it still runs: SIGTERM (it closes what it opened), then SIGKILL, after
    `_STOP_S` or at once when this wait is cancelled (the child is never left running)."""
    if child.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        child.terminate()
    ended = asyncio.ensure_future(child.wait())
    try:
        await asyncio.wait({ended}, timeout=_STOP_S)
    finally:
        if not ended.done():
            with contextlib.suppress(ProcessLookupError):
                child.kill()
        await ended


async def list_tools_here(spec: UpstreamSpec, request_timeout_s: float, on_page: OnPage) -> None:
    """Every page of `spec`'s `tools/list`, with the SDK's client in this process."""
    import httpx2  # the SDK's HTTP client
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client

    if spec.kind == "mcp_stdio":
        command, *args = spec.command
        server = StdioServerParameters(command=command, args=args, env=dict(spec.env), cwd=spec.cwd)
        async with Client(server, mode="auto") as client:
            await _pages(client, on_page)
        return
    assert spec.url is not None
    # trust_env=False: an environment HTTP(S)_PROXY must never see the injected credentials
    listing = httpx2.AsyncClient(
        headers=dict(spec.headers), timeout=request_timeout_s, trust_env=False
    )
    async with listing as http:
        transport = streamable_http_client(spec.url, http_client=http)
        async with Client(transport, mode="auto") as client:
            await _pages(client, on_page)


async def _pages(client: Any, on_page: OnPage) -> None:
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        on_page(page.model_dump(mode="json", by_alias=True, exclude_none=True))
        cursor = page.next_cursor
        if not cursor:
            break


def _say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def _child_main(spec: UpstreamSpec, request_timeout_s: float) -> None:
    # SIGTERM (the parent's time ran out) cancels the listing: the SDK's client closes what it
    # opened, a stdio server's process included, before the child ends.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    await list_tools_here(spec, request_timeout_s, lambda page: _say({"page": page}))


def _main() -> int:
    spec, request_timeout_s = pickle.loads(sys.stdin.buffer.read())
    try:
        asyncio.run(_child_main(spec, request_timeout_s))
    except asyncio.CancelledError:
        return 1
    except Exception as error:  # noqa: BLE001 - the parent reads it from the last line
        _say({"error": f"{type(error).__name__}: {error}"})
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())

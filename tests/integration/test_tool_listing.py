"""The proxy's own `tools/list` of an upstream, run by a child process with the SDK's client
(`proxy.mcp.tool_listing`): the same pages as a listing in this process, a clear failure when the
upstream cannot be listed, and the listing here when no child can start."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import pytest

from policies.model import UpstreamSpec
from proxy.mcp import tool_listing
from proxy.mcp.tool_listing import list_tools_here, list_tools_in_child
from tests.acceptance.test_proxy_crash import _free_port
from tests.integration.mcp_servers import REPO_ROOT, running_upstream, stdio_command
from tests.integration.test_mcp_transport_stdio import _alive
from tests.integration.waiting import wait_until


def _tools(pages: list[dict]) -> dict[str, dict]:
    return {tool["name"]: tool.get("annotations", {}) for page in pages for tool in page["tools"]}


async def _listed(spec: UpstreamSpec, timeout_s: float, *, here: bool = False) -> list[dict]:
    pages: list[dict] = []
    lister = list_tools_here if here else list_tools_in_child
    await lister(spec, timeout_s, pages.append)
    return pages


async def test_the_child_lists_every_tool_of_an_http_upstream_with_its_annotations() -> None:
    with running_upstream() as upstream:
        spec = UpstreamSpec("up", "mcp_http", url=upstream.url, headers={"X-Key": "secret"})
        pages = await _listed(spec, 5.0)
        here = await _listed(spec, 5.0, here=True)
    assert _tools(pages) == _tools(here)
    assert _tools(pages)["search_docs"] == {"readOnlyHint": True}


async def test_the_child_lists_a_stdio_upstream_by_starting_its_command() -> None:
    command = stdio_command()
    spec = UpstreamSpec("st", "mcp_stdio", command=command, cwd=str(REPO_ROOT))
    pages = await _listed(spec, 10.0)
    assert _tools(pages)["search_docs"] == {"readOnlyHint": True}


async def test_an_upstream_that_cannot_be_listed_fails_the_listing() -> None:
    spec = UpstreamSpec("down", "mcp_http", url=f"http://127.0.0.1:{_free_port()}/mcp")
    with pytest.raises(RuntimeError) as failed:
        await _listed(spec, 2.0)
    assert "the child ended without a word" not in str(failed.value)  # its own words


async def test_without_a_child_the_tools_are_listed_here(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    with running_upstream() as upstream:
        spec = UpstreamSpec("up", "mcp_http", url=upstream.url)
        monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
        with caplog.at_level(logging.WARNING, logger="interlock.tools"):
            pages = await _listed(spec, 5.0)
    assert _tools(pages)["search_docs"] == {"readOnlyHint": True}
    assert "no child process to list up's tools, listing here" in caplog.text


async def test_a_listing_out_of_time_ends_its_child_and_the_server_it_started(
    tmp_path: Path,
) -> None:
    """A stdio server that never answers: when the listing's time runs out, its child is
    stopped (SIGTERM: it closes the server it started) and no process is left behind."""
    pid_file = tmp_path / "server.pid"
    script = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    spec = UpstreamSpec("hung", "mcp_stdio", command=(sys.executable, "-c", script))
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(4.0):
            await _listed(spec, 30.0)
    server = int(pid_file.read_text())
    await wait_until(lambda: not _alive(server), timeout_s=10)


async def test_a_child_being_stopped_is_killed_even_when_the_stop_is_cancelled() -> None:
    """Stopping a listing's child sends SIGTERM and waits for it to close what it opened; a
    cancellation during that wait (the application's cleanup ending the listing just as the
    listing's own time runs out) still kills a child that has not ended, never leaves it."""
    ignores_sigterm = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ignores_sigterm, stdout=asyncio.subprocess.PIPE
    )
    assert child.stdout is not None
    await child.stdout.readline()
    stopping = asyncio.create_task(tool_listing._stop(child))
    await asyncio.sleep(0.3)  # SIGTERM sent and ignored: it waits for the child
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert child.returncode is not None

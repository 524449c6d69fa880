"""The proxy's own `tools/list` of an upstream, run by a child process with the SDK's client
(`proxy.mcp.tool_listing`): the same pages as a listing in this process, a clear failure when the
upstream cannot be listed, and the listing here when no child can start."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from policies.model import UpstreamSpec
from proxy.mcp.tool_listing import list_tools_here, list_tools_in_child
from tests.acceptance.test_proxy_crash import _free_port
from tests.integration.mcp_servers import REPO_ROOT, running_upstream, stdio_command


def _tools(pages: list[dict]) -> dict[str, dict]:
    return {tool["name"]: tool.get("annotations", {}) for page in pages for tool in page["tools"]}


async def test_the_child_lists_every_tool_of_an_http_upstream_with_its_annotations() -> None:
    with running_upstream() as upstream:
        spec = UpstreamSpec("up", "mcp_http", url=upstream.url, headers={"X-Key": "secret"})
        pages = await list_tools_in_child(spec, 5.0)
        here = await list_tools_here(spec, 5.0)
    assert _tools(pages) == _tools(here)
    assert _tools(pages)["search_docs"] == {"readOnlyHint": True}


async def test_the_child_lists_a_stdio_upstream_by_starting_its_command() -> None:
    command = stdio_command()
    spec = UpstreamSpec("st", "mcp_stdio", command=command, cwd=str(REPO_ROOT))
    pages = await list_tools_in_child(spec, 10.0)
    assert _tools(pages)["search_docs"] == {"readOnlyHint": True}


async def test_an_upstream_that_cannot_be_listed_fails_the_listing() -> None:
    spec = UpstreamSpec("down", "mcp_http", url=f"http://127.0.0.1:{_free_port()}/mcp")
    with pytest.raises(RuntimeError):
        await list_tools_in_child(spec, 2.0)


async def test_without_a_child_the_tools_are_listed_here(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    with running_upstream() as upstream:
        spec = UpstreamSpec("up", "mcp_http", url=upstream.url)
        monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
        with caplog.at_level(logging.WARNING, logger="interlock.tools"):
            pages = await list_tools_in_child(spec, 5.0)
    assert _tools(pages)["search_docs"] == {"readOnlyHint": True}
    assert "no child process to list up's tools, listing here" in caplog.text

"""`interlock serve`'s memory: what a long-lived proxy never loads. The schema of a new ledger is
migrated by a child process (Alembic, about 12 MB resident for the process's life once imported),
the configuration is validated by another (pydantic and PyYAML), and a SQLite ledger runs without
the query toolkit."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import urllib.request
from pathlib import Path

import aiohttp
from mcp import Client

from bench.bench_idle import SERVE_LISTING
from ledger.migrate import HEAD_REVISION, VERSION_TABLE
from tests.acceptance.test_proxy_crash import _free_port, proxy_process, write_config
from tests.integration.mcp_servers import REPO_ROOT, running_upstream, stdio_command


def _modules_of_a_serve(folder: Path) -> set[str]:
    """Start serve on `folder`'s ledger, wait until /readyz says the ledger is up, stop it
    (SIGTERM); the modules it had loaded."""
    port = _free_port()
    config = write_config(folder, port, '  mail: {mcp: "http://127.0.0.1:9/mcp"}\n')
    listing = folder / "modules.txt"
    with proxy_process(config, ("-c", SERVE_LISTING, str(listing))) as process:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            assert answer.status == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    return set(listing.read_text().split("\n"))


def _revision(ledger: Path) -> str:
    with sqlite3.connect(ledger) as db:
        (revision,) = db.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchone()
    return str(revision)


def test_serve_migrates_a_new_ledger_without_loading_alembic(tmp_path: Path) -> None:
    modules = _modules_of_a_serve(tmp_path)
    assert "ledger.store" in modules  # the listing is serve's own: its ledger is loaded
    assert _revision(tmp_path / "ledger.db") == HEAD_REVISION
    assert sorted(m for m in modules if m.partition(".")[0] == "alembic") == []
    again = _modules_of_a_serve(tmp_path)  # a restart on the migrated ledger
    assert sorted(m for m in again if m.partition(".")[0] == "alembic") == []


_VALIDATION = ("pydantic", "pydantic_core", "yaml")
"""What validates the configuration file (about 12 MB resident once imported, with the models):
serve's child validates it; the proxy only ever holds the plain values."""


def test_serve_validates_its_configuration_without_loading_pydantic_or_yaml(
    tmp_path: Path,
) -> None:
    modules = _modules_of_a_serve(tmp_path)
    assert "proxy.app" in modules  # it served, on its configuration
    assert "policies.model" in modules
    loaded = sorted(m for m in modules if m.partition(".")[0] in _VALIDATION)
    assert loaded == [], f"serve loaded {len(loaded)} modules of the validation: {loaded[:8]}"
    ours = sorted(m for m in modules if m in ("policies.config", "policies.config_schema"))
    assert ours == [], f"serve loaded the configuration's models: {ours}"


_SQL_TOOLKIT = ("sqlalchemy", "sqlmodel", "aiosqlite", "greenlet")
"""The ledger's query and schema stack (about 26 MB resident once imported): the migrations use
it, and a PostgreSQL ledger; a proxy on a SQLite ledger must not need it."""


async def test_a_sqlite_serve_that_served_calls_never_loads_the_sql_toolkit(
    tmp_path: Path,
) -> None:
    """Calls of both kinds, a lease sweep and a purge, the deferred-work poll, readiness, a
    metrics scrape, an operator's look at the ledger through the admin API: what a busy sidecar
    does all day. None of it loads the query toolkit."""
    port = _free_port()
    listing = tmp_path / "modules.txt"
    with running_upstream() as upstream:
        config = tmp_path / "interlock.yaml"
        config.write_text(
            f'listen: "127.0.0.1:{port}"\n'
            "ledger: {url: 'sqlite:///ledger.db', sweep_interval_s: 0.1}\n"
            "deferred: {poll_interval_s: 0.1}\n"
            f'upstreams:\n  up: {{mcp: "{upstream.url}"}}\n'
        )
        base = f"http://127.0.0.1:{port}"
        with proxy_process(config, ("-c", SERVE_LISTING, str(listing))) as process:
            async with Client(f"{base}/mcp/up", mode="legacy") as client:
                for n in range(3):
                    found = await client.call_tool("search_docs", {"query": f"q{n}"})
                    assert not found.is_error
                    sent = await client.call_tool(
                        "send_email", {"to": "a@example.com", "subject": f"s{n}"}
                    )
                    assert not sent.is_error
            await asyncio.sleep(0.5)  # several sweeps, purges and polls
            async with aiohttp.ClientSession() as http:
                for path in ("/readyz", "/metrics", "/admin/stats", "/admin/ledger"):
                    async with http.get(f"{base}{path}") as answer:
                        assert answer.status == 200, await answer.text()
                        if path == "/admin/ledger":
                            entries = await answer.json()
                async with http.get(f"{base}/admin/ledger/{entries[0]['id']}") as answer:
                    assert answer.status == 200, await answer.text()
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0
        assert upstream.stats()["emails_total"] == 3
    modules = set(listing.read_text().split("\n"))
    assert "ledger.store" in modules
    loaded = sorted(m for m in modules if m.partition(".")[0] in _SQL_TOOLKIT)
    assert loaded == [], f"serve loaded {len(loaded)} modules of the toolkit: {loaded[:8]}"


async def test_a_modern_call_carrying_a_trace_does_not_load_the_mcp_sdk(tmp_path: Path) -> None:
    """A 2026-07-28 client that sends its trace context (`traceparent` in `_meta`, as an
    instrumented agent does) to a proxy that traces: the proxy passes the trace on with its own
    span as the parent, so the forwarded request differs from the client's, but only in `_meta`.
    Its routing headers (`Mcp-Method`, `Mcp-Name`, `Mcp-Param-*`) stay the client's, so nothing
    needs the SDK's header codec (the SDK with its types is about 56 MB resident once imported)."""
    port = _free_port()
    listing = tmp_path / "modules.txt"
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
        "traceparent": f"00-{trace_id}-{parent_id}-01",
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "search_docs", "arguments": {"query": "q"}, "_meta": meta},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "search_docs",
    }
    with running_upstream() as upstream:
        # Tracing on (spans go to a port nobody listens on): the proxy's own span is the parent
        # it passes on, so the forwarded `_meta` differs from the client's.
        telemetry = f"telemetry: {{otlp_endpoint: 'http://127.0.0.1:{_free_port()}'}}\n"
        upstreams = f'  up: {{mcp: "{upstream.url}"}}\n'
        config = write_config(tmp_path, port, upstreams, telemetry)
        with proxy_process(config, ("-c", SERVE_LISTING, str(listing))) as process:
            url = f"http://127.0.0.1:{port}/mcp/up"
            listing_body = {"jsonrpc": "2.0", "id": 0, "method": "tools/list", "params": {}}
            listing_body["params"] = {"_meta": {k: v for k, v in meta.items() if "/" in k}}
            async with aiohttp.ClientSession() as http:
                # The client lists the tools first (through the proxy, which learns them), so the
                # call below is the only thing that could make the proxy reach for the SDK.
                list_headers = {**headers, "Mcp-Method": "tools/list"}
                del list_headers["Mcp-Name"]
                async with http.post(url, json=listing_body, headers=list_headers) as listed:
                    assert listed.status == 200, await listed.text()
                async with http.post(url, json=body, headers=headers) as answer:
                    assert answer.status == 200, await answer.text()
                    text = await answer.text()
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0
    assert "result" in text, text
    modules = set(listing.read_text().split("\n"))
    sdk = sorted(m for m in modules if m.partition(".")[0] == "mcp")
    assert sdk == [], f"serve loaded {len(sdk)} modules of the MCP SDK: {sdk[:8]}"


async def test_a_stdio_upstream_does_not_load_the_mcp_sdk(tmp_path: Path) -> None:
    """A stdio upstream, spawned by the proxy and driven over its own pipes: its tools listed and
    called through the proxy. The server process inherits only the variables MCP stdio clients
    pass on (`PATH`, `HOME`, ...) plus its configured `env`; choosing them needs no SDK."""
    port = _free_port()
    listing = tmp_path / "modules.txt"
    command = json.dumps(list(stdio_command()))
    config = write_config(
        tmp_path, port, f"  local: {{command: {command}, cwd: {json.dumps(str(REPO_ROOT))}}}\n"
    )
    with proxy_process(config, ("-c", SERVE_LISTING, str(listing))) as process:
        async with Client(f"http://127.0.0.1:{port}/mcp/local", mode="legacy") as client:
            tools = await client.list_tools()
            assert "search_docs" in [tool.name for tool in tools.tools]
            found = await client.call_tool("search_docs", {"query": "q"})
            assert not found.is_error
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    modules = set(listing.read_text().split("\n"))
    assert "proxy.mcp.upstreams.stdio" in modules  # the stdio upstream ran in this process
    sdk = sorted(m for m in modules if m.partition(".")[0] == "mcp")
    assert sdk == [], f"serve loaded {len(sdk)} modules of the MCP SDK: {sdk[:8]}"


async def test_a_call_for_a_tool_never_listed_does_not_load_the_mcp_sdk(tmp_path: Path) -> None:
    """A client that calls a tool it never listed through this proxy (it listed before the proxy
    restarted, say): the proxy lists the upstream's tools itself to classify it, in a child
    process, and the read-only tool's annotation is what decides (it is not ledgered)."""
    port = _free_port()
    listing = tmp_path / "modules.txt"
    with running_upstream() as upstream:
        config = write_config(tmp_path, port, f'  up: {{mcp: "{upstream.url}"}}\n')
        with proxy_process(config, ("-c", SERVE_LISTING, str(listing))) as process:
            base = f"http://127.0.0.1:{port}"
            async with Client(f"{base}/mcp/up", mode="legacy") as client:
                found = await client.call_tool("search_docs", {"query": "q"})
                assert not found.is_error
            async with aiohttp.ClientSession() as http, http.get(f"{base}/admin/ledger") as answer:
                assert answer.status == 200, await answer.text()
                assert await answer.json() == []  # classified read-only: nothing ledgered
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0
    modules = set(listing.read_text().split("\n"))
    sdk = sorted(m for m in modules if m.partition(".")[0] == "mcp")
    assert sdk == [], f"serve loaded {len(sdk)} modules of the MCP SDK: {sdk[:8]}"

"""Capture the span trees shown in `see-the-traces.md` from a real run.

    PYTHONPATH=. .venv/bin/python docs/capture_traces.py

Runs the proxy in-process against the test suite's real upstreams (an MCP server subprocess and
the fake model API), exports its spans to the test suite's OTLP receiver, and prints the trees
of: an MCP call refused during an upstream cooldown, an MCP call whose outcome became unknown, and
the same two over the HTTP proxy.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import ClientSession
from mcp import Client
from mcp.shared.exceptions import MCPError

from policies.model import TelemetrySettings
from proxy.telemetry.sdk import configure_telemetry
from tests.integration.fake_provider import running_provider
from tests.integration.mcp_servers import running_upstream
from tests.integration.otlp_receiver import OtlpReceiver
from tests.integration.proxy_harness import running_proxy

CONFIG = """
    ledger: {{url: "sqlite:///ledger.db"}}
    defaults: {{timeout_s: 5, deadline_s: 10}}
    upstreams:
      mail: {{mcp: "{mcp}"}}
      llm: {{http: "{http}", timeout_s: 0.5}}
    tools:
      - match: "mail/hold"
        side_effect: true
        timeout_s: 0.5
"""


def traceparent() -> tuple[str, str]:
    trace_id = secrets.token_hex(16)
    return trace_id, f"00-{trace_id}-{secrets.token_hex(8)}-01"


async def mcp_call(url: str, tool: str, args: dict[str, Any], key: str) -> str:
    trace_id, parent = traceparent()
    meta = {"traceparent": parent, "interlock/tenant": "acme", "interlock/idempotency-key": key}
    async with Client(url, mode="legacy") as client:
        try:
            await client.call_tool(tool, args, meta=meta)
        except MCPError as exc:
            print(f"# {tool}: JSON-RPC error {exc.error.code} {exc.error.data}")
    return trace_id


async def http_call(url: str, key: str) -> str:
    trace_id, parent = traceparent()
    headers = {"traceparent": parent, "X-Interlock-Tenant": "acme", "Idempotency-Key": key}
    async with ClientSession() as session, session.post(url, json={}, headers=headers) as answer:
        print(f"# POST {url}: HTTP {answer.status} {await answer.text()}")
    return trace_id


async def show(receiver: OtlpReceiver, title: str, trace_id: str) -> None:
    await receiver.wait_for_span(
        lambda s: s.trace_id == trace_id and s.kind == "SERVER" and s.scope == "interlock"
    )
    print(f"\n## {title}\n")
    print(receiver.render_tree(trace_id))


async def main() -> None:
    async with OtlpReceiver() as receiver, running_provider() as provider:
        settings = TelemetrySettings(otlp_endpoint=receiver.endpoint)
        handle = configure_telemetry(
            settings, enabled=True, set_global=False, schedule_delay_s=0.05
        )
        try:
            with running_upstream() as upstream, tempfile.TemporaryDirectory() as tmp:
                text = CONFIG.format(mcp=upstream.url, http=provider.url)
                async with running_proxy(text, Path(tmp)) as proxy:
                    mail = proxy.mcp_url("mail")
                    lost = await mcp_call(mail, "hold", {"seconds": 2, "tag": "x"}, "pay-1")
                    proxy.scheduler.start_cooldown("mail", 20)
                    refused = await mcp_call(mail, "send_email", {"to": "a", "subject": "b"}, "m-1")
                    provider.script("stall")
                    http_lost = await http_call(f"{proxy.base}/http/llm/v1/actions", "wire-9")
                    proxy.scheduler.start_cooldown("llm", 20)
                    http_refused = await http_call(f"{proxy.base}/http/llm/v1/actions", "wire-10")
                    await show(receiver, "MCP: refused (upstream cooling down)", refused)
                    await show(receiver, "MCP: outcome unknown (timeout after sending)", lost)
                    await show(receiver, "HTTP: refused (upstream cooling down)", http_refused)
                    await show(receiver, "HTTP: outcome unknown (timeout after sending)", http_lost)
        finally:
            await asyncio.to_thread(handle.shutdown)


if __name__ == "__main__":
    asyncio.run(main())

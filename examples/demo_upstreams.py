"""The demo's MCP upstream: a real `MCPServer` with a read-only, a side-effecting and a slow tool.

Run: python examples/demo_upstreams.py PORT   (serves Streamable HTTP at http://127.0.0.1:PORT/mcp)

`send_email` and `charge_card` count their own executions, so the demo can show that a duplicate
delivered through Interlock ran once; `demo_stats` (read-only) reports the counters.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("interlock-demo-upstream")
executions: Counter[str] = Counter()

DOCS = {
    "backpressure": "Refuse early with Retry-After instead of queueing forever.",
    "ledger": "Write the side effect down before sending it; unknown is a state, not a retry.",
    "leases": "A running entry has a lease; when it expires the entry becomes unknown.",
}


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def search_docs(query: str) -> str:
    """Search the runbook (read-only)."""
    executions["search_docs"] += 1
    hits = [f"{k}: {v}" for k, v in DOCS.items() if query.lower() in (k + v).lower()]
    return "\n".join(hits) or "no match"


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False))
async def send_email(to: str, subject: str, body: str = "", ctx: Context | None = None) -> str:
    """Send an email (side-effecting; counts executions per recipient and subject)."""
    executions[f"send_email:{to}:{subject}"] += 1
    executions["send_email"] += 1
    await asyncio.sleep(0.05)
    return f"sent to {to}: {subject}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
async def charge_card(card: str, amount_cents: int, seconds: float = 1.0) -> str:
    """Charge a card; slow on purpose (takes `seconds`)."""
    executions["charge_card"] += 1
    await asyncio.sleep(seconds)
    return f"charged {amount_cents} cents to {card}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def demo_stats() -> dict[str, int]:
    """How many times each side-effecting tool really ran."""
    return dict(executions)


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9001
    server.run("streamable-http", host="127.0.0.1", port=port, streamable_http_path="/mcp")


if __name__ == "__main__":
    main()

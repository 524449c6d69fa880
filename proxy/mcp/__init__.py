"""The MCP path: `POST/GET/DELETE /mcp/{upstream}`.

    wire/       the protocol's bytes, pure: JSON-RPC, SSE, which headers cross
    transport/  the client's side: routes, one POST, batches, replies, sessions, spans
    upstreams/  the server's side: Streamable HTTP upstreams, stdio processes and their pool
    pipeline/   `tools/call`: classify → admit (or defer) → write-ahead → attempts → record → answer
    tasks/      `tasks/*` served from the ledger; how deferred calls reach the upstream later
    catalog     what the proxy knows of each upstream tool (annotations, header-mirrored args)

`transport` and `tasks` wire a request to `pipeline` and `upstreams`; `pipeline` never imports
`transport`, `upstreams` or `tasks` (it gets a `send_upstream` callable); `upstreams` never
imports the others.
"""

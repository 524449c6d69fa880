"""The MCP path: `POST/GET/DELETE /mcp/{upstream}`.

    wire/       the protocol's bytes, pure: JSON-RPC, SSE, which headers cross
    transport/  the client's side: routes, one POST, batches, replies, sessions, spans
    upstreams/  the server's side: Streamable HTTP upstreams, stdio processes and their pool
    pipeline/   `tools/call`: classify → admit → write-ahead → attempts → record → answer
    catalog     what the proxy knows of each upstream tool (annotations, header-mirrored args)

`transport` wires a request to `pipeline` and `upstreams`; `pipeline` never imports `transport`
or `upstreams` (it gets a `send_upstream` callable); `upstreams` never imports the other two.
"""

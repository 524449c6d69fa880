"""The MCP wire format, pure (no I/O): JSON-RPC messages, Server-Sent Events, headers."""

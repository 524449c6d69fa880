"""The upstream's side of the MCP path: Streamable HTTP upstreams, stdio processes and their
pool, and the channel one request uses to reach either."""

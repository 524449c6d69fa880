"""The client's side of the MCP path: routes, one POST, batches, replies, sessions and spans."""

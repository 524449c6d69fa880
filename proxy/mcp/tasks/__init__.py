"""MCP tasks: the `tasks/*` methods served from the ledger, and how deferred calls run."""

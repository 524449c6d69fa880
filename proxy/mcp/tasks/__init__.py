"""MCP tasks: the `tasks/*` methods served from the ledger (`methods`; a task's answers to the
upstream's questions: `input`), and how deferred calls run (`runner`, `channels`)."""

"""Shared by the MCP and HTTP paths: admission (`scheduler`), a call's hold on its ledger entry
(`leases`), and upstream pressure in the retry policy's words (`upstream_pressure`)."""

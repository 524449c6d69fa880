"""Shared by the MCP and HTTP paths: admission (`scheduler`), a call's hold on its ledger entry
(`leases`), upstream pressure in the retry policy's words (`upstream_pressure`), and ledger
writes that outlive a cancelled call (`ledger_writes`)."""

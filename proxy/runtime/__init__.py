"""Shared by the MCP and HTTP paths: admission (`scheduler`), a call's hold on its ledger entry
(`leases`), upstream pressure in the retry policy's words (`upstream_pressure`), retries built
only after a first attempt failed (`retries`), ledger writes that outlive a cancelled call
(`ledger_writes`), refusal records written behind the answer (`rejections`), and deferred work:
the dispatcher that runs accepted calls when admission allows (`deferred`) and a claimed call in
its runner's hands (`deferred_job`)."""

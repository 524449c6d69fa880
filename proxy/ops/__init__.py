"""The operator surface: the `interlock` CLI (`cli`, `ledger_cli`, `policy_report`, `demo`), the
admin API (`admin`) and liveness/readiness (`health`)."""

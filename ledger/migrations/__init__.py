"""Alembic migrations of the ledger schema (configured in code by `ledger.migrate`)."""

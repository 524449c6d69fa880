"""Alembic revisions of the ledger schema."""

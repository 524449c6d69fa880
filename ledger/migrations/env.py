"""Alembic environment: runs on the connection `ledger.migrate` hands over (no alembic.ini)."""

from __future__ import annotations

from alembic import context

from ledger.migrate import VERSION_TABLE
from ledger.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run ledger migrations through `interlock ledger migrate`")

context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()

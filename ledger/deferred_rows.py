"""What deferred work reads inside the writer's transaction: the batch loaders.

Two loaders run inside the writer's transaction (see `Needs.loaders`): `AcceptedCounts` counts the
accepted work per tenant and per upstream that a batch's `Defer` operations bound, and
`ClaimableRows` reads the entries a batch's `ClaimDeferred` operations want to start. On SQLite
they read with the writer's plain statements (`ledger.sqlite_sql`); on PostgreSQL with the
toolkit's, locked (`ledger.deferred_queries`, imported when such a batch first runs).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Self

from ledger import sqlite_sql
from ledger.batch import Loader, Needs, WorkingSet

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = ["AcceptedCounts", "ClaimableRows"]


class _BatchLoader(Loader):
    """A loader the operations of one batch share: `of(needs)` is the batch's one instance."""

    __slots__ = ()

    @classmethod
    def of(cls, needs: Needs) -> Self:
        """The batch's loader (one per batch, whatever the number of operations)."""
        for existing in needs.loaders:
            if isinstance(existing, cls):
                return existing
        loader = cls()
        needs.loaders.append(loader)
        return loader


@dataclass(slots=True)
class AcceptedCounts(_BatchLoader):
    """Loader: waiting deferred work per tenant and per upstream, into `ws.facts`
    (`accepted_by_tenant`, `accepted_by_upstream`)."""

    tenants: set[str] = field(default_factory=set)
    upstreams: set[str] = field(default_factory=set)

    def add(self, tenant: str, upstream: str) -> None:
        self.tenants.add(tenant)
        self.upstreams.add(upstream)

    def on_postgres(self, conn: sa.Connection, ws: WorkingSet) -> None:
        from ledger import deferred_queries

        ws.facts.update(deferred_queries.accepted_counts(conn, self.tenants, self.upstreams))

    def on_sqlite(self, conn: sqlite3.Connection, ws: WorkingSet) -> None:
        ws.facts.update(sqlite_sql.accepted_counts(conn, self.tenants, self.upstreams))


@dataclass(slots=True)
class ClaimableRows(_BatchLoader):
    """Loader: the named entries that are waiting deferred work, each locked by this batch or
    left out (another replica is claiming it)."""

    ids: set[str] = field(default_factory=set)

    def add(self, entry_id: str) -> None:
        self.ids.add(entry_id)

    def on_postgres(self, conn: sa.Connection, ws: WorkingSet) -> None:
        from ledger import deferred_queries

        deferred_queries.load_claimable(conn, self.ids, ws)

    def on_sqlite(self, conn: sqlite3.Connection, ws: WorkingSet) -> None:
        sqlite_sql.load_claimable(conn, self.ids, ws)

"""What a proxy on the embedded default loads: the PostgreSQL driver (asyncpg, about 5 MB of a
sidecar's idle memory: issue 13's idle-RSS figure) stays out of a process whose ledger is SQLite.
Checked in a fresh interpreter that builds the application, opens its SQLite ledger and writes one
call's two entries, as `interlock serve` does. (SQLAlchemy's PostgreSQL dialect module is loaded
by the ledger's table definitions; it does not load the driver.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

_PROGRAM = textwrap.dedent(
    """
    import asyncio, sys
    from ledger import ClaimRequest, LedgerStore
    from policies.config import parse_config_text
    from proxy.app import create_app
    import proxy.ops.cli  # noqa: F401 - what `interlock serve` imports

    config = parse_config_text('''
    listen: "127.0.0.1:1"
    ledger: {url: "sqlite:///%s/ledger.db", durability: full}
    upstreams:
      up: {mcp: "http://127.0.0.1:9/mcp"}
    ''')

    async def main():
        create_app(config)
        store = await LedgerStore.open(config.ledger, owner="footprint")
        try:  # one side-effecting call's two writes, through the writer as the proxy makes them
            request = ClaimRequest("t", "up", "send", "k-1", "explicit", "f" * 64)
            entry = (await store.claim(request)).entry
            await store.finish(entry.id, entry.fencing_token, state="succeeded", outcome=b"ok")
        finally:
            await store.close()

    asyncio.run(main())
    print(",".join(sorted(m for m in sys.modules if m.split(".")[0] == "asyncpg")))
    """
)


def _loaded_by(program: str) -> str:
    """What `program`, run in a fresh interpreter, printed of the modules it loaded."""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_sqlite_proxy_never_loads_the_postgresql_driver(tmp_path: Path) -> None:
    loaded = _loaded_by(_PROGRAM % tmp_path)
    assert loaded == "", f"loaded for a SQLite ledger: {loaded}"


_EVERY_DAY = textwrap.dedent(
    """
    import asyncio, sys
    from datetime import timedelta
    from ledger import ClaimRequest, LedgerStore
    from policies.config import parse_config_text
    from proxy.app import create_app
    import proxy.ops.cli  # noqa: F401 - what `interlock serve` imports

    config = parse_config_text('''
    listen: "127.0.0.1:1"
    ledger: {url: "sqlite:///%s/ledger.db", durability: full, lease_s: 0.05}
    upstreams:
      up: {mcp: "http://127.0.0.1:9/mcp"}
    ''')

    def request(key):
        return ClaimRequest("t", "up", "send", key, "explicit", "f" * 64)

    async def main():
        create_app(config)
        store = await LedgerStore.open(config.ledger, owner="footprint", migrate_in_child=True)
        try:
            entry = (await store.claim(request("done"))).entry
            await store.finish(entry.id, entry.fencing_token, state="succeeded", outcome=b"ok")
            await store.claim(request("lapses"))  # its lease runs out: the sweep finds it
            await asyncio.sleep(0.1)
            assert await store.sweep_expired() == 1
            assert await store.purge(older_than=timedelta(0)) == 1
            deferred = await store.deferred.defer(
                request("later"), b"{}", max_per_tenant=10, max_per_upstream=10
            )
            (candidate,) = await store.deferred.candidates(10)
            assert candidate.entry_id == deferred.entry.id
            assert await store.deferred.claim(candidate.entry_id) is not None
            await store.ping()
            counts = await store.count_by_state()
            assert (counts["unknown"], counts["running"]) == (1, 1), counts
            assert await store.oldest_in_state("unknown") is not None
            # What an operator and a client polling its task read:
            task_id = deferred.entry.task_id
            assert await store.deferred.task_owner(task_id) == "t"
            assert (await store.deferred.task(task_id, "t")).id == deferred.entry.id
            assert len((await store.deferred.tasks("t")).entries) == 1
            assert len(await store.list_entries(state="unknown")) == 1
            assert await store.stats()
            (lapsed,) = await store.list_entries(state="unknown")
            entry, history = await store.get(lapsed.id)
            assert [t.to_state for t in history] == ["running", "unknown"]
            resolved = await store.resolve("lapses", as_="failed", note="n", actor="ops")
            assert resolved.state == "failed"
        finally:
            await store.close()

    asyncio.run(main())
    toolkit = ("sqlalchemy", "sqlmodel", "aiosqlite", "greenlet", "alembic")
    print(",".join(sorted(m for m in sys.modules if m.split(".")[0] in toolkit)))
    """
)


def test_what_a_sqlite_proxy_does_all_day_never_loads_the_query_toolkit(tmp_path: Path) -> None:
    """A new ledger migrated by the child, a call's two writes, a lease sweep and a purge,
    deferred work accepted, polled for and claimed, readiness, the metrics' counts and oldest
    wait, a client's task lookups, an operator's list, entry, counts and resolution: all through
    the stdlib driver."""
    loaded = _loaded_by(_EVERY_DAY % tmp_path)
    assert loaded == "", f"loaded for a SQLite ledger: {loaded[:300]}"


_HEADER_RULE = textwrap.dedent(
    """
    import pathlib, sys
    from proxy.app import create_app
    from proxy.mcp.catalog import learn_tools, param_headers
    from proxy.mcp.wire.headers import modern_routing_headers
    from proxy.ops.config_child import load_config_in_child  # as `interlock serve` reads it

    path = pathlib.Path(%r) / "interlock.yaml"
    path.write_text('''
    listen: "127.0.0.1:1"
    upstreams:
      up: {mcp: "http://127.0.0.1:9/mcp"}
    ''')
    app = create_app(load_config_in_child(path))
    region = {"type": "string", "x-mcp-header": "Region"}
    schema = {"type": "object", "properties": {"region": region}}
    assert learn_tools(app, "up", {"tools": [{"name": "find", "inputSchema": schema}]}) == 1
    header_map = param_headers(app, "up")["find"]
    original = {"method": "tools/call", "params": {"name": "find", "arguments": {"region": "eu"}}}
    changed = {"method": "tools/call", "params": {"name": "find", "arguments": {"region": "é"}}}
    rebuilt = modern_routing_headers({"mcp-param-region": "eu"}, original, changed, header_map)
    assert rebuilt["mcp-param-region"] == "=?base64?w6k=?=", rebuilt
    heavy = ("mcp", "mcp_types", "pydantic", "pydantic_core")
    print(",".join(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
    """
)


def test_a_tool_whose_schema_mirrors_arguments_into_headers_never_loads_the_sdk(
    tmp_path: Path,
) -> None:
    """Learning a schema with `x-mcp-header` and rebuilding a changed call's `Mcp-Param-*`
    headers use Interlock's own codec: the SDK (with pydantic, about 55 MB) stays out of a
    sidecar whose idle footprint is under 60 MB (issue 13)."""
    loaded = _loaded_by(_HEADER_RULE % str(tmp_path))
    assert loaded == "", f"loaded for the x-mcp-header rule: {loaded[:300]}"

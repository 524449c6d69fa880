"""`interlock ledger …` as an operator uses it, on SQLite and PostgreSQL, with the proxy down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ledger import LedgerStore
from ledger.migrate import HEAD_REVISION
from policies.model import LedgerSettings
from proxy.ops import ledger_cli
from tests import ledger_fixtures
from tests.ledger_fixtures import LedgerBackend, claim_request, run_async

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]


def with_store(url: str, action: Callable[[LedgerStore], Awaitable[T]]) -> T:
    """Run `action` on a migrated store of `url` (on a private loop), then close the store."""

    async def run() -> T:
        store = await LedgerStore.open(LedgerSettings(url=url), owner="proxy-1")
        try:
            return await action(store)
        finally:
            await store.close()

    return run_async(run)


def seed(url: str) -> dict[str, str]:
    """One succeeded, one running and one unknown entry; returns their ids by key."""

    async def action(store: LedgerStore) -> dict[str, str]:
        done = await store.claim(claim_request("order-1"))
        await store.finish(done.entry.id, 1, state="succeeded", outcome=b'{"sent": true}')
        running = await store.claim(claim_request("order-2", upstream="files"))
        lost = await store.claim(claim_request("order-3"))
        await store.mark_unknown(lost.entry.id, 1, reason="upstream timed out")
        return {"order-1": done.entry.id, "order-2": running.entry.id, "order-3": lost.entry.id}

    return with_store(url, action)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the ledger commands in-process; return (exit status, stdout, stderr)."""
    status = ledger_cli.main(["ledger", *args])
    out, err = capsys.readouterr()
    return status, out, err


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    status, out, err = cli(capsys, *args, "--json")
    assert status == 0, err
    return json.loads(out)


def test_migrate_creates_then_reports_current(
    capsys: pytest.CaptureFixture[str], ledger_url: str
) -> None:
    """`migrate` builds an empty database's schema, and says so; the second run changes nothing."""
    status, out, _ = cli(capsys, "migrate", "--ledger-url", ledger_url)
    assert (status, out.strip()) == (0, f"ledger schema migrated: (empty) → {HEAD_REVISION}")
    current = {"from": HEAD_REVISION, "to": HEAD_REVISION}
    assert cli_json(capsys, "migrate", "--ledger-url", ledger_url) == current


def test_list_show_and_filters(capsys: pytest.CaptureFixture[str], ledger_url: str) -> None:
    """`list --json` has the contract's fields and filters; `show` adds the history."""
    ids = seed(ledger_url)
    listed = cli_json(capsys, "list", "--ledger-url", ledger_url)
    assert {e["idempotency_key"] for e in listed} == set(ids)
    for field in ("id", "idempotency_key", "state", "attempt", "tenant", "upstream", "tool"):
        assert field in listed[0]
    assert "created_at" in listed[0]
    assert "updated_at" in listed[0]
    unknown = cli_json(capsys, "list", "--state", "unknown", "--ledger-url", ledger_url)
    assert [(e["id"], e["error"]) for e in unknown] == [(ids["order-3"], "upstream timed out")]
    files = cli_json(capsys, "list", "--upstream", "files", "--ledger-url", ledger_url)
    assert [e["idempotency_key"] for e in files] == ["order-2"]
    several = cli_json(capsys, "list", "--state", "running,succeeded", "--ledger-url", ledger_url)
    assert {e["state"] for e in several} == {"running", "succeeded"}
    assert len(cli_json(capsys, "list", "--limit", "1", "--ledger-url", ledger_url)) == 1

    shown = cli_json(capsys, "show", "order-1", "--ledger-url", ledger_url)
    assert (shown["id"], shown["outcome"]) == (ids["order-1"], '{"sent": true}')
    assert [h["to_state"] for h in shown["history"]] == ["running", "succeeded"]

    status, out, _ = cli(capsys, "list", "--ledger-url", ledger_url)
    assert status == 0
    assert "3 entries" in out
    assert "upstream timed out" in out
    status, out, _ = cli(capsys, "show", ids["order-3"][:20], "--ledger-url", ledger_url)
    assert status == 0
    assert "history" in out
    assert "upstream timed out" in out


def test_resolve_and_its_refusals(capsys: pytest.CaptureFixture[str], ledger_url: str) -> None:
    """Resolving unknown works and is audited; running, unknown ids and bad values are refused."""
    ids = seed(ledger_url)
    resolved = cli_json(
        capsys,
        "resolve", "order-3", "--as", "succeeded", "--note", "found in outbox",
        "--actor", "operator:ann", "--ledger-url", ledger_url,
    )  # fmt: skip
    assert (resolved["state"], resolved["note"]) == ("succeeded", "found in outbox")
    shown = cli_json(capsys, "show", ids["order-3"], "--ledger-url", ledger_url)
    assert shown["history"][-1]["actor"] == "operator:ann"
    assert shown["history"][-1]["evidence"]["note"] == "found in outbox"

    status, _, err = cli(capsys, "resolve", "order-2", "--as", "failed", "--ledger-url", ledger_url)
    assert status == ledger_cli.EXIT_REFUSED
    assert "only unknown or blocked entries are resolved" in err
    status, _, err = cli(capsys, "show", "no-such-entry", "--ledger-url", ledger_url)
    assert status == ledger_cli.EXIT_REFUSED
    assert "no ledger entry matches 'no-such-entry'" in err
    with pytest.raises(SystemExit) as usage:
        cli(capsys, "resolve", "order-2", "--as", "done", "--ledger-url", ledger_url)
    assert usage.value.code == 2


def test_stats_and_purge(capsys: pytest.CaptureFixture[str], ledger_url: str) -> None:
    """`stats` counts by state × upstream; `purge` removes closed entries only."""
    seed(ledger_url)
    stats = cli_json(capsys, "stats", "--ledger-url", ledger_url)
    assert sorted((r["state"], r["upstream"], r["count"]) for r in stats) == [
        ("running", "files", 1),
        ("succeeded", "mail", 1),
        ("unknown", "mail", 1),
    ]
    status, out, _ = cli(capsys, "stats", "--ledger-url", ledger_url)
    assert status == 0
    assert "files" in out
    assert cli_json(capsys, "purge", "--older-than", "0s", "--ledger-url", ledger_url) == {
        "purged": 1
    }
    remaining = cli_json(capsys, "list", "--ledger-url", ledger_url)
    assert {e["state"] for e in remaining} == {"running", "unknown"}


def test_stats_show_waiting_deferred_work_and_its_oldest(
    capsys: pytest.CaptureFixture[str], ledger_url: str
) -> None:
    """`stats` counts accepted (deferred) work like any state and says since when the oldest
    has waited; `show` names its task and the size of the request it keeps."""

    async def defer(store: LedgerStore) -> str:
        result = await store.deferred.defer(
            claim_request("later"), b'{"v":1}', max_per_tenant=9, max_per_upstream=9
        )
        assert result.entry is not None
        return result.entry.id

    entry_id = with_store(ledger_url, defer)
    stats = cli_json(capsys, "stats", "--ledger-url", ledger_url)
    assert [(r["state"], r["count"]) for r in stats] == [("accepted", 1)]
    status, out, _ = cli(capsys, "stats", "--ledger-url", ledger_url)
    assert status == 0
    assert "accepted (deferred work waiting to start): 1" in out
    shown = cli_json(capsys, "show", entry_id, "--ledger-url", ledger_url)
    assert shown["request_bytes"] == 7
    assert len(shown["task_id"]) >= 32
    assert "request" not in shown


def test_missing_sqlite_ledger_is_not_created(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`list` on a SQLite file that does not exist says so and creates nothing."""
    path = tmp_path / "typo.db"
    status, _, err = cli(capsys, "list", "--ledger-url", f"sqlite:///{path}")
    assert status == ledger_cli.EXIT_UNAVAILABLE
    assert f"no ledger database at {path}" in err
    assert not path.exists()


def _interlock(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real `interlock` command in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_unreachable_database_exits_3_with_a_clear_message() -> None:
    """A refused connection is reported as an unavailable ledger, exit status 3."""
    result = _interlock("ledger", "list", "--ledger-url", "postgresql://postgres@127.0.0.1:9/x")
    assert result.returncode == ledger_cli.EXIT_UNAVAILABLE, result.stderr
    assert "ledger unavailable" in result.stderr


def test_interlock_reads_the_ledger_from_config_or_environment(
    ledger_backend: LedgerBackend, ledger_url: str, tmp_path: Path
) -> None:
    """`--config` (relative SQLite paths resolve against its folder) and INTERLOCK_LEDGER_URL."""
    folder = tmp_path / "conf"
    folder.mkdir()
    url = "sqlite:///ledger.db" if ledger_backend.pg_url is None else ledger_url
    config = folder / "interlock.yaml"
    config.write_text(
        f'ledger:\n  url: "{url}"\nupstreams:\n  mail:\n    mcp: "http://127.0.0.1:9/mcp"\n'
    )
    migrated = _interlock("ledger", "migrate", "--config", str(config))
    assert migrated.returncode == 0, migrated.stderr
    if ledger_backend.pg_url is None:
        assert (folder / "ledger.db").exists()
        ledger_url = f"sqlite:///{folder / 'ledger.db'}"
    seed(ledger_url)
    listed = _interlock("ledger", "list", "--json", env={"INTERLOCK_LEDGER_URL": ledger_url})
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 3

"""Races on one key — between tasks, stores and processes — on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import sqlalchemy as sa

from ledger import ClaimResult, EntryState, LedgerStore
from ledger.batch import OpContext
from ledger.db import open_engines
from ledger.entry_rules import new_row, start_attempt
from ledger.queries import ENTRIES
from policies.model import LedgerSettings
from tests import ledger_fixtures
from tests.ledger_fixtures import LedgerBackend, claim_request, read_child_json, spawn_ledger_child

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url
ledger_settings = ledger_fixtures.ledger_settings
ledger_store = ledger_fixtures.ledger_store

_DEADLINE_S = 60


def _kinds(results: list[ClaimResult]) -> list[str]:
    return sorted(r.kind for r in results)


async def test_fifty_tasks_racing_one_key_yield_exactly_one_new(ledger_store: LedgerStore) -> None:
    """Fifty concurrent claims of one key: one runs, forty-nine are told it is in progress."""
    results = await asyncio.gather(*(ledger_store.claim(claim_request("k")) for _ in range(50)))
    assert _kinds(results) == ["in_progress"] * 49 + ["new"]
    assert len({r.entry.id for r in results}) == 1
    assert len(await ledger_store.list_entries()) == 1


async def test_group_commit_shares_transactions(ledger_settings: LedgerSettings) -> None:
    """Concurrent claims share commits with group commit on, and take one each with it off."""
    for group_commit, check in ((True, lambda b: b < 10), (False, lambda b: b == 50)):
        settings = LedgerSettings(url=ledger_settings.url, group_commit=group_commit)
        store = await LedgerStore.open(settings, owner="r")
        try:
            keys = [f"gc-{group_commit}-{i}" for i in range(50)]
            results = await asyncio.gather(*(store.claim(claim_request(k)) for k in keys))
            assert {r.kind for r in results} == {"new"}
            assert store.writer_stats.operations == 50
            assert check(store.writer_stats.batches), store.writer_stats
        finally:
            await store.close()


@pytest.fixture
async def two_stores(ledger_settings: LedgerSettings) -> AsyncIterator[list[LedgerStore]]:
    stores = [await LedgerStore.open(ledger_settings, owner=f"replica-{i}") for i in range(2)]
    try:
        yield stores
    finally:
        for store in stores:
            await store.close()


async def test_two_replicas_racing_one_key(two_stores: list[LedgerStore]) -> None:
    """Two stores (two writers, two connections) racing one key: still exactly one new."""
    claims = [store.claim(claim_request("k")) for _ in range(25) for store in two_stores]
    results = await asyncio.gather(*claims)
    assert _kinds(results) == ["in_progress"] * 49 + ["new"]
    owner = next(r.entry.owner for r in results if r.kind == "new")
    assert {r.entry.owner for r in results} == {owner}


async def test_two_replicas_deferring_at_once_keep_a_tenants_bound_on_accepted_work(
    two_stores: list[LedgerStore],
) -> None:
    """Two replicas each accept five deferred calls of one tenant at the same moment, with at
    most five waiting per tenant: five are accepted in all, five are told the tenant is full.
    (Each replica counts the tenant's waiting work in its own transaction; on PostgreSQL two
    counts under READ COMMITTED saw none of each other's rows until both had inserted.)"""
    for attempt in range(3):  # each attempt a fresh tenant: every one must keep the bound
        tenant = f"bounded-{attempt}"
        results = await asyncio.wait_for(
            asyncio.gather(
                *(
                    store.deferred.defer(
                        claim_request(f"{tenant}-{n}-{i}", tenant=tenant),
                        b"{}",
                        max_per_tenant=5,
                        max_per_upstream=1000,
                    )
                    for n, store in enumerate(two_stores)
                    for i in range(5)
                )
            ),
            _DEADLINE_S,
        )
        assert sorted(r.kind for r in results) == ["accepted"] * 5 + ["full"] * 5, attempt


async def test_two_processes_racing_one_key(ledger_store: LedgerStore, ledger_url: str) -> None:
    """Two processes fire 25 claims each at one key at the same moment: exactly one new."""
    children = [await spawn_ledger_child("race", ledger_url, "k", "25") for _ in range(2)]
    try:
        for child in children:
            assert (await read_child_json(child)) == {"ready": True}
        for child in children:
            assert child.stdin is not None
            child.stdin.write(b"go\n")
            await child.stdin.drain()
        reports = [await read_child_json(child) for child in children]
        for child in children:
            assert await asyncio.wait_for(child.wait(), _DEADLINE_S) == 0
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
                await child.wait()
    kinds = sorted(k for report in reports for k in report["kinds"])
    assert kinds == ["in_progress"] * 49 + ["new"]
    assert {i for report in reports for i in report["ids"]} == {
        e.id for e in await ledger_store.list_entries()
    }


async def _race_children(url: str, prefixes: list[str], n: int) -> list[list[list[Any]]]:
    """Two processes claim the same `n` keys at the same moment, once per prefix (a round each);
    every claim they report, per round."""
    children = [await spawn_ledger_child("race_keys", url, str(n)) for _ in range(2)]
    rounds = []
    try:
        for child in children:
            assert (await read_child_json(child)) == {"ready": True}
        for prefix in [*prefixes, ""]:
            for child in children:
                assert child.stdin is not None
                child.stdin.write(f"{prefix}\n".encode())
                await child.stdin.drain()
            if prefix:
                reports = [await read_child_json(child) for child in children]
                rounds.append([claim for report in reports for claim in report["claims"]])
        for child in children:
            assert await asyncio.wait_for(child.wait(), _DEADLINE_S) == 0
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
                await child.wait()
    return rounds


def _one_new_per_key(claims: list[list[Any]], n: int, prefix: str, attempt: int) -> None:
    new = sorted((key, at) for key, kind, at in claims if kind == "new")
    assert len(new) == n, f"{len(new) - n} key(s) started twice by two processes"
    assert new == sorted((f"{prefix}-{i}", attempt) for i in range(n))
    assert {kind for _, kind, _ in claims} <= {"new", "in_progress"}


_RACED_KEYS = 100
_ROUNDS = 4


async def test_two_processes_racing_rejected_keys_start_each_once(
    ledger_store: LedgerStore, ledger_url: str
) -> None:
    """Keys whose calls were refused (rejected) are sent again by two processes at the same
    moment, in four rounds: each key starts its next attempt in exactly one of them
    (rejected → running)."""
    prefixes = [f"rej{r}" for r in range(_ROUNDS)]
    for prefix in prefixes:
        await asyncio.gather(
            *(
                ledger_store.record_rejection(
                    claim_request(f"{prefix}-{i}"),
                    reason="overloaded",
                    scope="global",
                    retry_after_s=1,
                )
                for i in range(_RACED_KEYS)
            )
        )
    rounds = await _race_children(ledger_url, prefixes, _RACED_KEYS)
    for prefix, claims in zip(prefixes, rounds, strict=True):
        _one_new_per_key(claims, _RACED_KEYS, prefix, attempt=1)
    running = await ledger_store.list_entries(state="running", limit=1000)
    assert len(running) == _RACED_KEYS * _ROUNDS


async def test_two_processes_racing_operator_retried_keys_start_each_once(
    ledger_store: LedgerStore, ledger_url: str
) -> None:
    """Keys an operator retried (accepted, waiting for their caller) are sent again by two
    processes at the same moment, in four rounds: each runs its next attempt in exactly one
    (accepted → running)."""
    prefixes = [f"acc{r}" for r in range(_ROUNDS)]
    for prefix in prefixes:
        claims = await asyncio.gather(
            *(ledger_store.claim(claim_request(f"{prefix}-{i}")) for i in range(_RACED_KEYS))
        )
        await asyncio.gather(
            *(
                ledger_store.mark_unknown(c.entry.id, c.entry.fencing_token, reason="t/o")
                for c in claims
            )
        )
        await asyncio.gather(
            *(ledger_store.resolve(c.entry.id, as_="retry", note=None, actor="op") for c in claims)
        )
    rounds = await _race_children(ledger_url, prefixes, _RACED_KEYS)
    for prefix, claims_seen in zip(prefixes, rounds, strict=True):
        _one_new_per_key(claims_seen, _RACED_KEYS, prefix, attempt=2)
    running = await ledger_store.list_entries(state="running", limit=1000)
    assert len(running) == _RACED_KEYS * _ROUNDS


async def test_claim_that_loses_the_insert_race_sees_the_winner(
    ledger_store: LedgerStore, ledger_settings: LedgerSettings, ledger_backend: LedgerBackend
) -> None:
    """A claim blocked behind another transaction's uncommitted insert of its key answers
    in_progress with the winner's entry once that transaction commits (no duplicate, no error)."""
    engines = open_engines(ledger_settings)
    ctx = OpContext(ledger_fixtures.FakeClock()(), "other-replica", 30, 64, 64)
    req = claim_request("k")
    winner = new_row(req, ctx, EntryState.RUNNING)
    start_attempt(winner, req, ctx)
    try:
        async with engines.write.connect() as conn:
            transaction = await conn.begin()
            await conn.execute(sa.insert(ENTRIES), [winner.values()])
            claim = asyncio.create_task(ledger_store.claim(req))
            if ledger_backend.name == "postgres":
                assert await _waits_for_a_lock(engines.read), "the claim never reached the insert"
            await transaction.commit()
            result = await asyncio.wait_for(claim, _DEADLINE_S)
    finally:
        await engines.dispose()
    assert (result.kind, result.entry.id, result.entry.owner) == (
        "in_progress",
        winner.id,
        "other-replica",
    )


async def _waits_for_a_lock(engine: Any) -> bool:
    """Poll (bounded) until some backend of this database waits on a lock."""
    query = sa.text(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE NOT l.granted AND a.datname = current_database()"
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    async with engine.connect() as conn:
        while loop.time() < deadline:
            if (await conn.execute(query)).scalar():
                return True
            await conn.rollback()
            await asyncio.sleep(0.01)
    return False

"""Random sequences of ledger operations against the real databases (hypothesis)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import EntryState, LedgerError, LedgerStore, StaleToken
from ledger.states import is_legal
from policies.model import LedgerSettings
from tests import ledger_fixtures
from tests.ledger_fixtures import FakeClock, claim_request

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url

S = EntryState
_KEYS = st.sampled_from(["k0", "k1", "k2"])
_STEPS = st.one_of(
    st.tuples(st.just("claim"), _KEYS, st.sampled_from(["a" * 64, "b" * 64])),
    st.tuples(st.just("finish"), _KEYS, st.sampled_from(["succeeded", "failed"]), st.booleans()),
    st.tuples(st.just("mark_unknown"), _KEYS, st.booleans()),
    st.tuples(st.just("renew"), _KEYS, st.booleans()),
    st.tuples(st.just("expire"), st.sampled_from([0.5, 5.0, 11.0])),
    st.tuples(st.just("resolve"), _KEYS, st.sampled_from(["succeeded", "failed", "retry"])),
    st.tuples(st.just("reject"), _KEYS),
    st.tuples(st.just("release"), _KEYS, st.booleans()),
)


@pytest.fixture
async def clocked_store(ledger_url: str) -> AsyncIterator[tuple[LedgerStore, FakeClock]]:
    clock = FakeClock()
    store = await LedgerStore.open(
        LedgerSettings(url=ledger_url, lease_s=10), owner="replica-a", clock=clock
    )
    try:
        yield store, clock
    finally:
        await store.close()


async def _step(
    store: LedgerStore, clock: FakeClock, tenant: str, ids: dict[str, str], step: tuple[Any, ...]
) -> None:
    name, key = step[0], step[1]
    entry_id = ids.get(key, "0" * 32) if isinstance(key, str) else ""
    token = (await store.get(entry_id))[0].fencing_token if entry_id in ids.values() else 1
    try:
        if name == "claim":
            result = await store.claim(claim_request(key, tenant=tenant, fingerprint=step[2]))
            ids.setdefault(key, result.entry.id)
            if result.kind == "new":
                assert result.entry.state is S.RUNNING
                assert result.entry.owner == "replica-a"
        elif name == "finish":
            current = step[3]
            done = await store.finish(
                entry_id, token if current else token - 1, state=step[2], outcome=b"o"
            )
            assert current, "a stale token finished an entry"
            assert done.state is S(step[2])
        elif name == "mark_unknown":
            await store.mark_unknown(entry_id, token if step[2] else token - 1, reason="t/o")
        elif name == "renew":
            await store.renew(entry_id, token if step[2] else token - 1)
        elif name == "expire":
            clock.advance(step[1])
            await store.sweep_expired()
        elif name == "resolve" and entry_id in ids.values():
            await store.resolve(entry_id, as_=step[2], note="n", actor="op", max_attempts=2)
        elif name == "release":
            await store.release_unsent(
                entry_id, token if step[2] else token - 1, reason="429", retry_after_s=1
            )
        elif name == "reject":
            req = claim_request(key, tenant=tenant)
            rejected = await store.record_rejection(req, reason="busy", scope="g", retry_after_s=1)
            if rejected is not None:
                ids.setdefault(key, rejected.id)
    except StaleToken:
        assert name in ("finish", "mark_unknown", "release")
        assert not step[-1], "the current token was called stale"
    except LedgerError:
        pass  # a typed refusal; the checks below prove nothing was damaged


async def _check(store: LedgerStore, ids: dict[str, str]) -> None:
    for entry_id in ids.values():
        entry, history = await store.get(entry_id)  # never lost
        current: S | None = None
        for row in history:
            assert row.from_state is current
            if row.to_state is not current:
                assert is_legal(current, row.to_state), (current, row.to_state)
            current = row.to_state
        assert current is entry.state
        tokens = [row.fencing_token for row in history]
        assert tokens == sorted(tokens)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(_STEPS, min_size=1, max_size=14))
async def test_random_operations_on_a_real_database(
    clocked_store: tuple[LedgerStore, FakeClock], steps: list[tuple[Any, ...]]
) -> None:
    """Whatever the order of claims, finishes, expiries, resolves and refusals, every entry
    stays reachable, moved only by legal transitions, with fencing tokens that never go back."""
    store, clock = clocked_store
    tenant = f"t-{uuid.uuid4().hex}"  # each example has keys of its own
    ids: dict[str, str] = {}
    for step in steps:
        await _step(store, clock, tenant, ids, step)
        await _check(store, ids)

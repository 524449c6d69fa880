"""`ledger.commit_delay_ms`: a write waits (at most that long) for the writes of the other calls
in flight, so that they share one durable commit; a write with no other call in flight never
waits, and the wait ends as soon as every call in flight has queued its write.

Each test uses a long delay (30 s) where the point is that nothing waits for it: a write held
for the delay would fail the test's 10 s bound, not merely slow it down.
"""

from __future__ import annotations

import asyncio

import pytest

from ledger import LedgerStore, LedgerUnavailable
from policies.config import ConfigError, parse_config_text
from policies.model import LedgerSettings
from tests import ledger_fixtures
from tests.ledger_fixtures import claim_request

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url
ledger_settings = ledger_fixtures.ledger_settings

_LONG_MS = 30_000.0
_UPSTREAMS = 'upstreams: {mail: {mcp: "http://127.0.0.1:9/mcp"}}\n'
_BOUND_S = 10.0  # far below the long delay: a write that waited for it fails here


async def _open(settings: LedgerSettings, delay_ms: float) -> LedgerStore:
    delayed = LedgerSettings(url=settings.url, commit_delay_ms=delay_ms)
    return await LedgerStore.open(delayed, owner="r")


async def test_a_write_waits_for_the_call_in_flight_and_shares_its_commit(
    ledger_settings: LedgerSettings,
) -> None:
    store = await _open(ledger_settings, _LONG_MS)
    try:
        first = await asyncio.wait_for(store.claim(claim_request("delay-a")), _BOUND_S)
        assert first.kind == "new"  # nothing else was in flight: committed without waiting
        batches = store.writer_stats.batches

        second = asyncio.create_task(store.claim(claim_request("delay-b")))
        await asyncio.sleep(0.2)
        assert not second.done(), "the claim committed without waiting for the call in flight"

        entry = first.entry
        finish = store.finish(entry.id, entry.fencing_token, state="succeeded", outcome=b"ok")
        done, claimed = await asyncio.wait_for(asyncio.gather(finish, second), _BOUND_S)
        assert done.state == "succeeded"
        assert claimed.kind == "new"
        assert store.writer_stats.batches == batches + 1  # the claim and the finish: one commit
    finally:
        await store.close()


async def test_a_write_with_no_other_call_in_flight_never_waits(
    ledger_settings: LedgerSettings,
) -> None:
    store = await _open(ledger_settings, _LONG_MS)
    try:
        for key in ("alone-1", "alone-2"):
            claimed = await asyncio.wait_for(store.claim(claim_request(key)), _BOUND_S)
            entry = claimed.entry
            await asyncio.wait_for(
                store.finish(entry.id, entry.fencing_token, state="succeeded", outcome=b"ok"),
                _BOUND_S,
            )
        assert store.writer_stats.batches == 4  # each write its own commit, none held back
    finally:
        await store.close()


async def test_every_way_a_call_ends_stops_it_holding_writes_back(
    ledger_settings: LedgerSettings,
) -> None:
    """A call in flight ends by its finish, its `unknown` or its release: after any of them, a
    lone write does not wait for it."""
    store = await _open(ledger_settings, _LONG_MS)
    try:
        ends = {
            "finish": lambda e: store.finish(e.id, e.fencing_token, state="failed", outcome=None),
            "unknown": lambda e: store.mark_unknown(e.id, e.fencing_token, reason="test"),
            "release": lambda e: store.release_unsent(
                e.id, e.fencing_token, reason="test", retry_after_s=None
            ),
        }
        for how, end in ends.items():
            claimed = await asyncio.wait_for(store.claim(claim_request(f"end-{how}")), _BOUND_S)
            await asyncio.wait_for(end(claimed.entry), _BOUND_S)
            after = await asyncio.wait_for(store.claim(claim_request(f"after-{how}")), _BOUND_S)
            await asyncio.wait_for(
                store.finish(
                    after.entry.id, after.entry.fencing_token, state="succeeded", outcome=b"ok"
                ),
                _BOUND_S,
            )
    finally:
        await store.close()


async def test_the_wait_is_bounded_by_the_delay(ledger_settings: LedgerSettings) -> None:
    """A call in flight that never writes holds the others back for the delay, no longer."""
    store = await _open(ledger_settings, 200.0)
    try:
        await store.claim(claim_request("slow-call"))  # stays in flight for the whole test
        claimed = await asyncio.wait_for(store.claim(claim_request("held")), _BOUND_S)
        assert claimed.kind == "new"
    finally:
        await store.close()


async def test_closing_the_store_ends_a_wait(ledger_settings: LedgerSettings) -> None:
    store = await _open(ledger_settings, _LONG_MS)
    await store.claim(claim_request("in-flight"))
    held = asyncio.create_task(store.claim(claim_request("held-at-close")))
    await asyncio.sleep(0.2)
    assert not held.done()
    await asyncio.wait_for(store.close(), _BOUND_S)
    assert (await held).kind == "new"  # committed by the close, not dropped


async def test_a_write_held_by_a_writer_that_dies_fails_instead_of_waiting_forever(
    ledger_settings: LedgerSettings,
) -> None:
    """The held write is out of the queue while it waits: if the writer task dies then, its
    caller hears `LedgerUnavailable` (as the queued ones do), and the next write goes through."""
    store = await _open(ledger_settings, _LONG_MS)
    try:
        first = (await store.claim(claim_request("keeps-it-waiting"))).entry
        held = asyncio.create_task(store.claim(claim_request("held-when-it-dies")))
        await asyncio.sleep(0.2)
        assert not held.done()
        store._writer._task.cancel()  # the writer dying while it waits
        with pytest.raises(LedgerUnavailable):
            await asyncio.wait_for(held, _BOUND_S)
        finish = store.finish(first.id, first.fencing_token, state="succeeded", outcome=b"ok")
        assert (await asyncio.wait_for(finish, _BOUND_S)).state == "succeeded"
        after = await asyncio.wait_for(store.claim(claim_request("after-it-died")), _BOUND_S)
        assert after.kind == "new"
    finally:
        await store.close()


async def test_a_write_held_by_a_writer_that_dies_of_an_error_is_told_that_error(
    ledger_settings: LedgerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer dies of a bug while it holds a write (here the count of calls in flight
    raises): the held write's error names that bug, as the queued writes' do, not a
    cancellation that never happened."""
    store = await _open(ledger_settings, _LONG_MS)
    try:
        await store.claim(claim_request("keeps-it-waiting"))

        def broken() -> int:
            raise RuntimeError("count bug")

        monkeypatch.setattr(store._writer, "_in_flight", broken)
        held = asyncio.create_task(store.claim(claim_request("held-when-it-dies")))
        with pytest.raises(LedgerUnavailable, match=r"died: RuntimeError\('count bug'\)"):
            await asyncio.wait_for(held, _BOUND_S)
    finally:
        monkeypatch.undo()
        await store.close()


@pytest.mark.parametrize("value", ["-1", "1001", '"soon"'])
def test_a_commit_delay_out_of_range_is_refused_by_name(value: str) -> None:
    with pytest.raises(ConfigError, match="commit_delay_ms"):
        parse_config_text(f"{_UPSTREAMS}ledger: {{commit_delay_ms: {value}}}\n")


def test_a_commit_delay_that_could_outlast_a_lease_renewal_is_refused() -> None:
    """A renewal is a write too: one held for a third of the lease could let the lease lapse."""
    text = f"{_UPSTREAMS}ledger: {{lease_s: 1, commit_delay_ms: 200}}\n"
    with pytest.raises(ConfigError, match=r"commit_delay_ms.*a tenth of ledger.lease_s"):
        parse_config_text(text)
    fits = parse_config_text(f"{_UPSTREAMS}ledger: {{lease_s: 1, commit_delay_ms: 100}}\n")
    assert fits.ledger.commit_delay_ms == 100


def test_the_commit_delay_is_off_unless_configured() -> None:
    assert parse_config_text(_UPSTREAMS).ledger.commit_delay_ms == 0.0
    configured = parse_config_text(f"{_UPSTREAMS}ledger: {{commit_delay_ms: 5}}\n")
    assert configured.ledger.commit_delay_ms == 5.0

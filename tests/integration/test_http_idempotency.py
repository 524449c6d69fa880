"""Side-effecting HTTP calls through the proxy: write-ahead, Idempotency-Key semantics, unknowns."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest

from tests import ledger_fixtures
from tests.integration import fake_provider
from tests.integration.fake_provider import FakeProvider, wait_until
from tests.integration.http_calls import post, settled
from tests.integration.proxy_harness import RunningProxy, running_proxy

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url

ACTIONS = "/http/fake/v1/actions"


def config(provider: FakeProvider, ledger: str, extra: str = "") -> str:
    return f"""
        ledger: {{url: "{ledger}", lease_s: 5, max_outcome_bytes: 4096}}
        defaults: {{timeout_s: 2, deadline_s: 5}}
        upstreams:
          fake:
            http: "{provider.url}"
            kind: openai
            retry: {{max_attempts: 3, base_delay_s: 0.01}}
        {extra}
        """


provider = fake_provider.provider


@pytest.fixture
async def proxy(provider: FakeProvider, tmp_path: Path) -> AsyncIterator[RunningProxy]:
    async with running_proxy(config(provider, "sqlite:///ledger.db"), tmp_path) as running:
        yield running


async def test_duplicate_delivery_executes_once(
    provider: FakeProvider, tmp_path: Path, ledger_url: str
) -> None:
    """Two deliveries at once: one runs, the other gets 409; a later one replays the stored
    answer byte-identical with Idempotent-Replayed: true. The upstream acted once (both ledgers)."""
    async with running_proxy(config(provider, ledger_url), tmp_path) as proxy:
        provider.action_gate = asyncio.Event()
        body = {"to": "bob@example.com", "amount": 5}
        first = asyncio.create_task(post(proxy, body, "pay-1"))
        await wait_until(lambda: provider.executions["pay-1"] == 1)
        status, _, conflict = await post(proxy, body, "pay-1")
        assert status == 409
        assert json.loads(conflict)["error"]["reason"] == "in_progress"
        provider.action_gate.set()
        status, headers, original = await first
        assert status == 201
        assert "Idempotent-Replayed" not in headers
        status, headers, replayed = await post(proxy, body, "pay-1")
        assert status == 201
        assert headers["Idempotent-Replayed"] == "true"
        assert headers["X-Fake-Action"] == "done"
        assert replayed == original
        entry, _ = await proxy.store.get("pay-1")
        assert entry.state == "succeeded"
        assert entry.tool == "POST /v1/actions"
    assert provider.executions["pay-1"] == 1
    assert provider.count() == 1


async def test_same_key_other_payload_is_422(proxy: RunningProxy, provider: FakeProvider) -> None:
    """Reusing a key with a different body is refused with 422 and nothing is forwarded."""
    assert (await post(proxy, {"n": 1}, "k-422"))[0] == 201
    status, _, body = await post(proxy, {"n": 2}, "k-422")
    assert status == 422
    assert json.loads(body)["error"]["reason"] == "idempotency_key_mismatch"
    assert provider.count() == 1


async def test_same_key_on_another_path_is_422_not_a_replay(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """The key and body of an earlier call sent to another path are another operation: 422
    idempotency_key_mismatch, nothing forwarded, never the first call's answer."""
    assert (await post(proxy, {"amount": 500}, "k-op"))[0] == 201
    path = "/http/fake/v1/threads/t1/messages"
    status, headers, body = await post(proxy, {"amount": 500}, "k-op", path=path)
    assert status == 422
    assert "Idempotent-Replayed" not in headers
    assert json.loads(body)["error"]["reason"] == "idempotency_key_mismatch"
    assert provider.count() == 1


async def test_key_order_does_not_change_the_fingerprint(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """The same JSON with keys in another order is the same request (a replay, not a 422)."""
    await post(proxy, {"a": 1, "b": 2}, "k-order")
    status, headers, _ = await post(proxy, {"b": 2, "a": 1}, "k-order")
    assert status == 201
    assert headers["Idempotent-Replayed"] == "true"
    assert provider.count() == 1


async def test_lost_connection_after_sending_is_unknown_and_never_resent(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """An upstream that acts and then drops the connection leaves the entry `unknown` (504 with
    the entry id); the same key then needs reconciliation (409) and is not sent again."""
    provider.script("die")
    status, _, body = await post(proxy, {"n": 1}, "k-lost")
    error = json.loads(body)["error"]
    assert status == 504
    assert (error["reason"], error["state"]) == ("outcome_unknown", "unknown")
    entry, _ = await proxy.store.get("k-lost")
    assert entry.state == "unknown"
    assert error["entry_id"] == entry.id
    status, _, body = await post(proxy, {"n": 1}, "k-lost")
    assert status == 409
    assert json.loads(body)["error"]["state"] == "unknown"
    assert provider.executions["k-lost"] == 1
    assert provider.count() == 1


async def test_sdk_retries_after_an_unknown_do_not_execute_twice(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """The OpenAI SDK retries a 504 and then the 409 with the same Idempotency-Key; the side
    effect still happens once and the SDK ends with the conflict."""
    provider.script("die")
    async with openai.AsyncOpenAI(
        base_url=f"{proxy.base}/http/fake/v1", api_key="k", max_retries=2
    ) as client:
        with pytest.raises(openai.ConflictError):
            await client.post(
                "/actions",
                body={"to": "carol"},
                cast_to=object,
                options={"headers": {"Idempotency-Key": "k-sdk"}},
            )
    assert provider.executions["k-sdk"] == 1


async def test_upstream_500_after_sending_is_unknown(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """A 5xx answer to a side-effecting call may hide an effect: the entry becomes unknown."""
    provider.script("error")
    status, _, body = await post(proxy, {"n": 1}, "k-500")
    assert status == 504
    assert json.loads(body)["error"]["state"] == "unknown"
    entry, _ = await proxy.store.get("k-500")
    assert entry.state == "unknown"


async def test_pressure_releases_the_key_for_a_later_send(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """A 429 before processing means not executed: the caller is refused with Retry-After, the
    entry is `rejected`, and the same key runs once the cooldown is over (attempt 2)."""
    provider.script("429:retry-after:1")
    status, headers, _ = await post(proxy, {"n": 1}, "k-429")
    assert status == 429
    assert headers["Retry-After"] == "1"
    entry, _ = await proxy.store.get("k-429")
    assert entry.state == "rejected"
    await wait_until(lambda: proxy.scheduler.cooldown_remaining("fake") == 0)
    status, _, _ = await post(proxy, {"n": 1}, "k-429")
    assert status == 201
    entry = await settled(proxy, "k-429", "succeeded")
    assert (entry.state, entry.attempt) == ("succeeded", 2)
    assert provider.executions["k-429"] == 1


async def test_admission_refusal_of_a_side_effect_is_recorded(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """A side-effecting call refused by admission (cooldown) is a durable `rejected` entry."""
    provider.script("429:retry-after:3")
    await post(proxy, {"warm": 1}, "k-warm")
    status, _, body = await post(proxy, {"n": 1}, "k-refused")
    assert status == 429
    assert json.loads(body)["error"]["idempotency_key"] == "k-refused"
    entry = await settled(proxy, "k-refused", "rejected")  # written behind the answer
    assert entry.state == "rejected"
    assert provider.count() == 1


async def test_upstream_4xx_is_recorded_failed_and_replayed(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """A 4xx is the upstream's answer: relayed, recorded `failed`, and replayed to a retry with
    the same key (a declined charge must not be attempted again)."""
    status, _, body = await post(proxy, {"n": 1}, "k-404", path="/http/fake/v1/unknown-route")
    assert status == 404
    entry = await settled(proxy, "k-404", "failed")
    assert entry.state == "failed"
    again, headers, replayed = await post(
        proxy, {"n": 1}, "k-404", path="/http/fake/v1/unknown-route"
    )
    assert again == 404
    assert headers["Idempotent-Replayed"] == "true"
    assert replayed == body
    assert provider.count() == 1


async def test_large_outcome_is_not_replayed_as_a_success(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """An answer over max_outcome_bytes is kept as a hash: a repeat gets 409
    outcome_not_retained with the entry's state and id, never a 2xx it could take for the answer."""
    big = {"blob": "x" * 5000}
    assert (await post(proxy, big, "k-big"))[0] == 201
    status, headers, body = await post(proxy, big, "k-big")
    error = json.loads(body)["error"]
    entry = await settled(proxy, "k-big", "succeeded")
    assert status == 409
    assert "Idempotent-Replayed" not in headers
    assert (error["reason"], error["state"], error["entry_id"]) == (
        "outcome_not_retained",
        "succeeded",
        entry.id,
    )
    assert provider.count() == 1


async def test_an_entry_resolved_failed_by_an_operator_is_not_replayed_as_a_success(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """An unknown entry an operator resolved `failed` has no stored answer: a resend gets 409
    outcome_not_retained with state failed, not a 200 marked as a replay."""
    provider.script("die")
    assert (await post(proxy, {"n": 1}, "k-resolved"))[0] == 504
    await proxy.store.resolve("k-resolved", as_="failed", note="bank says no", actor="sre")
    status, headers, body = await post(proxy, {"n": 1}, "k-resolved")
    error = json.loads(body)["error"]
    assert (status, error["reason"], error["state"]) == (409, "outcome_not_retained", "failed")
    assert "Idempotent-Replayed" not in headers
    assert provider.count() == 1


async def test_derived_key_dedupes_without_an_explicit_key(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """Without Idempotency-Key, the derived key (same tenant, path, body) still dedupes."""
    await post(proxy, {"n": 7})
    status, headers, _ = await post(proxy, {"n": 7})
    assert status == 201
    assert headers["Idempotent-Replayed"] == "true"
    status, headers, _ = await post(proxy, {"n": 7}, headers={"X-Interlock-Tenant": "other"})
    assert "Idempotent-Replayed" not in headers
    assert provider.count() == 2


async def test_ledger_down_fails_closed_for_side_effects_only(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """With the ledger unreachable, side-effecting calls get 503 and are not sent; model calls
    and GETs still pass."""
    down = "postgresql://postgres@127.0.0.1:1/nothing"
    async with running_proxy(config(provider, down), tmp_path) as proxy:
        status, headers, body = await post(proxy, {"n": 1}, "k-down")
        assert status == 503
        assert json.loads(body)["error"]["reason"] == "ledger_unavailable"
        assert "Retry-After" in headers
        chat = {"model": "m", "messages": []}
        assert (await post(proxy, chat, path="/http/fake/v1/chat/completions"))[0] == 200
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{proxy.base}/http/fake/v1/models") as response,
        ):
            assert response.status == 200
    assert [r.path for r in provider.received] == ["/v1/chat/completions", "/v1/models"]


async def test_query_string_is_part_of_the_request(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """The same key and body with another query string is another request (422), and without an
    explicit key another derived key (executed)."""
    assert (await post(proxy, {"n": 1}, "k-q", path=f"{ACTIONS}?mode=a"))[0] == 201
    assert (await post(proxy, {"n": 1}, "k-q", path=f"{ACTIONS}?mode=b"))[0] == 422
    assert (await post(proxy, {"n": 2}, path=f"{ACTIONS}?mode=a"))[0] == 201
    status, headers, _ = await post(proxy, {"n": 2}, path=f"{ACTIONS}?mode=b")
    assert status == 201
    assert "Idempotent-Replayed" not in headers
    assert provider.count() == 3


async def test_body_without_a_canonical_form_is_refused_unsent(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """A JSON body with NaN has no canonical form for its key: 400 invalid_arguments, unsent."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{proxy.base}{ACTIONS}",
            data=b'{"n": NaN}',
            headers={"Content-Type": "application/json", "Idempotency-Key": "k-nan"},
        ) as response,
    ):
        body = await response.json()
    assert response.status == 400
    assert body["error"]["reason"] == "invalid_arguments"
    assert provider.count() == 0


async def test_a_retry_after_429_is_the_next_ledger_attempt(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """A background POST that met a 429 waits the cooldown out and is retried as attempt 2 of
    the same entry; the upstream executed it once."""
    provider.script("429:retry-after:1")
    status, _, _ = await post(proxy, {"n": 1}, "k-bg", headers={"X-Interlock-Class": "background"})
    assert status == 201
    entry = await settled(proxy, "k-bg", "succeeded")
    assert (entry.state, entry.attempt) == ("succeeded", 2)
    _, history = await proxy.store.get("k-bg")
    assert [str(h.to_state) for h in history] == ["running", "rejected", "running", "succeeded"]
    assert provider.executions["k-bg"] == 1

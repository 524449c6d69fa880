"""The operator API: guarded by a bearer token (or loopback), and it reads and resolves entries."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from ledger import ClaimRequest
from tests.integration.proxy_harness import running_proxy

CONFIG = """
    ledger: {url: "sqlite:///ledger.db"}
    admin: {token_env: INTERLOCK_TEST_ADMIN_TOKEN}
    upstreams:
      up: {mcp: "http://127.0.0.1:9/mcp"}
"""


def claim(key: str) -> ClaimRequest:
    return ClaimRequest(
        tenant="acme",
        upstream="up",
        tool="send_email",
        idempotency_key=key,
        key_source="explicit",
        fingerprint="f" * 64,
    )


async def test_token_is_required_when_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """With the token variable set, /admin answers 401 without it and 200 with it."""
    monkeypatch.setenv("INTERLOCK_TEST_ADMIN_TOKEN", "s3cret")
    async with running_proxy(CONFIG, tmp_path) as proxy, aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.base}/admin/stats") as answer:
            assert answer.status == 401
        wrong = {"Authorization": "Bearer nope"}
        async with http.get(f"{proxy.base}/admin/stats", headers=wrong) as answer:
            assert answer.status == 401
        right = {"Authorization": "Bearer s3cret"}
        async with http.get(f"{proxy.base}/admin/stats", headers=right) as answer:
            assert answer.status == 200
            body = await answer.json()
    assert "scheduler" in body
    assert "ledger" in body


async def test_list_show_and_resolve_an_unknown_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Without a token (loopback caller) an operator lists unknown entries and resolves one."""
    monkeypatch.delenv("INTERLOCK_TEST_ADMIN_TOKEN", raising=False)
    async with running_proxy(CONFIG, tmp_path) as proxy, aiohttp.ClientSession() as http:
        claimed = await proxy.store.claim(claim("k-1"))
        await proxy.store.mark_unknown(
            claimed.entry.id, claimed.entry.fencing_token, reason="timeout"
        )
        async with http.get(f"{proxy.base}/admin/ledger?state=unknown") as answer:
            listed = await answer.json()
        assert [e["idempotency_key"] for e in listed] == ["k-1"]
        entry_id = listed[0]["id"]
        async with http.get(f"{proxy.base}/admin/ledger/{entry_id}") as answer:
            shown = await answer.json()
        assert [h["to_state"] for h in shown["history"]] == ["running", "unknown"]
        resolve = f"{proxy.base}/admin/ledger/{entry_id}/resolve"
        async with http.post(resolve, json={"as": "succeeded", "note": "seen"}) as answer:
            assert answer.status == 200
            assert (await answer.json())["state"] == "succeeded"
        async with http.post(resolve, json={"as": "failed"}) as answer:
            assert answer.status == 409  # succeeded is final: an illegal transition
        async with http.post(resolve, json={"as": "maybe"}) as answer:
            assert answer.status == 400
        async with http.get(f"{proxy.base}/admin/ledger/no-such-entry") as answer:
            assert answer.status == 404


async def test_readyz_reports_a_ledger_that_is_down(tmp_path: Path):
    """/healthz stays up while /readyz says why the proxy is not ready — without the database's
    own error text (addresses, user names), which only the operator API and the log carry."""
    down = CONFIG.replace('"sqlite:///ledger.db"', '"postgresql+asyncpg://postgres@127.0.0.1:9/x"')
    async with running_proxy(down, tmp_path) as proxy, aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.base}/healthz") as answer:
            assert answer.status == 200
        async with http.get(f"{proxy.base}/readyz") as answer:
            assert answer.status == 503
            body = await answer.text()
        assert json.loads(body) == {"status": "ledger_unavailable"}
        async with http.get(f"{proxy.base}/admin/stats") as answer:
            stats = await answer.json()
        assert "Connect call failed" in stats["ledger_error"]
    async with (
        running_proxy(CONFIG, tmp_path) as proxy,
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.base}/readyz") as answer,
    ):
        assert answer.status == 200


async def test_pause_refuses_new_calls_until_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """POST /admin/scopes/tenant:acme/pause makes admission refuse that tenant with `paused`."""
    from policies.admission import AdmissionRequest
    from proxy.runtime.scheduler import AdmissionRefused

    monkeypatch.delenv("INTERLOCK_TEST_ADMIN_TOKEN", raising=False)
    async with running_proxy(CONFIG, tmp_path) as proxy, aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.base}/admin/scopes/tenant:acme/pause", json={}) as answer:
            assert answer.status == 200
        request = AdmissionRequest(tenant="acme", work_class="interactive", upstream="up")
        with pytest.raises(AdmissionRefused) as refused:
            await proxy.scheduler.admit(request)
        assert refused.value.refusal.reason == "paused"
        async with http.post(f"{proxy.base}/admin/scopes/tenant:acme/resume", json={}) as answer:
            assert answer.status == 200
        slot = await proxy.scheduler.admit(request)
        slot.release()
        async with http.post(f"{proxy.base}/admin/scopes/not a scope/pause", json={}) as answer:
            assert answer.status == 400
        async with http.post(f"{proxy.base}/admin/upstreams/nope/end-cooldown", json={}) as answer:
            assert answer.status == 404

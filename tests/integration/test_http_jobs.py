"""HTTP deferred work: `Prefer: respond-async` on a saturated upstream gives 202 and a job; the
job runs when a slot frees and its answer is what the call would have answered live; it can be
cancelled before it starts (then it never runs); only its tenant can see it; bounds hold."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from ledger import EntryState
from tests.integration import fake_provider, otlp_receiver
from tests.integration.fake_provider import FakeProvider, wait_until
from tests.integration.proxy_harness import RunningProxy, running_proxy

BOUNDED_S = 15.0
ACME = {"X-Interlock-Tenant": "acme"}
ASYNC = {"Prefer": "respond-async", **ACME}

provider = fake_provider.provider
receiver = otlp_receiver.receiver
traced = otlp_receiver.traced


def _config(provider: FakeProvider, deferred: str = "") -> str:
    return f"""
        ledger: {{url: "sqlite:///ledger.db", lease_s: 5}}
        defaults: {{timeout_s: 5, deadline_s: 10}}
        deferred: {{poll_interval_s: 0.1{deferred}}}
        upstreams:
          fake:
            http: "{provider.url}"
            kind: openai
            limits: {{max_running: 1}}
            retry: {{max_attempts: 1}}
        """


@pytest.fixture
async def proxy(provider: FakeProvider, tmp_path: Path) -> AsyncIterator[RunningProxy]:
    async with running_proxy(_config(provider), tmp_path) as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


class Answer:
    def __init__(self, status: int, headers: Any, body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)


async def _send(http: aiohttp.ClientSession, method: str, url: str, **kwargs: Any) -> Answer:
    async with asyncio.timeout(BOUNDED_S), http.request(method, url, **kwargs) as response:
        return Answer(response.status, response.headers, await response.read())


async def _saturate(
    proxy: RunningProxy, provider: FakeProvider, http: aiohttp.ClientSession
) -> asyncio.Task[Answer]:
    """One live call holds the upstream's only slot until `provider.action_gate` is set."""
    provider.action_gate = asyncio.Event()
    url = f"{proxy.base}/http/fake/v1/actions"
    held = asyncio.create_task(
        _send(http, "POST", url, json={"n": 0}, headers={"Idempotency-Key": "hold", **ACME})
    )
    await wait_until(lambda: provider.executions["hold"] == 1, BOUNDED_S)
    return held


async def _defer(
    proxy: RunningProxy, http: aiohttp.ClientSession, key: str, headers: dict[str, str] = ASYNC
) -> Answer:
    url = f"{proxy.base}/http/fake/v1/actions"
    return await _send(
        http, "POST", url, json={"n": key}, headers={"Idempotency-Key": key, **headers}
    )


async def _poll(
    proxy: RunningProxy, http: aiohttp.ClientSession, location: str, headers: dict[str, str] = ACME
) -> Answer:
    """GET the job until it is no longer 202."""
    async with asyncio.timeout(BOUNDED_S):
        while True:
            answer = await _send(http, "GET", f"{proxy.base}{location}", headers=headers)
            if answer.status != 202:
                return answer
            await asyncio.sleep(0.05)


async def test_respond_async_on_a_saturated_upstream_is_a_job_whose_answer_is_the_live_one(
    proxy: RunningProxy, provider: FakeProvider, http: aiohttp.ClientSession
) -> None:
    """With the upstream's only slot taken, `Prefer: respond-async` answers 202 with
    `Location: /jobs/{id}`, `Retry-After` and `Preference-Applied` at once, nothing sent yet; the
    job shows `accepted` until the slot frees, then runs, and GET gives the upstream's answer:
    status, headers and body bytes exactly as the upstream sent them."""
    held = await _saturate(proxy, provider, http)
    accepted = await _defer(proxy, http, "job-1")
    assert accepted.status == 202, accepted.body
    location = accepted.headers["Location"]
    assert location.startswith("/jobs/")
    assert accepted.headers["Retry-After"] == "1"
    assert accepted.headers["Preference-Applied"] == "respond-async"
    assert accepted.json()["job"]["state"] == "accepted"
    assert provider.executions["job-1"] == 0
    waiting = await _send(http, "GET", f"{proxy.base}{location}", headers=ACME)
    assert waiting.status == 202
    assert waiting.json()["job"]["status"] == "working"
    provider.action_gate.set()  # type: ignore[union-attr]
    assert (await held).status == 201
    done = await _poll(proxy, http, location)
    assert done.status == 201
    assert done.body == provider.answers["job-1"]
    assert done.headers["X-Fake-Action"] == "done"
    assert done.headers["Content-Type"] == "application/json; charset=utf-8"
    assert done.headers["Interlock-Job-State"] == "succeeded"
    assert provider.executions["job-1"] == 1
    forwarded = [r for r in provider.received if r.headers.get("Idempotency-Key") == "job-1"]
    assert len(forwarded) == 1
    assert "Prefer" not in forwarded[0].headers
    assert "X-Interlock-Tenant" not in forwarded[0].headers
    assert json.loads(forwarded[0].body) == {"n": "job-1"}


async def test_the_openai_raw_client_gets_a_job_and_then_the_completion(
    proxy: RunningProxy, provider: FakeProvider, http: aiohttp.ClientSession
) -> None:
    """The openai SDK's raw-response client sees 202 and a Location; the job's answer then
    parses as the chat completion a live call returns."""
    held = await _saturate(proxy, provider, http)
    client = openai.AsyncOpenAI(
        base_url=f"{proxy.base}/http/fake/v1", api_key="sk-test", max_retries=0
    )
    raw = await client.chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"Prefer": "respond-async", **ACME},
    )
    assert raw.http_response.status_code == 202
    location = raw.headers["location"]
    provider.action_gate.set()  # type: ignore[union-attr]
    await held
    done = await _poll(proxy, http, location)
    assert done.status == 200
    completion = openai.types.chat.ChatCompletion.model_validate_json(done.body)
    assert completion.choices[0].message.content == "Hello there."
    await client.close()


async def test_a_call_that_can_start_now_runs_live(
    proxy: RunningProxy, provider: FakeProvider, http: aiohttp.ClientSession
) -> None:
    """The preference is a hint: with a free slot the call is answered live, no job."""
    answer = await _defer(proxy, http, "live")
    assert answer.status == 201
    assert "Preference-Applied" not in answer.headers
    assert answer.body == provider.answers["live"]


async def test_a_job_cancelled_before_it_starts_never_runs(
    proxy: RunningProxy, provider: FakeProvider, http: aiohttp.ClientSession
) -> None:
    """DELETE of a waiting job cancels it (then GET says so); a job accepted after it runs once
    the slot frees, and the cancelled one never reaches the upstream. A started or finished job
    can no longer be cancelled."""
    held = await _saturate(proxy, provider, http)
    cancelled = (await _defer(proxy, http, "cancel-me")).headers["Location"]
    later = (await _defer(proxy, http, "later")).headers["Location"]
    gone = await _send(http, "DELETE", f"{proxy.base}{cancelled}", headers=ACME)
    assert gone.status == 200
    assert gone.json()["job"]["status"] == "cancelled"
    provider.action_gate.set()  # type: ignore[union-attr]
    await held
    assert (await _poll(proxy, http, later)).status == 201
    assert provider.executions["cancel-me"] == 0
    ended = await _send(http, "GET", f"{proxy.base}{cancelled}", headers=ACME)
    assert ended.status == 409
    assert ended.json()["error"]["reason"] == "task_cancelled"
    again = await _send(http, "DELETE", f"{proxy.base}{later}", headers=ACME)
    assert again.status == 409
    assert again.json()["error"]["reason"] == "task_finished"


async def test_only_the_tenant_that_created_a_job_can_read_or_cancel_it(
    proxy: RunningProxy, provider: FakeProvider, http: aiohttp.ClientSession
) -> None:
    """Another tenant gets 404 for the job (read and cancel alike), and its cancel changes
    nothing: the job still runs for its owner."""
    held = await _saturate(proxy, provider, http)
    location = (await _defer(proxy, http, "mine")).headers["Location"]
    other = {"X-Interlock-Tenant": "globex"}
    read = await _send(http, "GET", f"{proxy.base}{location}", headers=other)
    assert read.status == 404
    assert read.json()["error"]["reason"] == "task_not_found"
    cancel = await _send(http, "DELETE", f"{proxy.base}{location}", headers=other)
    assert cancel.status == 404
    missing = await _send(http, "GET", f"{proxy.base}/jobs/no-such-job", headers=ACME)
    assert missing.status == 404
    provider.action_gate.set()  # type: ignore[union-attr]
    await held
    assert (await _poll(proxy, http, location)).status == 201
    assert provider.executions["mine"] == 1


async def test_a_request_too_large_to_keep_is_refused_not_run(
    provider: FakeProvider, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """Over `deferred.max_request_bytes` a deferrable request gets 413 `too_large_to_defer`:
    nothing is recorded, nothing reaches the upstream, and it is not run live instead."""
    async with running_proxy(_config(provider, ", max_request_bytes: 512"), tmp_path) as proxy:
        held = await _saturate(proxy, provider, http)
        url = f"{proxy.base}/http/fake/v1/actions"
        big = {"blob": "x" * 2000}
        answer = await _send(
            http, "POST", url, json=big, headers={"Idempotency-Key": "big", **ASYNC}
        )
        assert answer.status == 413
        assert answer.json()["error"]["reason"] == "too_large_to_defer"
        provider.action_gate.set()  # type: ignore[union-attr]
        await held
        assert [e.idempotency_key for e in await proxy.store.list_entries()] == ["hold"]
        assert provider.executions["big"] == 0


async def test_accepted_work_is_bounded_per_tenant(
    provider: FakeProvider, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """Beyond `max_accepted_per_tenant` waiting jobs, a deferral is refused 429 with
    Retry-After, naming the bound; another tenant is not affected."""
    config = _config(provider, ", max_accepted_per_tenant: 2")
    async with running_proxy(config, tmp_path) as proxy:
        held = await _saturate(proxy, provider, http)
        for key in ("b1", "b2"):
            assert (await _defer(proxy, http, key)).status == 202
        full = await _defer(proxy, http, "b3")
        assert full.status == 429
        assert "Retry-After" in full.headers
        error = full.json()["error"]
        assert (error["reason"], error["scope"]) == ("overloaded", "accepted:tenant:acme")
        other = await _defer(
            proxy, http, "g1", {"Prefer": "respond-async", "X-Interlock-Tenant": "g"}
        )
        assert other.status == 202
        provider.action_gate.set()  # type: ignore[union-attr]
        await held


async def test_accepted_work_is_bounded_per_upstream(
    provider: FakeProvider, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """Beyond `max_accepted_per_upstream` waiting jobs, a deferral is refused 429 with
    Retry-After naming the upstream's bound, whichever tenant asks."""
    config = _config(provider, ", max_accepted_per_upstream: 2")
    async with running_proxy(config, tmp_path) as proxy:
        held = await _saturate(proxy, provider, http)
        for key, tenant in (("u1", "acme"), ("u2", "globex")):
            headers = {"Prefer": "respond-async", "X-Interlock-Tenant": tenant}
            assert (await _defer(proxy, http, key, headers)).status == 202
        headers = {"Prefer": "respond-async", "X-Interlock-Tenant": "initech"}
        full = await _defer(proxy, http, "u3", headers)
        assert full.status == 429
        assert "Retry-After" in full.headers
        error = full.json()["error"]
        assert (error["reason"], error["scope"]) == ("overloaded", "accepted:upstream:fake")
        provider.action_gate.set()  # type: ignore[union-attr]
        await held
        assert provider.executions["u3"] == 0


async def test_a_job_the_upstream_refuses_goes_back_in_line_and_runs_later(
    proxy: RunningProxy, provider: FakeProvider, http: aiohttp.ClientSession
) -> None:
    """An upstream 429 on the job's attempt proves it did not run: the job waits out the
    cooldown and runs again (attempt 2); its answer is the success."""
    held = await _saturate(proxy, provider, http)
    location = (await _defer(proxy, http, "pushed-back")).headers["Location"]
    provider.script("429:retry-after:0.3")
    provider.action_gate.set()  # type: ignore[union-attr]
    await held
    done = await _poll(proxy, http, location)
    assert done.status == 201
    assert provider.executions["pushed-back"] == 1
    entry, history = await proxy.store.get("pushed-back")
    assert entry.state is EntryState.SUCCEEDED
    assert entry.attempt == 2
    assert [h.reason for h in history if h.to_state is EntryState.ACCEPTED][-1] == "deferred_again"


@pytest.mark.parametrize("status", [408, 425])
async def test_a_job_answered_a_not_processed_status_goes_back_in_line(
    proxy: RunningProxy, provider: FakeProvider, http: aiohttp.ClientSession, status: int
) -> None:
    """408 and 425 say the upstream did not process the request (as on the live path): the
    job is not finished with that answer but runs again (attempt 2), and its answer is that."""
    held = await _saturate(proxy, provider, http)
    key = f"not-processed-{status}"
    location = (await _defer(proxy, http, key)).headers["Location"]
    provider.script(f"{status}:retry-after:0")
    provider.action_gate.set()  # type: ignore[union-attr]
    await held
    done = await _poll(proxy, http, location)
    assert done.status == 201
    assert provider.executions[key] == 1
    entry, _ = await proxy.store.get(key)
    assert (entry.state, entry.attempt) == (EntryState.SUCCEEDED, 2)


async def test_the_job_answer_of_a_side_effect_is_replayed_to_the_same_key(
    proxy: RunningProxy, provider: FakeProvider, http: aiohttp.ClientSession
) -> None:
    """Sent again with its key once done, the call gets the job's stored answer as a replay
    (never a second execution); sent again while it waits, the same job."""
    held = await _saturate(proxy, provider, http)
    first = await _defer(proxy, http, "same")
    second = await _defer(proxy, http, "same")
    assert second.status == 202
    assert second.headers["Location"] == first.headers["Location"]
    provider.action_gate.set()  # type: ignore[union-attr]
    await held
    await _poll(proxy, http, first.headers["Location"])
    replay = await _defer(proxy, http, "same", ACME)
    assert replay.status == 201
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.body == provider.answers["same"]
    assert provider.executions["same"] == 1


async def test_the_jobs_span_links_to_the_call_that_created_it(
    provider: FakeProvider, tmp_path: Path, http: aiohttp.ClientSession, receiver: Any, traced: Any
) -> None:
    """The job runs in a trace of its own whose span links to the SERVER span of the request
    that was answered 202 (marked `deferred`), and carries the entry and attempt."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    async with running_proxy(_config(provider), tmp_path) as proxy:
        held = await _saturate(proxy, provider, http)
        headers = {**ASYNC, "traceparent": f"00-{trace_id}-{span_id}-01"}
        location = (await _defer(proxy, http, "traced", headers)).headers["Location"]
        provider.action_gate.set()  # type: ignore[union-attr]
        await held
        await _poll(proxy, http, location)
        created = await receiver.wait_for_span(
            lambda s: s.trace_id == trace_id and s.kind == "SERVER"
        )
        run = await receiver.wait_for_span(lambda s: s.name.startswith("interlock.deferred.run"))
    assert created.attributes["interlock.admission.decision"] == "deferred"
    assert run.kind == "CONSUMER"
    assert run.trace_id != trace_id
    assert run.links == ((trace_id, created.span_id),)
    assert run.attributes["interlock.deferred"] is True
    assert run.attributes["interlock.attempt"] == 1
    assert run.attributes["interlock.ledger.state"] == "succeeded"
    assert run.attributes["interlock.ledger.entry_id"]


async def test_a_job_whose_attempts_never_run_is_given_up(
    provider: FakeProvider, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """With `deferred.max_attempts: 2`, a job the upstream refuses (429) twice ends refused:
    GET says it never ran (409 `task_refused`), and the upstream executed nothing."""
    async with running_proxy(_config(provider, ", max_attempts: 2"), tmp_path) as proxy:
        held = await _saturate(proxy, provider, http)
        location = (await _defer(proxy, http, "refused")).headers["Location"]
        provider.script("429:retry-after:0.1", "429:retry-after:0.1")
        provider.action_gate.set()  # type: ignore[union-attr]
        await held
        ended = await _poll(proxy, http, location)
        assert ended.status == 409
        error = ended.json()["error"]
        assert error["reason"] == "task_refused"
        assert "given up after 2 attempts" in error["detail"]
        assert provider.executions["refused"] == 0
        entry, _ = await proxy.store.get("refused")
        assert (entry.state, entry.attempt, entry.request) == (EntryState.REJECTED, 2, None)


@pytest.mark.parametrize("ending", ["die", "error"])
async def test_a_side_effect_job_that_may_have_run_ends_unknown_and_is_never_resent(
    proxy: RunningProxy, provider: FakeProvider, http: aiohttp.ClientSession, ending: str
) -> None:
    """A job's attempt that was sent but proves nothing (the connection dropped after the
    upstream acted, or a plain 500) ends `unknown`: GET answers 504 `outcome_unknown`, and the
    job is not put back in line (the upstream sees it once, however long we wait)."""
    held = await _saturate(proxy, provider, http)
    key = f"maybe-{ending}"
    location = (await _defer(proxy, http, key)).headers["Location"]
    provider.script(ending)
    provider.action_gate.set()  # type: ignore[union-attr]
    await held
    ended = await _poll(proxy, http, location)
    assert ended.status == 504
    assert (ended.json()["error"]["reason"], ended.headers["Interlock-Job-State"]) == (
        "outcome_unknown",
        "unknown",
    )
    await asyncio.sleep(0.5)  # several poll intervals: a job put back in line would run again
    sent = [r for r in provider.received if r.headers.get("Idempotency-Key") == key]
    assert len(sent) == 1
    entry, _ = await proxy.store.get(key)
    assert (entry.state, entry.attempt) == (EntryState.UNKNOWN, 1)

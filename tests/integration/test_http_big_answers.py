"""A side-effecting HTTP call whose answer is larger than `ledger.max_outcome_bytes`: the caller
gets every byte as it streams, the ledger keeps only the body's sha256, and the proxy never holds
more than the cap (plus a chunk) of it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import aiohttp

from tests.integration import fake_provider
from tests.integration.fake_provider import FakeProvider, export_digest
from tests.integration.http_calls import settled
from tests.integration.proxy_harness import running_proxy

provider = fake_provider.provider
SIZE = 5 * 1024 * 1024


async def test_a_large_answer_streams_through_and_only_its_hash_is_kept(
    provider: FakeProvider, tmp_path: Path
):
    """5 MB answer, 64 KB cap: the caller's bytes are intact, the entry is succeeded with the
    body's sha256 and no stored outcome, and its replay says outcome_not_retained (409)."""
    config = f"""
        ledger: {{url: "sqlite:///ledger.db", max_outcome_bytes: 65536}}
        upstreams:
          api: {{http: "{provider.url}"}}
    """
    url = f"{{base}}/http/api/v1/exports?bytes={SIZE}"
    headers = {"Idempotency-Key": "export-1"}
    async with running_proxy(config, tmp_path) as proxy, aiohttp.ClientSession() as http:
        async with http.post(url.format(base=proxy.base), headers=headers) as answer:
            assert answer.status == 200
            digest = hashlib.sha256()
            async for chunk in answer.content.iter_any():
                digest.update(chunk)
        assert digest.hexdigest() == export_digest(SIZE)
        entry = await settled(proxy, "export-1", "succeeded")
        assert str(entry.state) == "succeeded"
        assert entry.outcome is None
        assert not entry.outcome_retained
        assert entry.outcome_hash == export_digest(SIZE)
        async with http.post(url.format(base=proxy.base), headers=headers) as again:
            assert again.status == 409
            assert (await again.json())["error"]["reason"] == "outcome_not_retained"
    assert provider.executions["export-1"] == 1

"""Memory per call is bounded however large the answer: `interlock serve` relays a 64 MB answer
to a side-effecting HTTP call without its resident memory growing by more than a fraction of it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import aiohttp
import psutil
import pytest

from tests.acceptance.test_proxy_crash import _free_port, proxy_process, write_config
from tests.integration.fake_provider import export_digest, running_provider

SIZE = 64 * 1024 * 1024
MAX_GROWTH = 24 * 1024 * 1024


@pytest.mark.slow
async def test_a_64_mb_answer_does_not_grow_the_proxy_by_more_than_24_mb(tmp_path: Path):
    """Before: the whole body was buffered, then base64- and JSON-encoded for the ledger (RSS grew
    by several times the answer). Now it streams through while being hashed."""
    port = _free_port()
    async with running_provider() as provider:
        config = write_config(tmp_path, port, f'  api: {{http: "{provider.url}"}}\n')
        with proxy_process(config) as process:
            memory = psutil.Process(process.pid)
            url = f"http://127.0.0.1:{port}/http/api/v1/exports?bytes={SIZE}"
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/healthz") as warm:
                    assert warm.status == 200
                before = memory.memory_info().rss
                async with http.post(url, headers={"Idempotency-Key": "big-1"}) as answer:
                    digest = hashlib.sha256()
                    async for chunk in answer.content.iter_any():
                        digest.update(chunk)
                after = memory.memory_info().rss
    assert digest.hexdigest() == export_digest(SIZE)
    assert after - before < MAX_GROWTH, f"RSS grew by {(after - before) / 2**20:.0f} MB"

"""A child process for the ledger's crash and race tests: `python -m tests.ledger_child CMD URL …`.

Each command opens its own `LedgerStore` (replica id `child-<pid>`) and reports on stdout, one
JSON object per line, flushed, so the parent can act the moment something is durable:

- `claim URL KEY LEASE_S`: claim KEY, report it, then hang until killed (SIGKILL mid-call).
- `race URL KEY N`: report "ready", wait for "go" on stdin, claim KEY N times at once, report
  the kinds.
- `race_keys URL N`: report "ready"; then for each PREFIX line on stdin claim keys PREFIX-0 …
  PREFIX-(N-1) all at once and report the kind of each claim and the attempt it started (an
  empty line or the end of stdin ends it).
- `claim_deferred URL`: report "ready"; for each line on stdin claim every waiting deferred entry
  at once and report the ids this process started (an empty line or the end of stdin ends it).
- `flood URL CONCURRENCY`: claim new keys from CONCURRENCY tasks forever, reporting each
  claim the moment the ledger acknowledges it (SIGKILL mid-group-commit).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
from typing import Any

from ledger import ClaimRequest, LedgerStore
from policies.model import LedgerSettings


def _report(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def _request(key: str) -> ClaimRequest:
    return ClaimRequest("acme", "mail", "send", key, "explicit", "a" * 64)


async def _open(url: str, lease_s: float = 30) -> LedgerStore:
    return await LedgerStore.open(
        LedgerSettings(url=url, lease_s=lease_s), owner=f"child-{os.getpid()}"
    )


async def claim_and_hang(url: str, key: str, lease_s: str) -> None:
    store = await _open(url, float(lease_s))
    result = await store.claim(_request(key))
    _report(kind=result.kind, id=result.entry.id, token=result.entry.fencing_token)
    await asyncio.to_thread(sys.stdin.read)  # "forwarding the call": until the parent kills us


async def race(url: str, key: str, n: str) -> None:
    store = await _open(url)
    try:
        _report(ready=True)
        await asyncio.to_thread(sys.stdin.readline)
        results = await asyncio.gather(*(store.claim(_request(key)) for _ in range(int(n))))
        _report(kinds=[r.kind for r in results], ids=sorted({r.entry.id for r in results}))
    finally:
        await store.close()


async def race_keys(url: str, n: str) -> None:
    store = await _open(url)
    try:
        _report(ready=True)
        while prefix := (await asyncio.to_thread(sys.stdin.readline)).strip():
            keys = [f"{prefix}-{i}" for i in range(int(n))]
            results = await asyncio.gather(*(store.claim(_request(key)) for key in keys))
            claims = [[key, r.kind, r.entry.attempt] for key, r in zip(keys, results, strict=True)]
            _report(claims=claims)
    finally:
        await store.close()


async def claim_deferred(url: str) -> None:
    store = await _open(url)
    try:
        _report(ready=True)
        while (await asyncio.to_thread(sys.stdin.readline)).strip():
            waiting = await store.deferred.candidates(1000)
            claimed = await asyncio.gather(*(store.deferred.claim(c.entry_id) for c in waiting))
            _report(started=[entry.id for entry in claimed if entry is not None])
    finally:
        await store.close()


async def flood(url: str, concurrency: str) -> None:
    store = await _open(url)
    counter = itertools.count()
    pid = os.getpid()

    async def claimer() -> None:
        while True:
            result = await store.claim(_request(f"flood-{pid}-{next(counter)}"))
            _report(id=result.entry.id)

    await asyncio.gather(*(claimer() for _ in range(int(concurrency))))


COMMANDS = {
    "claim": claim_and_hang,
    "race": race,
    "race_keys": race_keys,
    "claim_deferred": claim_deferred,
    "flood": flood,
}

if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    asyncio.run(COMMANDS[command](*arguments))

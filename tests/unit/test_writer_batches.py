"""How the group-commit writer forms batches from what is queued: at most `max_batch` operations,
and at most `_MAX_BATCH_BYTES` of what they carry (outcomes, requests, arguments) unless one
operation alone carries more. PostgreSQL takes a batch's writes as one statement and refuses a
message over 1 GB: a batch past it failed whole, and failed again each time it was rerun (256
outcomes or deferred requests of 4 MB, with their limits raised, pass it).

The backend here records the batches instead of writing them (the writer is what is under test;
the ledger suites run the same writer on SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from typing import Any

from ledger import writer as writer_module
from ledger.deferred_ops import Defer
from ledger.operations import Finish, Operation, Renew
from ledger.views import ClaimRequest
from ledger.writer import GroupCommitWriter

_MIB = 1024 * 1024


class _Recorded:
    """A backend that commits nothing and remembers each batch's operations."""

    def __init__(self) -> None:
        self.batches: list[list[Operation[Any]]] = []

    async def run(self, ops: list[Operation[Any]]) -> list[object]:
        self.batches.append(list(ops))
        return [None] * len(ops)

    async def drop(self) -> None:
        return None

    def close(self) -> None:
        return None


def _carried(ops: list[Operation[Any]]) -> int:
    return sum(getattr(op, "payload_bytes", 0) for op in ops)


async def _batches(ops: list[Operation[Any]], max_batch: int = 256) -> list[list[Operation[Any]]]:
    backend = _Recorded()
    writer = GroupCommitWriter(backend, max_batch=max_batch)
    try:
        futures = [writer.enqueue(op) for op in ops]  # all queued before the writer runs
        await asyncio.wait_for(asyncio.gather(*futures), 10)
    finally:
        await writer.close()
    assert [op for batch in backend.batches for op in batch] == ops  # each once, in order
    return backend.batches


def _finish(n: int, outcome: bytes) -> Finish:
    return Finish(f"{n:032x}", 1, "succeeded", outcome, None)


async def test_batches_stop_growing_at_the_bytes_their_writes_may_carry() -> None:
    big = b"x" * (30 * _MIB)  # one object, shared: the test holds 30 MiB, not 300
    batches = await _batches([_finish(n, big) for n in range(10)])
    assert [len(batch) for batch in batches] == [2] * 5
    assert max(_carried(batch) for batch in batches) <= writer_module._MAX_BATCH_BYTES


async def test_an_operation_carrying_more_than_a_batch_may_is_a_batch_of_its_own() -> None:
    huge = b"x" * (writer_module._MAX_BATCH_BYTES + 1)
    ops: list[Operation[Any]] = [
        Renew("a" * 32, 1),
        _finish(1, huge),
        Renew("b" * 32, 1),
        _finish(2, b"ok"),
    ]
    batches = await _batches(ops)
    assert [len(batch) for batch in batches] == [1, 1, 2]


async def test_deferred_requests_count_with_their_arguments() -> None:
    request = ClaimRequest("t", "u", "send", None, "none", "f" * 64, arguments="a" * _MIB)
    defer = Defer(request, b"r" * (4 * _MIB), max_per_tenant=1000, max_per_upstream=1000)
    assert defer.payload_bytes == 5 * _MIB
    batches = await _batches([defer] * 40)
    assert [len(batch) for batch in batches] == [12, 12, 12, 4]  # 12 × 5 MiB ≤ 64 MiB < 13 × 5


async def test_small_writes_still_fill_a_batch_to_its_count() -> None:
    batches = await _batches([_finish(n, b"ok") for n in range(300)])
    assert [len(batch) for batch in batches] == [256, 44]

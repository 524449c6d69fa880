"""The ledger phase benchmark times the ledger's real steps and leaves the ledger as it found it.

It wraps functions of `ledger.sqlite_sql` and `ledger.transactions` by name; a rename there must
fail the benchmark, not print zeros, and the wrapping must not outlive the measurement (the
other benchmarks run in the same process after it). Nothing here asserts a duration.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.bench_ledger_phases import JOB, measure
from ledger import sqlite_sql, sqlite_transactions, transactions


async def test_every_step_of_a_batch_is_timed_and_the_ledger_is_restored() -> None:
    originals = {name: getattr(sqlite_sql, name) for name in ("begin", "load", "flush", "commit")}
    decide, job = transactions.decide, sqlite_transactions.SQLiteTransactions._transaction

    (result,) = await measure(seconds=0.2, rounds=1)

    assert result.pairs > 0
    for step in ("begin", "database_now", "load", "decide", "flush", "commit", JOB):
        assert result.calls[step] > 0, step
    # Every step runs inside the writer's job, once per batch.
    steps = sum(result.steps_ns[s] for s in ("begin", "load", "decide", "flush", "commit"))
    assert steps <= result.steps_ns[JOB]
    assert result.calls["commit"] == result.calls[JOB]
    for name, fn in originals.items():
        assert getattr(sqlite_sql, name) is fn, name
    assert transactions.decide is decide
    assert sqlite_transactions.SQLiteTransactions._transaction is job


async def test_a_step_the_ledger_no_longer_calls_fails_the_benchmark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As if the SQLite writer reached its SQL by another route than `ledger.sqlite_sql`:
    # the same functions run, none through the names the benchmark wraps.
    monkeypatch.setattr(sqlite_transactions, "sqlite_sql", SimpleNamespace(**vars(sqlite_sql)))

    with pytest.raises(RuntimeError, match="never called begin, database_now, load, flush"):
        await measure(seconds=0.1, rounds=1)

"""The SQLite writer's thread (`ledger.writer_thread`): order, errors, cancellation, stop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from ledger.writer_thread import WriterThread


async def test_jobs_run_on_the_thread_in_order_and_return_their_results() -> None:
    thread = WriterThread("test-writer")
    seen: list[tuple[int, str]] = []

    def job(n: int) -> int:
        seen.append((n, threading.current_thread().name))
        return n * 10

    try:
        results = await asyncio.gather(*(thread.run(job, n) for n in range(5)))
    finally:
        thread.stop()
    assert results == [0, 10, 20, 30, 40]
    assert seen == [(n, "test-writer") for n in range(5)]


async def test_what_a_job_raises_reaches_its_caller_and_the_thread_goes_on() -> None:
    thread = WriterThread("test-writer")

    def fails() -> None:
        raise ValueError("refused")

    try:
        with pytest.raises(ValueError, match="refused"):
            await thread.run(fails)
        assert await thread.run(lambda: "still here") == "still here"
    finally:
        thread.stop()


async def test_a_job_whose_caller_was_cancelled_before_it_started_is_skipped() -> None:
    thread = WriterThread("test-writer")
    release = threading.Event()
    ran: list[str] = []

    def blocking() -> None:
        release.wait(5)
        ran.append("first")

    def second() -> None:
        ran.append("second")

    try:
        first = asyncio.ensure_future(thread.run(blocking))
        waiting = asyncio.ensure_future(thread.run(second))
        await asyncio.sleep(0.05)  # both handed over; the thread is inside `blocking`
        waiting.cancel()
        release.set()
        await first
        assert await thread.run(lambda: "after") == "after"
    finally:
        thread.stop()
    assert ran == ["first"]
    assert waiting.cancelled()


async def test_stop_lets_the_jobs_already_handed_over_run_then_refuses_more() -> None:
    thread = WriterThread("test-writer")
    release = threading.Event()
    ran: list[int] = []

    def job(n: int) -> None:
        release.wait(5)
        ran.append(n)

    pending = [asyncio.ensure_future(thread.run(job, n)) for n in range(3)]
    await asyncio.sleep(0.05)
    thread.stop()
    release.set()
    await asyncio.gather(*pending)
    assert ran == [0, 1, 2]
    with pytest.raises(RuntimeError, match="stopped"):
        await thread.run(job, 9)
    thread._thread.join(5)
    assert not thread._thread.is_alive()

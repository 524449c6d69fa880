"""`python -m bench.profile_pipeline` profiles each thread a call runs on, and only that thread.

A cProfile profiler sees the thread that enabled it; one enabled from the event loop for the
ledger's writer would show the loop's frames twice and the writer's never. The profile is what a
closing note cites for a goal not met, so it must say which thread spent the time. Nothing here
asserts a duration.
"""

from __future__ import annotations

import pytest

from bench.profile_pipeline import LOOP, profile
from ledger.writer_thread import WriterThread


def test_the_loop_and_the_ledger_writer_are_profiled_each_on_its_own_thread() -> None:
    init = WriterThread.__init__

    found = profile("side-effecting", concurrency=2, calls=60, top=10_000)

    by_name = {thread.thread: thread for thread in found.threads}
    assert found.threads[0].thread == LOOP
    loop, writer = by_name[LOOP], by_name["ledger-writer #1"]
    assert any("(handle_tools_call)" in frame.where for frame in loop.frames)
    assert not any("(_transaction)" in frame.where for frame in loop.frames)
    assert any("(_transaction)" in frame.where for frame in writer.frames)
    assert not any("(handle_tools_call)" in frame.where for frame in writer.frames)
    # A side-effecting call writes twice (its claim, then its outcome); with two calls in flight
    # a transaction carries one or two writes, so there are one or two per call.
    commits = next(f for f in writer.frames if f.where.endswith("(_transaction)")).calls
    assert 1.0 <= commits <= 2.0
    assert found.loop_us > 0
    assert found.other_us > 0
    assert WriterThread.__init__ is init  # the recording does not outlive the profile


def test_an_unknown_kind_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown kind 'write-only': one of read-only"):
        profile("write-only", concurrency=1, calls=1)

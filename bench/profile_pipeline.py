"""Where a `tools/call` spends its CPU inside the pipeline: cProfile's top frames, per thread.

    python -m bench.profile_pipeline [--kind side-effecting] [--concurrency 1] [--calls 4000]
                                     [--top 25]

`bench_pipeline` says how much CPU a call costs in-process; this says where it goes. It drives the
same calls through the same application (`bench_pipeline.pipeline_app`: SQLite at `durability:
full`, telemetry off, uvloop as `serve` runs), first without a profiler, then again with one
`cProfile.Profile` on the event loop's thread and one on each ledger thread (a profiler only sees
the thread that enabled it, so each is enabled by a job run on its own thread). Each profiler's
clock is its thread's CPU time, so a thread blocked on its queue or on an fsync's wait counts
nothing. Figures are µs per call; the profiler's own overhead inflates them (the first line gives
the unprofiled CPU beside each thread's profiled total), so read them as shares, not as costs.

Not part of `make bench`: it prints profiles, not figures with a baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.bench_pipeline import KINDS, drive, pipeline_app, pipeline_caller, run_as_serve
from bench.common import ROOT
from ledger.writer_thread import WriterThread

__all__ = ["Frame", "PipelineProfile", "ThreadProfile", "main", "profile"]

LOOP = "event loop"


@dataclass(frozen=True)
class Frame:
    """One function's share of a thread's time, per call driven."""

    where: str
    own_us: float  # time in the function itself
    total_us: float  # with what it called
    calls: float  # how many times per call driven


@dataclass(frozen=True)
class ThreadProfile:
    """One thread's profile: the profiler's total for it, and its frames by own time, most first."""

    thread: str
    profiled_us: float  # per call driven
    frames: list[Frame]


@dataclass(frozen=True)
class PipelineProfile:
    """What the unprofiled run cost per call, and each thread's profile of the profiled one."""

    loop_us: float  # CPU of the event loop's thread, without the profiler
    other_us: float  # CPU of the process's other threads (the ledger's), without the profiler
    threads: list[ThreadProfile]


@contextlib.contextmanager
def _recording(threads: list[tuple[str, WriterThread]]) -> Iterator[None]:
    """Record every `WriterThread` the store starts, with its thread's name."""
    original = WriterThread.__init__

    def init(self: WriterThread, name: str) -> None:
        original(self, name)
        threads.append((f"{name} #{sum(n.startswith(name) for n, _ in threads) + 1}", self))

    WriterThread.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        WriterThread.__init__ = original  # type: ignore[method-assign]


def _where(code: tuple[str, int, str]) -> str:
    path, line, name = code
    if path == "~":  # a builtin: cProfile names it in full already
        return name
    for prefix in (str(ROOT) + "/", "site-packages/"):
        if prefix in path:
            path = path.split(prefix, 1)[1]
    return f"{path}:{line}({name})"


def _thread(name: str, profiler: cProfile.Profile, calls: int, top: int) -> ThreadProfile:
    stats: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = [
        Frame(_where(code), own * 1e6 / calls, total * 1e6 / calls, count / calls)
        for code, (_, count, own, total, _) in stats.items()
        if own > 0
    ]
    rows.sort(key=lambda frame: frame.own_us, reverse=True)
    return ThreadProfile(name, sum(frame.own_us for frame in rows), rows[:top])


async def _profile(kind: str, concurrency: int, calls: int, top: int) -> PipelineProfile:
    threads: list[tuple[str, WriterThread]] = []
    with _recording(threads), tempfile.TemporaryDirectory(prefix="profile-pipeline-") as tmp:
        async with pipeline_app(Path(tmp)) as app:
            call = pipeline_caller(app, kind)
            await drive(call, max(200, calls // 10), concurrency)  # warm-up
            process, loop = time.process_time(), time.thread_time()
            await drive(call, calls, concurrency)
            loop = time.thread_time() - loop
            process = time.process_time() - process
            on_loop = cProfile.Profile(time.thread_time)
            on_threads = [(n, thread, cProfile.Profile(time.thread_time)) for n, thread in threads]
            for _, thread, profiler in on_threads:
                await thread.run(profiler.enable)  # a profiler sees only the thread enabling it
            on_loop.enable()
            await drive(call, calls, concurrency)
            on_loop.disable()
            for _, thread, profiler in on_threads:
                await thread.run(profiler.disable)
    return PipelineProfile(
        loop * 1e6 / calls,
        (process - loop) * 1e6 / calls,
        [_thread(LOOP, on_loop, calls, top)]
        + [_thread(name, profiler, calls, top) for name, _, profiler in on_threads],
    )


def profile(kind: str, concurrency: int, calls: int, top: int = 25) -> PipelineProfile:
    """Profile `calls` calls of `kind` (a key of `bench_pipeline.KINDS`) at `concurrency`."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    return run_as_serve(lambda: _profile(kind, concurrency, calls, top))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_pipeline")
    parser.add_argument("--kind", default="side-effecting", choices=list(KINDS))
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    found = profile(args.kind, args.concurrency, args.calls, args.top)
    print(
        f"{args.kind}, concurrency {args.concurrency}, {args.calls} calls; without the profiler: "
        f"{found.loop_us:.0f} µs/call on the event loop, {found.other_us:.0f} in other threads"
    )
    for thread in found.threads:
        print(f"\n{thread.thread}: {thread.profiled_us:.0f} µs/call profiled")
        print(f"{'own µs':>8} {'total µs':>9} {'n/call':>7}  function")
        for frame in thread.frames:
            print(f"{frame.own_us:8.1f} {frame.total_us:9.1f} {frame.calls:7.2f}  {frame.where}")


if __name__ == "__main__":
    main()

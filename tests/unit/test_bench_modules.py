"""`make bench` is not run by the suite (performance is measured, never asserted), so the suite at
least checks that every benchmark module imports and offers `run` — a merge once left one importing
a helper that had moved, and `make bench` failed after the other tables."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import bench
from bench import bench_instructions

MODULES = sorted(info.name for info in pkgutil.iter_modules(bench.__path__))


@pytest.mark.parametrize("name", [m for m in MODULES if m.startswith("bench_")])
def test_every_benchmark_imports_and_has_run(name: str) -> None:
    module = importlib.import_module(f"bench.{name}")
    assert callable(module.run)


@pytest.mark.parametrize("name", [m for m in MODULES if not m.startswith("bench_")])
def test_every_benchmark_helper_imports(name: str) -> None:
    importlib.import_module(f"bench.{name}")


@pytest.mark.parametrize("name", MODULES)
def test_what_a_benchmark_reads_from_another_exists(name: str) -> None:
    """`bench_mcp.drive(...)` inside a function is only looked up when that table runs: a
    renamed helper once failed `bench_idle` at the end of `make bench`. Every `module.name`
    a benchmark reads from another module of `bench/` must exist."""
    module = importlib.import_module(f"bench.{name}")
    tree = ast.parse(inspect.getsource(module))
    siblings = {
        alias: getattr(module, alias)
        for alias, value in vars(module).items()
        if inspect.ismodule(value) and value.__name__.startswith("bench.")
    }
    missing = [
        f"{node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in siblings
        and not hasattr(siblings[node.value.id], node.attr)
    ]
    assert not missing


def test_the_mcp_bench_reads_ledger_commits_from_prometheus_text() -> None:
    """The MCP table's writes-per-commit column comes from these two counters, as Interlock's
    /metrics writes them; a missing one gives no figure rather than a wrong one."""
    from bench.bench_mcp import parse_commits

    text = (
        "# HELP interlock_ledger_commits_total Ledger transactions committed\n"
        "# TYPE interlock_ledger_commits_total counter\n"
        "interlock_ledger_commits_total 12.0\n"
        "interlock_ledger_committed_operations_total 30.0\n"
        'interlock_ledger_entries{state="running"} 4.0\n'
    )
    assert parse_commits(text) == (12.0, 30.0)
    assert parse_commits(text.replace("interlock_ledger_commits_total 12.0\n", "")) is None


def test_the_mcp_bench_shows_ledger_writes_per_call_and_per_commit() -> None:
    """2,000 writes in 250 commits over 1,000 calls: 2 per call (claim, outcome), 8 per commit;
    a cell with no commit shows no figure."""
    from bench.bench_mcp import Result

    result = Result(1000, 0, 1.0, 1.0, [], 0, ledger=(250.0, 2000.0))
    assert result.ledger_cell == "2.00 · 8.0"
    assert Result(1000, 0, 1.0, 1.0, [], 0, ledger=(0.0, 0.0)).ledger_cell == "—"
    assert Result(1000, 0, 1.0, 1.0, [], 0).ledger_cell == "—"


def test_the_main_threads_cpu_is_read_apart_from_the_other_threads() -> None:
    """The MCP table splits a proxy's CPU into its event loop (the main thread) and the rest (the
    ledger's writer thread): 50 ms burnt by another thread count in the whole, not the loop's."""
    import threading
    import time

    import psutil

    from bench.common import cpu_s, main_thread_cpu_s

    proc = psutil.Process()
    total_before, main_before = cpu_s(proc), main_thread_cpu_s(proc)

    burnt, release = threading.Event(), threading.Event()

    def burn() -> None:  # a live thread's CPU counts; an ended one's leaves the process's tasks
        started = time.thread_time()
        while time.thread_time() - started < 0.05:
            pass
        burnt.set()
        release.wait(10)

    worker = threading.Thread(target=burn)
    worker.start()
    try:
        assert burnt.wait(10)
        total_after, main_after = cpu_s(proc), main_thread_cpu_s(proc)
    finally:
        release.set()
        worker.join()
    assert main_before is not None
    assert main_after is not None
    assert total_after - total_before >= 0.05
    assert main_after - main_before < 0.025


def test_the_mcp_bench_shows_the_event_loops_share_of_a_call() -> None:
    from bench.bench_mcp import Result

    result = Result(1000, 0, 1.0, 0.6, [], 0, loop_cpu_s=0.45)
    assert result.loop_cell == "450"
    assert Result(1000, 0, 1.0, 0.6, [], 0).loop_cell == "—"


def test_a_ratio_goal_is_reported_round_by_round() -> None:
    """Each round's ratio pairs the two targets measured in that round; a round with either
    figure missing counts for nothing; the verdict says in how many rounds the goal was met."""
    from bench.common import round_ratios

    spread = round_ratios([130.0, 150.0, None, 110.0], [100.0, 100.0, 100.0, 100.0], goal=1.3)
    assert spread.text == "1.10–1.50×"
    assert spread.verdict == "≤1.3× in 2 of 3 rounds"
    assert round_ratios([120.0], [100.0], goal=1.3).text == "1.20×"
    assert round_ratios([None], [100.0], goal=1.3).text == "—"


def test_the_ledger_goal_is_met_by_the_best_round_and_says_in_how_many() -> None:
    """The 64-writer ledger goal is judged on the least disturbed round (a rate is only ever
    lowered by a noisy machine), and the cell says how many rounds reached it: one lucky round
    does not read as a steady figure, nor one disturbed round as a miss."""
    from bench.bench_ledger import rate_goal

    assert rate_goal([9_000.0, 10_100.0, 9_500.0], 10_000) == "≥ 10,000 (met; in 1 of 3 rounds)"
    assert rate_goal([10_000.0, 10_400.0], 10_000) == "≥ 10,000 (met; in 2 of 2 rounds)"
    assert rate_goal([9_999.0, 8_000.0, 9_100.0], 10_000) == "≥ 10,000 (NOT met; in 0 of 3 rounds)"
    assert rate_goal([], 5_000) == "≥ 5,000 (not measured)"


def test_the_mcp_bench_says_what_the_side_effect_goal_leaves_beside_the_ledgers_floor() -> None:
    """The note puts the goal's room for the pipeline beside what two bare durable commits cost
    in the same run: at c=1 one pair through the writer thread, at c=32 64 pairs per commit."""
    from bench.bench_mcp import Result, _room
    from bench.ledger_floor import FloorResult

    def cell(cpu_us: float) -> Result:
        return Result(1000, 0, 1.0, cpu_us * 1000 / 1e6, [], 0)

    results = {
        (target, kind, n): cell(cpu)
        for kind in ("read-only", "side-effecting")
        for n in (1, 32)
        for target, cpu in (("bare", 300.0), ("transport", 400.0))
    }
    floors = [
        FloorResult("inline", 2000, 220.0),
        FloorResult("handed", 1500, 360.0, through_thread=True),
        FloorResult("grouped", 27000, 30.0, pairs_per_commit=64),
    ]
    side = _room(results, "side-effecting", 2.5, floors)
    assert side[0].startswith("side-effecting@1: the goal leaves 350 µs for the pipeline")
    assert "two durable commits take 360 µs" in side[0]
    assert "writer thread" in side[0]
    assert "two durable commits take 30 µs" in side[1]
    assert "64 per commit" in side[1]
    assert "commits" not in " ".join(_room(results, "read-only", 1.3, floors))
    assert "commits" not in " ".join(_room(results, "side-effecting", 2.5, []))


def test_instructions_per_call_leave_out_what_the_idle_process_counts(tmp_path: Path) -> None:
    """A dump's count is its last `totals:` (none: 0); per call, what was counted while the
    calls ran less what the idle process counted for as long (never below zero)."""
    (tmp_path / "serve.callgrind.1").write_text("events: Ir\nsummary: 0\n\ntotals: 900000\n")
    (tmp_path / "serve.callgrind.2").write_text("events: Ir\ntotals: 5\ntotals: 100000\n")
    (tmp_path / "serve.callgrind").write_text("events: Ir\n")
    busy, idle, none = (
        bench_instructions.count_of(tmp_path / f"serve.callgrind{n}") for n in (".1", ".2", "")
    )
    assert (busy, idle, none) == (900_000, 100_000, 0)
    assert bench_instructions.per_call(busy, idle, 1000) == 800.0
    assert bench_instructions.per_call(idle, busy, 1000) == 0.0


def test_without_valgrind_the_instruction_count_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_instructions.shutil, "which", lambda _name: None)
    (table,) = bench_instructions.run(quick=True)
    assert not table.rows
    assert "not installed" in table.note
